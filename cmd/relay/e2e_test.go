//go:build unix

package main

// End-to-end tests: the real relay binary (built once), on loopback, with a
// router client holding the WebAssembly consumer.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/wasm/host"
	"github.com/ckfrelay/ckfrelay/wire"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string

	rtOnce sync.Once
	rt     *host.Runtime
	rtErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if rt != nil {
		_ = rt.Close(context.Background())
	}
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// relayBinary builds cmd/relay once per test binary.
func relayBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: builds and runs the relay binary")
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "ckfrelay-e2e-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "relay")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// relay is one running relay process.
type relay struct {
	t      testing.TB
	cmd    *exec.Cmd
	addr   string
	base   string
	exited chan struct{}
	err    error       // the process's exit, valid after exited
	grpc   chan string // the "grpc listening on" address, with --grpc-listen
}

// startRelay runs "relay serve args..." and waits for its "listening on"
// line.
func startRelay(t testing.TB, args ...string) *relay {
	t.Helper()
	return startRelayUnder(t, nil, args...)
}

// startRelayUnder is startRelay with the relay run by a wrapper command
// (wrap, then the relay's path and arguments), e.g. prlimit.
func startRelayUnder(t testing.TB, wrap []string, args ...string) *relay {
	t.Helper()
	// CKFRELAY_E2E_RELAY_LOG_LEVEL=info records the HA role changes too.
	level := cmp.Or(os.Getenv("CKFRELAY_E2E_RELAY_LOG_LEVEL"), "warn")
	argv := append(append(slices.Clone(wrap), relayBinary(t), "serve", "--log-level", level), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	stderr, err := os.Create(filepath.Join(t.TempDir(), "relay.stderr"))
	require.NoError(t, err)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	r := &relay{t: t, cmd: cmd, exited: make(chan struct{}), grpc: make(chan string, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "grpc listening on "); ok {
				r.grpc <- a
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		r.kill()
		// CKFRELAY_E2E_RELAY_LOGS=1 shows every relay's log, also when the
		// test passed (the HA tests' role changes are logged at INFO).
		if t.Failed() || os.Getenv("CKFRELAY_E2E_RELAY_LOGS") == "1" {
			b, _ := os.ReadFile(stderr.Name())
			t.Logf("relay stderr:\n%s", b)
		}
	})
	select {
	case l, ok := <-lines:
		addr, found := strings.CutPrefix(l, "listening on ")
		if !ok || !found {
			r.kill()
			b, _ := os.ReadFile(stderr.Name())
			require.Fail(t, fmt.Sprintf("relay did not report its address (first line %q): %v\n%s", l, r.err, b))
		}
		r.addr, r.base = addr, "http://"+addr
	case <-time.After(60 * time.Second):
		r.kill()
		require.Fail(t, "relay did not start in 60s")
	}
	return r
}

func (r *relay) kill() {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// quit ends the relay with SIGQUIT, so that its stderr, printed when the
// test failed, ends with every goroutine's stack: where a relay that
// stopped making progress waits.
func (r *relay) quit() {
	select {
	case <-r.exited:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-r.exited:
	case <-time.After(5 * time.Second):
		r.kill()
	}
}

// rssBytes reads the process's resident set from /proc (0 where there is none).
func (r *relay) rssBytes() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func writeConfig(t *testing.T, cfg server.Config) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "relay.json")
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

func getCatalog(t testing.TB, base string) map[string]catalog.Pool {
	t.Helper()
	c, err := catalog.Get(context.Background(), nil, base, "")
	require.NoError(t, err, "catalog")
	out := map[string]catalog.Pool{}
	for _, p := range c.Pools {
		out[p.Name] = p
	}
	return out
}

// wasmLanes returns a WebAssembly consumer instance configured for the
// relay's pools, lane i serving pools[i].
func wasmLanes(t testing.TB, base string, pools []string) *host.Instance {
	t.Helper()
	rtOnce.Do(func() { rt, rtErr = host.NewRuntime(context.Background(), host.NewConfig()) })
	require.NoError(t, rtErr)
	cat := getCatalog(t, base)
	domain := server.Config{}.Domain()
	first := cat[pools[0]].Identity.Format
	m := consumer.Manifest{ConsumerInstance: 77, Domain: domain, Format: ckf.NewFormat(uint64(first.Seed), uint64(first.BucketCount)), VerificationWindow: 2}
	for i, p := range pools {
		m.Lanes[i] = &ckf.PoolID{Domain: domain, DCID: uint64(cat[p].DCID)}
	}
	in, err := rt.NewInstance(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { _ = in.Close() })
	return in
}

func startRouter(t *testing.T, relayURL string, pools []string, lanes client.Lanes, hc *http.Client) *client.Router {
	t.Helper()
	var targets []client.Target
	for i, p := range pools {
		targets = append(targets, client.Target{Pool: p, Lane: i})
	}
	r, err := client.New(client.Config{Relays: []client.Relay{{Addrs: []string{relayURL}}}, ConsumerInstance: 77, Targets: targets,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, IdleTimeout: 5 * time.Second, HTTPClient: hc}, lanes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

var eventSeq atomic.Uint64

// postBurst posts batches of Stored events (n events of `blocks` chained
// blocks each, from a few workers) and returns how many were admitted.
func postBurst(t *testing.T, base, pool string, n, blocks int) {
	t.Helper()
	const batch = 256
	for done := 0; done < n; {
		k := min(batch, n-done)
		evs := make([]ckf.RouterEvent, k)
		for i := range evs {
			id := eventSeq.Add(1)
			ev := ckf.RouterEvent{WorkerID: id % 4, EventID: id, Kind: ckf.EventStored}
			for j := range blocks {
				ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: id<<8 | uint64(j), TokensHash: id*1_000_003 + uint64(j)})
			}
			evs[i] = ev
		}
		body, err := wire.AppendRouterEventsJSON(nil, evs)
		require.NoError(t, err)
		resp, err := http.Post(base+"/v1/pools/"+pool+"/events?source_epoch=1", "application/json", bytes.NewReader(body))
		require.NoError(t, err, "post events")
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusAccepted, resp.StatusCode, "post events: %s %s", resp.Status, b)
		done += k
	}
}

