package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

// storeTokens posts one Stored event of tokens' complete blocks (block size
// 16, the base model's salt) and returns their local hashes once the event is
// on the pool's stream (sync=published): a 202 alone means admitted, and a
// router that converged with the relay's snapshot before the pool published
// answered from the empty table (TestE2E_RouterFollowsAResize, 3 of 30 runs
// under load).
func storeTokens(t *testing.T, base, pool string, tokens []uint32, worker uint64) []uint64 {
	t.Helper()
	return storeTokensQuery(t, base, pool, "source_epoch=1&sync=published", tokens, worker)
}

// storeTokensQuery is storeTokens with the events URL's query string.
func storeTokensQuery(t *testing.T, base, pool, query string, tokens []uint32, worker uint64) []uint64 {
	t.Helper()
	locals := ckf.AppendLocalBlockHashes(nil, tokens, 16, ckf.BaseSalt)
	id := eventSeq.Add(1)
	ev := ckf.RouterEvent{WorkerID: worker, EventID: id, Kind: ckf.EventStored}
	for i, l := range locals {
		ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: l ^ uint64(i+1)<<56, TokensHash: l})
	}
	body, err := wire.AppendRouterEventsJSON(nil, []ckf.RouterEvent{ev})
	require.NoError(t, err)
	resp, err := http.Post(base+"/v1/pools/"+pool+"/events?"+query, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", b)
	return locals
}

// waitResident waits until the relay's pool holds n resident blocks (events
// are applied after their 202).
func waitResident(t *testing.T, base, pool string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		p := getCatalog(t, base)[pool]
		return p.Stats != nil && int(p.Stats.ResidentBlocks) == n
	}, 30*time.Second, 10*time.Millisecond, "pool %s never held %d blocks", pool, n)
}

func tokensFrom(base uint32, blocks int) []uint32 {
	t := make([]uint32, 16*blocks)
	for i := range t {
		t[i] = base + uint32(i)*2654435761
	}
	return t
}

func decimal(v []uint64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = strconv.FormatUint(x, 10)
	}
	return out
}

// TestE2E_QueryThreeDataCenters runs `relay query` (the built binary) against
// three relay processes, one data center each, whose pools have three sizes
// (64, 100,000 and 1,000,000 expected blocks: three formats, so three format
// groups in the query's consumer) and hold different prefixes of one
// request. Through the WebAssembly and the native consumer it must answer
// every prefix's depth per pool exactly, by tokens, local hashes and
// sequence hashes; name the deepest pool (ties to the first given, null
// when nothing is cached); and answer a bad line with an error and go on.
func TestE2E_QueryThreeDataCenters(t *testing.T) {
	bin := relayBinary(t)
	type dc struct {
		pool     string
		expected int
		holds    int // leading blocks of reqA stored there
		rl       *relay
	}
	dcs := []*dc{{pool: "dc-small", expected: 64, holds: 3}, {pool: "dc-mid", expected: 100_000, holds: 7}, {pool: "dc-big", expected: 1_000_000, holds: 12}}
	reqA, reqB := tokensFrom(7, 12), tokensFrom(99, 5)
	formats := map[uint64]bool{}
	for i, d := range dcs {
		d.rl = startRelay(t, "--listen", "127.0.0.1:0", "--pool", fmt.Sprintf("%s:dc=%d,expected=%d,block_size=16", d.pool, i+1, d.expected))
		storeTokens(t, d.rl.base, d.pool, reqA[:16*d.holds], 1)
		resident := d.holds
		if d.pool == "dc-mid" {
			storeTokens(t, d.rl.base, d.pool, reqB, 2)
			resident += len(reqB) / 16
		}
		waitResident(t, d.rl.base, d.pool, resident)
		formats[uint64(getCatalog(t, d.rl.base)[d.pool].Identity.Format.BucketCount)] = true
	}
	require.Len(t, formats, 3, "three pool sizes, three bucket counts")

	var in bytes.Buffer
	type want struct {
		depths map[string]uint32
		best   any // string or nil
		err    bool
	}
	var wants []want
	line := func(v any, w want) {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		in.Write(append(b, '\n'))
		wants = append(wants, w)
	}
	locals := ckf.AppendLocalBlockHashes(nil, reqA, 16, ckf.BaseSalt)
	seq := ckf.AppendSequenceHashes(nil, locals)
	for k := 0; k <= 12; k++ {
		w := want{depths: map[string]uint32{}}
		var best uint32
		for _, d := range dcs {
			w.depths[d.pool] = uint32(min(k, d.holds))
			if w.depths[d.pool] > best {
				best, w.best = w.depths[d.pool], d.pool
			}
		}
		line(map[string]any{"tokens": reqA[:16*k]}, w)
		line(map[string]any{"local_hashes": decimal(locals[:k])}, w)
		line(map[string]any{"sequence_hashes": decimal(seq[:k])}, w)
	}
	line(map[string]any{"tokens": append(reqA[:16*2:16*2], 5)}, want{depths: map[string]uint32{"dc-small": 2, "dc-mid": 2, "dc-big": 2}, best: "dc-small"}) // a tie: the first pool given; a partial block is ignored
	line(map[string]any{"tokens": reqB}, want{depths: map[string]uint32{"dc-small": 0, "dc-mid": 5, "dc-big": 0}, best: "dc-mid"})
	line(map[string]any{"tokens": tokensFrom(12345, 4)}, want{depths: map[string]uint32{"dc-small": 0, "dc-mid": 0, "dc-big": 0}})
	line(map[string]any{"tokens": reqB, "namespace": "tenant-x"}, want{depths: map[string]uint32{"dc-small": 0, "dc-mid": 0, "dc-big": 0}}) // another salt
	in.WriteString("not json\n")
	wants = append(wants, want{err: true})
	line(map[string]any{"tokens": reqB, "sequence_hashes": []string{"1"}}, want{err: true})
	line(map[string]any{"local_hashes": []uint64{1}}, want{err: true}) // 64-bit values are decimal strings
	line(map[string]any{"tokens": reqB}, want{depths: map[string]uint32{"dc-small": 0, "dc-mid": 5, "dc-big": 0}, best: "dc-mid"})

	for _, impl := range []string{"wasm", "native"} {
		t.Run("impl="+impl, func(t *testing.T) {
			answers := queryBinary(t, bin, in.Bytes(), "--impl", impl, "--relay", dcs[0].rl.base, "--pool", "dc-small",
				"--pool", "dc-mid@"+dcs[1].rl.base, "--pool", "dc-big@"+dcs[2].rl.base, "--wait", "60s")
			require.Len(t, answers, len(wants), "one answer a request")
			for i, got := range answers {
				w := wants[i]
				if w.err {
					assert.NotEmpty(t, got.Error, "answer %d: %+v", i, got)
					continue
				}
				assert.Empty(t, got.Error, "answer %d", i)
				assert.Equal(t, w.depths, got.Depths, "answer %d: %+v", i, got)
				assert.Equal(t, w.best, got.Best, "answer %d: %+v", i, got)
				assert.Empty(t, got.NotReady, "answer %d", i)
			}
		})
	}
}