var tailEpoch atomic.Uint64

// relaySnapshot takes a fresh snapshot of a pool through its stream, as an
// independent subscriber.
func relaySnapshot(t *testing.T, base, pool string) (ckf.ProducerIdentity, uint64, []uint64) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("%s/v1/pools/%s/stream?consumer=900&lane=0&epoch=%d", base, pool, uint64(time.Now().UnixNano())+tailEpoch.Add(1)))
	require.NoError(t, err, "snapshot")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		require.Fail(t, fmt.Sprintf("snapshot: %s %s", resp.Status, b))
	}
	fr := wire.NewReader(resp.Body, 0)
	var f wire.Frame
	var words []uint64
	for got := uint32(0); ; got++ {
		{
			err := fr.ReadFrame(&f)
			require.NoError(t, err, "snapshot chunk %d: kind %v", got, f.Kind)
			require.Equal(t, wire.KindSnapshotChunk, f.Kind, "snapshot chunk %d: kind %v, %v", got, f.Kind, err)
		}
		c := &f.Snapshot
		if words == nil {
			words = make([]uint64, c.Identity.Format.BucketCount)
		}
		copy(words[c.BucketOffset:], c.Words)
		if got+1 == c.ChunkCount {
			return c.Identity, c.Sequence, words
		}
	}
}

// converge waits until the router's lane holds exactly the relay's current
// snapshot: same sequence, same words. Events must have stopped.
func converge(t *testing.T, r *client.Router, base, pool string, lane int) uint64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		_, seq, want := relaySnapshot(t, base, pool)
		got, gotSeq, err := r.AppendLaneWords(nil, lane)
		switch {
		case err != nil:
			last = fmt.Sprintf("lane %d: %v (%s)", lane, err, r.Lane(lane).LastError)
		case gotSeq != seq:
			last = fmt.Sprintf("lane %d at sequence %d, relay at %d", lane, gotSeq, seq)
		case !slices.Equal(got, want):
			require.Fail(t, fmt.Sprintf("lane %d at the relay's sequence %d but its words differ", lane, seq))
		default:
			return seq
		}
		time.Sleep(20 * time.Millisecond) // observing an end state, not ordering
	}
	require.Fail(t, fmt.Sprintf("router did not converge with %s: %s", pool, last))
	return 0
}