// queryAnswer is one line `relay query` prints.
type queryAnswer struct {
	Depths   map[string]uint32 `json:"depths"`
	Best     any               `json:"best"`
	NotReady []string          `json:"not_ready"`
	Error    string            `json:"error"`
}

// queryBinary runs `relay query args` with stdin and returns its answers, one
// a line; the command must exit 0.
func queryBinary(t *testing.T, bin string, stdin []byte, args ...string) []queryAnswer {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"query"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "relay query: %s", stderr.String())
	var answers []queryAnswer
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var a queryAnswer
		require.NoError(t, json.Unmarshal(sc.Bytes(), &a), "answer %d: %s", len(answers), sc.Text())
		answers = append(answers, a)
	}
	return answers
}

// TestE2E_QueryRefusesMixedSemanticsAndWaits: pools whose requests hash
// differently (block sizes 16 and 32) cannot be asked one request, and a
// pool that never becomes ready ends the command with exit 1 naming it.
func TestE2E_QueryRefusesMixedSemanticsAndWaits(t *testing.T) {
	bin := relayBinary(t)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "a:dc=1,expected=256,block_size=16", "--pool", "b:dc=2,expected=256,block_size=32")
	cmd := exec.Command(bin, "query", "--relay", rl.base, "--pool", "a", "--pool", "b")
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "block_size 16 vs 32")
	// --block-size sets one for both: accepted, answered.
	cmd = exec.Command(bin, "query", "--relay", rl.base, "--pool", "a", "--pool", "b", "--block-size", "16", "--impl", "native")
	cmd.Stdin = strings.NewReader(`{"tokens": [1, 2, 3]}` + "\n")
	out, err = cmd.Output()
	require.NoError(t, err)
	assert.JSONEq(t, `{"depths": {"a": 0, "b": 0}, "best": null}`, string(out))
	// A relay (a real HTTP server playing a broken one) whose catalog lists
	// pool a but whose streams always fail: its lane never becomes ready,
	// and past --wait the command exits 1 naming it.
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/pools" {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		resp, err := http.Get(rl.base + "/v1/pools")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(broken.Close)
	cmd = exec.Command(bin, "query", "--relay", rl.base, "--pool", "b", "--pool", "a@"+broken.URL, "--block-size", "16", "--wait", "500ms", "--impl", "native")
	cmd.Stdin = strings.NewReader("")
	out, err = cmd.CombinedOutput()
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "pools not ready")
	assert.Contains(t, string(out), "a (")
	assert.NotContains(t, string(out), "b (", "pool b on the healthy relay became ready")
}