func TestE2E_BurstConverges(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536", "--pool", "dc-b:dc=2,expected=65536")
	pools := []string{"dc-a", "dc-b"}
	r := startRouter(t, rl.base, pools, wasmLanes(t, rl.base, pools), nil)
	postBurst(t, rl.base, "dc-a", 3000, 8)
	postBurst(t, rl.base, "dc-b", 1000, 4)
	seqA := converge(t, r, rl.base, "dc-a", 0)
	seqB := converge(t, r, rl.base, "dc-b", 1)
	cat := getCatalog(t, rl.base)
	assert.False(t, cat["dc-a"].Stats.UniqueBlocks != 3000*8 || cat["dc-b"].Stats.UniqueBlocks != 1000*4, "relay tracks %d and %d blocks, want %d and %d", cat["dc-a"].Stats.UniqueBlocks, cat["dc-b"].Stats.UniqueBlocks, 3000*8, 1000*4)
	assert.False(t, seqA == 0 || seqB == 0, "converged at sequences %d, %d: want publications after the burst", seqA, seqB)
	// The router answers from the converged lanes: the last event's chain is
	// held by dc-a only.
	id := eventSeq.Load() - 1000 // the last dc-a event
	var locals []uint64
	for j := range 8 {
		locals = append(locals, id*1_000_003+uint64(j))
	}
	var res consumer.QueryResult
	require.NoError(t, r.QuerySequenceHashes(ckf.AppendSequenceHashes(nil, locals), &res))
	assert.False(t, res.Mask&1 == 0 || res.Depths[0] != 8, "query of dc-a's last chain: mask %b depth %d, want lane 0 at depth 8", res.Mask, res.Depths[0])
}

func TestE2E_DroppedConnectionReconverges(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=65536")
	px := natstest.StartPausableProxy(t, rl.addr)
	pools := []string{"p"}
	r := startRouter(t, "http://"+px.Addr(), pools, wasmLanes(t, rl.base, pools), nil)
	postBurst(t, rl.base, "p", 500, 4)
	converge(t, r, rl.base, "p", 0)
	before := r.Lane(0).Resubscribes
	require.NotEqual(t, 0, px.Cut(), "no proxied connection to cut")
	postBurst(t, rl.base, "p", 500, 4) // published while the router is cut off
	converge(t, r, rl.base, "p", 0)
	li := r.Lane(0)
	assert.Greater(t, li.Resubscribes, before, "resubscribes %d after the cut, want > %d", li.Resubscribes, before)
}

func TestE2E_RelayRestartIsNewIncarnation(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=65536")
	pools := []string{"p"}
	r := startRouter(t, rl.base, pools, wasmLanes(t, rl.base, pools), nil)
	postBurst(t, rl.base, "p", 500, 4)
	converge(t, r, rl.base, "p", 0)
	inc1 := getCatalog(t, rl.base)["p"].Identity.ProducerIncarnation

	rl.kill() // a crash: no drain, no close frame
	var rl2 *relay
	for attempt := 0; ; attempt++ { // the port is free once the process is gone
		rl2 = startRelayMaybe(t, rl.addr)
		if rl2 != nil || attempt == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NotNil(t, rl2, "could not restart the relay on %s", rl.addr)
	inc2 := getCatalog(t, rl2.base)["p"].Identity.ProducerIncarnation
	require.NotEqual(t, inc1, inc2, "restarted relay kept incarnation %d", inc1)
	postBurst(t, rl2.base, "p", 300, 4)
	converge(t, r, rl2.base, "p", 0)
	id, _, _ := relaySnapshot(t, rl2.base, "p")
	assert.Equal(t, uint64(inc2), id.ProducerIncarnation, "snapshot incarnation %d, want the new %d", id.ProducerIncarnation, inc2)
	cat := getCatalog(t, rl2.base)["p"]
	assert.Equal(t, 300*4, cat.Stats.UniqueBlocks, "new incarnation tracks %d blocks, want only its own %d", cat.Stats.UniqueBlocks, 300*4)
}

// startRelayMaybe starts a relay on addr, or returns nil when the port is
// still taken.
func startRelayMaybe(t *testing.T, addr string) *relay {
	return startRelayMaybeWith(t, addr, "--pool", "p:dc=1,expected=65536")
}

// startRelayMaybeWith is startRelayMaybe with the relay's pool flags.
func startRelayMaybeWith(t *testing.T, addr string, pools ...string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil
	}
	ln.Close()
	return startRelay(t, append([]string{"--listen", addr}, pools...)...)
}

// gated is a consumer that stops (holding the router's lock, so the router
// stops reading its stream) when armed, until released.
type gated struct {
	client.Lanes
	armed   atomic.Bool
	blocked chan struct{}
	release chan struct{}
}

func (g *gated) ApplyFrame(b []byte) (consumer.Result, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.blocked)
		<-g.release
	}
	return g.Lanes.ApplyFrame(b)
}

func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func TestE2E_SlowSubscriberIsLaggedAndReconverges(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", SubscriberQueue: 4, StreamWriteTimeout: server.Duration(30 * time.Second),
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 16384, PublishEveryNEvents: 1}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	pools := []string{"p"}
	g := &gated{Lanes: wasmLanes(t, rl.base, pools), blocked: make(chan struct{}), release: make(chan struct{})}
	// A small receive buffer, so a router that stops reading backs up into
	// the relay's queue after kilobytes, not megabytes.
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	hc := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	r := startRouter(t, rl.base, pools, g, hc)
	postBurst(t, rl.base, "p", 50, 2)
	converge(t, r, rl.base, "p", 0)

	g.armed.Store(true)
	postBurst(t, rl.base, "p", 1, 1)
	<-g.blocked // the router stopped reading (heartbeat or delta)
	const series = `ckfrelay_subscriber_lagged_total{pool="p"}`
	for i := 0; metricValue(t, rl.base, series) == 0; i++ {
		if i == 400 {
			close(g.release)
			require.Fail(t, "the stopped subscriber was never closed as lagged")
		}
		postBurst(t, rl.base, "p", 100, 2)
	}
	close(g.release)
	converge(t, r, rl.base, "p", 0)
	li := r.Lane(0)
	assert.NotEqual(t, uint64(0), li.Resubscribes, "lane %+v, want a resubscribe after the lagged close", li)
}