// TestE2E_RouterFollowsAResize: a Go router (client.Router over the
// WebAssembly consumer) whose manifest the Config derives (client's
// Config.Manifest: no format pinned) follows a pool whose relay restarts
// with another size — a new incarnation in another format (64 expected
// blocks, 32 buckets → 100,000, 65,536 buckets) — and converges on the new
// table, while a lane of the old size beside it keeps answering. A router
// whose manifest pins the old format (a version-1 manifest) stops that lane
// with a typed error in its status (client.FormatMismatchError) instead of
// retrying forever.
func TestE2E_RouterFollowsAResize(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=64")
	other := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "q:dc=2,expected=64")
	rtOnce.Do(func() { rt, rtErr = host.NewRuntime(context.Background(), host.NewConfig()) })
	require.NoError(t, rtErr)
	cfg := client.Config{Relays: []client.Relay{{Addrs: []string{rl.base}}, {Addrs: []string{other.base}}}, ConsumerInstance: 77,
		Targets:    []client.Target{{Pool: "p", Lane: 0}, {Pool: "q", Lane: 1, Relay: 1}},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, IdleTimeout: 5 * time.Second}
	m, err := cfg.Manifest(context.Background())
	require.NoError(t, err)
	domain := server.Config{}.Domain()
	require.Equal(t, &ckf.PoolID{Domain: domain, DCID: 1}, m.Lanes[0], "lane 0 from relay 0's catalog")
	require.Equal(t, &ckf.PoolID{Domain: domain, DCID: 2}, m.Lanes[1], "lane 1 from relay 1's catalog")
	in, err := rt.NewInstance(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { _ = in.Close() })
	r, err := client.New(cfg, in)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// The pinned router: another consumer instance, the same pools, the
	// manifest pinning the pools' format today.
	pinnedCfg := cfg
	pinnedCfg.ConsumerInstance = 78
	pm, err := pinnedCfg.Manifest(context.Background())
	require.NoError(t, err)
	pm.Format = ckf.NewFormat(uint64(getCatalog(t, rl.base)["p"].Identity.Format.Seed), uint64(getCatalog(t, rl.base)["p"].Identity.Format.BucketCount))
	pinnedLanes, err := client.NewNative(pm)
	require.NoError(t, err)
	pinned, err := client.New(pinnedCfg, pinnedLanes)
	require.NoError(t, err)
	pdone := make(chan struct{})
	go func() { defer close(pdone); _ = pinned.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-pdone })

	req := tokensFrom(5, 6)
	storeTokens(t, rl.base, "p", req[:16*2], 1)
	storeTokens(t, other.base, "q", req[:16*4], 1)
	waitResident(t, rl.base, "p", 2)
	waitResident(t, other.base, "q", 4)
	// A lane converged at sequence 0 matched the pool's empty table: the
	// stored blocks were admitted but not yet published, and the query would
	// read depth 0 from a router that is right about what it was sent.
	require.NotZero(t, converge(t, r, rl.base, "p", 0), "converged before p published the stored blocks")
	require.NotZero(t, converge(t, r, other.base, "q", 1), "converged before q published the stored blocks")
	seq := ckf.AppendTokenSequenceHashes(nil, req, 16, ckf.BaseSalt)
	var res consumer.QueryResult
	require.NoError(t, r.QuerySequenceHashes(seq, &res))
	assert.Equal(t, []uint32{2, 4}, res.Depths[:2])
	small := getCatalog(t, rl.base)["p"].Identity.Format.BucketCount

	rl.kill()
	var rl2 *relay
	for attempt := 0; ; attempt++ {
		rl2 = startRelayMaybeWith(t, rl.addr, "--pool", "p:dc=1,expected=100000")
		if rl2 != nil || attempt == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NotNil(t, rl2, "could not restart the relay on %s", rl.addr)
	big := getCatalog(t, rl2.base)["p"].Identity.Format.BucketCount
	require.NotEqual(t, small, big, "the restarted pool has another format")
	storeTokens(t, rl2.base, "p", req[:16*5], 1)
	waitResident(t, rl2.base, "p", 5)
	require.NotZero(t, converge(t, r, rl2.base, "p", 0), "converged before the resized p published the stored blocks")
	st, err := in.LaneStatus(0)
	require.NoError(t, err)
	assert.Equal(t, uint64(big), st.Format.BucketCount, "lane 0 in the new format")
	require.NoError(t, r.QuerySequenceHashes(seq, &res))
	assert.Equal(t, []uint32{5, 4}, res.Depths[:2], "the resized pool's new prefix; the other lane unchanged")
	stats, err := in.Stats()
	require.NoError(t, err)
	assert.Equal(t, 2, stats.Groups, "two formats, two groups")

	// The pinned router's lane 0 stopped with the typed error; its lane 1
	// (the old size) still follows.
	for deadline := time.Now().Add(30 * time.Second); pinned.Lane(0).Stopped == nil; time.Sleep(10 * time.Millisecond) {
		require.False(t, time.Now().After(deadline), "the pinned lane did not stop: %+v", pinned.Lane(0))
	}
	var mismatch *client.FormatMismatchError
	require.ErrorAs(t, pinned.Lane(0).Stopped, &mismatch)
	assert.ErrorIs(t, mismatch, consumer.ErrFormatMismatch)
	assert.Equal(t, uint64(big), mismatch.Format.BucketCount, "the error names the pool's new format")
	assert.False(t, pinned.Lane(0).Ready)
	assert.True(t, pinned.Lane(1).Ready, "the pinned router's other lane")
}