func TestE2E_MalformedRequestsChangeNothing(t *testing.T) {
	// Cadence 1: every admitted event is published when applied, so no
	// timer-published tail can move the pool between the two snapshots.
	cfg := server.Config{Listen: "127.0.0.1:0", MaxEventsPerBatch: 4,
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 4096, PublishEveryNEvents: 1}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	postBurst(t, rl.base, "p", 4, 3)
	// A rank reset at epoch 5 makes epoch 3 stale; a lease at epoch 9 makes
	// 9 stale for the same consumer lane.
	do := func(method, path, ctype, body string) (int, string) {
		req, _ := http.NewRequest(method, rl.base+path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code
	}
	{
		code, _ := do("POST", "/v1/pools/p/ranks/reset", "application/json", `{"worker_id": 77, "source_epoch": 5}`)
		require.Equal(t, 200, code, "reset: %d", code)
	}
	st, err := http.Get(rl.base + "/v1/pools/p/stream?consumer=5&lane=1&epoch=9")
	require.NoError(t, err, "stream")
	require.Equal(t, 200, st.StatusCode, "stream: %v", err)
	st.Body.Close()
	// The catalog's stats come through the pool's mailbox, after every event
	// admitted before; wait until the hub has mirrored what they published.
	require.Eventually(t, func() bool {
		p := getCatalog(t, rl.base)["p"]
		return p.Stats != nil && p.Hub.Sequence == p.Stats.Sequence
	}, 10*time.Second, 5*time.Millisecond, "the hub never caught up with the pool")
	_, seq0, words0 := relaySnapshot(t, rl.base, "p")
	five := strings.Repeat(`{"worker_id": 1, "event": {"event_id": 1, "data": "cleared"}},`, 5)
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"bad json", "POST", "/v1/pools/p/events?source_epoch=1", "application/json", `[{"worker_id": `, 400, server.CodeMalformedEvents},
		{"unknown pool", "POST", "/v1/pools/q/events?source_epoch=1", "application/json", `[]`, 404, server.CodeUnknownPool},
		{"stale source epoch", "POST", "/v1/pools/p/ranks/reset", "application/json", `{"worker_id": 77, "source_epoch": 3}`, 409, server.CodeStaleEpoch},
		{"oversize batch", "POST", "/v1/pools/p/events?source_epoch=1", "application/json", "[" + strings.TrimSuffix(five, ",") + "]", 413, server.CodeLimitExceeded},
		{"oversize body", "POST", "/v1/pools/p/events?source_epoch=1", "application/json", "[" + strings.Repeat(" ", 17<<20) + "]", 413, server.CodeTooLarge},
		{"lease lane 16", "GET", "/v1/pools/p/stream?consumer=5&lane=16&epoch=1", "", "", 400, server.CodeBadRequest},
		{"lease epoch not a number", "GET", "/v1/pools/p/stream?consumer=5&lane=1&epoch=x", "", "", 400, server.CodeBadRequest},
		{"lease without consumer", "GET", "/v1/pools/p/stream?lane=1&epoch=1", "", "", 400, server.CodeBadRequest},
		{"stale lease epoch", "GET", "/v1/pools/p/stream?consumer=5&lane=1&epoch=9", "", "", 409, server.CodeStaleLease},
	}
	for _, c := range cases {
		status, code := do(c.method, c.path, c.ctype, c.body)
		assert.False(t, status != c.status || code != c.code, "%s: %d %q, want %d %q", c.name, status, code, c.status, c.code)
	}
	_, seq1, words1 := relaySnapshot(t, rl.base, "p")
	assert.False(t, seq1 != seq0 || !slices.Equal(words0, words1), "rejected requests changed the pool: sequence %d → %d, words equal %v", seq0, seq1, slices.Equal(words0, words1))
	got := metricValue(t, rl.base, `ckfrelay_requests_rejected_total{code="stale_lease_epoch"}`)
	assert.Equal(t, float64(1), got, "rejected stale_lease_epoch counter %v, want 1", got)
}

func TestE2E_SubscriberFloodIsBounded(t *testing.T) {
	const max = 64
	cfg := server.Config{Listen: "127.0.0.1:0", MaxSubscribers: max, MaxSubscribersPerClient: max, // every subscriber here is 127.0.0.1
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 20}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	postBurst(t, rl.base, "p", 1000, 4)
	_, _, words := relaySnapshot(t, rl.base, "p")
	runtime.GC()
	rss0 := rl.rssBytes()

	var bodies []io.Closer
	t.Cleanup(func() {
		for _, b := range bodies {
			b.Close()
		}
	})
	for i := range max {
		resp, err := http.Get(fmt.Sprintf("%s/v1/pools/p/stream?consumer=%d&lane=0&epoch=1", rl.base, 1000+i))
		require.NoError(t, err, "subscriber %d: %v %v", i, err, resp.Status)
		require.Equal(t, 200, resp.StatusCode, "subscriber %d: %v %v", i, err, resp.Status)
		bodies = append(bodies, resp.Body)
		// Read the whole snapshot, then stop reading: an idle subscriber.
		fr := wire.NewReader(resp.Body, 0)
		var f wire.Frame
		for {
			require.NoError(t, fr.ReadFrame(&f))
			if f.Kind == wire.KindSnapshotChunk && f.Snapshot.ChunkIndex+1 == f.Snapshot.ChunkCount {
				break
			}
		}
	}
	resp, err := http.Get(rl.base + "/v1/pools/p/stream?consumer=1&lane=0&epoch=1")
	require.NoError(t, err)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "subscriber %d: %d %q, want 503 %s", max+1, resp.StatusCode, e.Error.Code, server.CodeTooMany)
	require.Equal(t, server.CodeTooMany, e.Error.Code, "subscriber %d: %d %q, want 503 %s", max+1, resp.StatusCode, e.Error.Code, server.CodeTooMany)
	rss1 := rl.rssBytes()
	if rss0 == 0 {
		t.Skip("no /proc: RSS not measured")
	}
	growth := rss1 - rss0
	// The bound per subscriber: its handler goroutine, connection and frame
	// buffers (the delta log is shared). Snapshots share the hub's
	// generations, so the 4 MiB table is copied at most once for the whole
	// flood (no deltas arrive during it).
	perSub := int64(288 << 10)
	bound := max*perSub + int64(len(words))*8 + 32<<20
	t.Logf("RSS %d MiB → %d MiB with %d subscribers: %d KiB each (snapshot %d KiB, bound %d KiB each)",
		rss0>>20, rss1>>20, max, growth/max>>10, len(words)*8>>10, perSub>>10)
	assert.LessOrEqual(t, growth, bound, "RSS grew %d MiB for %d subscribers, bound %d MiB", growth>>20, max, bound>>20)
	n := getCatalog(t, rl.base)["p"].Hub.Subscribers
	assert.Equal(t, max, n, "catalog subscribers %d, want %d", n, max)
	for _, b := range bodies {
		b.Close()
	}
	bodies = nil
	// Every handler ends once its subscriber leaves: the slots come back.
	deadline := time.Now().Add(30 * time.Second)
	for getCatalog(t, rl.base)["p"].Hub.Subscribers != 0 {
		if time.Now().After(deadline) {
			require.Fail(t, fmt.Sprintf("subscribers still attached after they left: %d", getCatalog(t, rl.base)["p"].Hub.Subscribers))
		}
		postBurst(t, rl.base, "p", 1, 1) // a write is what notices a closed peer
		time.Sleep(10 * time.Millisecond)
	}
}

func TestE2E_SIGTERMDrainsAndClosesStreams(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=65536", "--pool", "q:dc=2,expected=4096")
	postBurst(t, rl.base, "p", 200, 4)
	resp, err := http.Get(rl.base + "/v1/pools/p/stream?consumer=3&lane=0&epoch=1")
	require.NoError(t, err, "stream")
	require.Equal(t, 200, resp.StatusCode, "stream: %v", err)
	defer resp.Body.Close()
	postBurst(t, rl.base, "p", 200, 4)
	require.NoError(t, rl.cmd.Process.Signal(syscall.SIGTERM))
	fr := wire.NewReader(resp.Body, 0)
	var f wire.Frame
	var kinds []wire.Kind
	var last uint64
	var drain ckf.DrainMarker
	var cl wire.Close
	for {
		if err := fr.ReadFrame(&f); err != nil {
			if err == io.EOF {
				break
			}
			require.Fail(t, fmt.Sprintf("after %d frames: %v", len(kinds), err))
		}
		kinds = append(kinds, f.Kind)
		switch f.Kind {
		case wire.KindSnapshotChunk:
			last = f.Snapshot.Sequence
		case wire.KindDelta:
			require.Equal(t, last, f.Delta.BaseSequence, "delta %d→%d after %d: a gap", f.Delta.BaseSequence, f.Delta.Sequence, last)
			last = f.Delta.Sequence
		case wire.KindDrainMarker:
			drain = f.Drain
		case wire.KindClose:
			cl = f.Close
		}
	}
	n := len(kinds)
	if n < 3 || kinds[n-2] != wire.KindDrainMarker || kinds[n-1] != wire.KindClose {
		require.Fail(t, fmt.Sprintf("stream ended with %v, want … drain marker, close", kinds[max(0, n-3):]))
	}
	assert.False(t, drain.ExpectedSequence != last || cl.Reason != wire.CloseShuttingDown, "drain expects %d (last delta %d), close %q; want equal and %q", drain.ExpectedSequence, last, cl.Reason, wire.CloseShuttingDown)
	select {
	case <-rl.exited:
	case <-time.After(30 * time.Second):
		require.Fail(t, "relay did not exit after SIGTERM")
	}
	assert.NoError(t, rl.err, "relay exit after SIGTERM: %v, want status 0", rl.err)
}
