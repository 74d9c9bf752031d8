package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

const python = "/usr/bin/python3"

// heldBlock is one block the Python publisher says an engine holds.
type heldBlock struct {
	Parent *uint64
	Tokens []uint32 // its token window (block_size, or block_size+1 for Eagle)
	Lora   *string
	NS     *string
	MM     []uint64
}

// pyPublisher is internal/source/zmq/testdata/engine_pub.py driven over its
// stdin/stdout.
type pyPublisher struct {
	t     *testing.T
	in    *os.File
	lines *bufio.Scanner
}

func startPublisher(t *testing.T, pub, rep string, blockSize int, form, layout, batch, hash string) *pyPublisher {
	t.Helper()
	cmd := exec.Command(python, "../../internal/source/zmq/testdata/engine_pub.py", pub, rep, strconv.Itoa(blockSize), form, layout, batch, hash)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		fmt.Fprintln(stdin, "quit")
		stdin.Close()
		_ = cmd.Wait()
	})
	p := &pyPublisher{t: t, in: stdin.(*os.File), lines: bufio.NewScanner(stdout)}
	p.lines.Buffer(nil, 1<<20)
	require.Equal(t, "ready", p.line())
	return p
}

func (p *pyPublisher) line() string {
	p.t.Helper()
	require.True(p.t, p.lines.Scan(), "publisher exited: %v", p.lines.Err())
	return p.lines.Text()
}

// run publishes the scenario and returns the sequence of its last batch.
func (p *pyPublisher) run() int64 {
	fmt.Fprintln(p.in, "go")
	f := strings.Fields(p.line())
	require.Equal(p.t, "done", f[0])
	n, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(p.t, err)
	return n
}

func (p *pyPublisher) truth() map[uint64]heldBlock {
	fmt.Fprintln(p.in, "truth")
	var raw map[string]heldBlock
	require.NoError(p.t, json.Unmarshal([]byte(p.line()), &raw))
	out := map[uint64]heldBlock{}
	for k, v := range raw {
		h, err := strconv.ParseUint(k, 10, 64)
		require.NoError(p.t, err)
		out[h] = v
	}
	return out
}

// request is the router's view of one held block: the request whose last
// block it is (its path from the root), as tokens, salt and per-block mm
// hashes, and the depth the publisher's model expects.
type request struct {
	tokens []uint32
	salt   uint64
	mm     [][]uint64
	depth  uint32
	blocks int
}

// requests builds, for every held block, the request ending in it and the
// depth the publisher's truth implies: the leading blocks whose key, as a
// router computes it from the request, is the key of the held block at
// that position (the publisher's windows, namespace, LoRA and mm hashes).
// A child chain's tokens do not continue its parent's Eagle window, so
// across such a link the expected depth stops at the parent.
func requests(t *testing.T, held map[uint64]heldBlock, bs int, eagle bool) []request {
	canon := map[uint64]uint64{}
	var key func(h uint64) uint64
	key = func(h uint64) uint64 {
		if k, ok := canon[h]; ok {
			return k
		}
		b := held[h]
		local := ckf.LocalBlockHashMM(b.Tokens, b.MM, ckf.Salt(str(b.Lora), str(b.NS)))
		k := local
		if b.Parent != nil {
			k = ckf.ChainHash(key(*b.Parent), local)
		}
		canon[h] = k
		return k
	}
	var out []request
	for h, leaf := range held {
		var path []uint64
		for c := h; ; {
			path = append([]uint64{c}, path...)
			p := held[c].Parent
			if p == nil {
				break
			}
			_, ok := held[*p]
			require.True(t, ok, "block %d's parent %d is held", c, *p)
			c = *p
		}
		r := request{salt: ckf.Salt(str(leaf.Lora), str(leaf.NS)), blocks: len(path)}
		for _, c := range path {
			r.tokens = append(r.tokens, held[c].Tokens[:bs]...)
			r.mm = append(r.mm, held[c].MM)
		}
		if eagle {
			r.tokens = append(r.tokens, leaf.Tokens[bs])
		}
		seq := ckf.AppendTokenSequenceHashesWith(nil, r.tokens, bs, r.salt, ckf.HashOptions{MM: r.mm, Eagle: eagle})
		require.Len(t, seq, len(path))
		for i, c := range path {
			if seq[i] != key(c) {
				break
			}
			r.depth++
		}
		out = append(out, r)
	}
	return out
}

func str(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestE2E_PythonPublisherThroughTheRelay: two independent Python
// publishers (pyzmq + msgpack, sharing no code with the relay) send every
// variant today's engines send — array and map batches and events,
// namespaces, multimodal extra_keys, a hybrid model's other group, an
// unknown medium, Eagle bigrams — over real ZMQ into the relay binary, one
// into a dynamo_standard_v1 pool and one into a dynamo_eagle_v1 pool. A
// router following the relay's HTTP streams with the WebAssembly consumer
// asks, for every block a publisher holds, the request ending in it by
// tokens (query kind 3: the namespace in the salt, the request's mm hashes,
// Eagle windows by the pool's catalog query_semantics), and each answer is
// the depth the publisher's own model expects; without the namespace or mm
// hashes the same requests stop short.
func TestE2E_PythonPublisherThroughTheRelay(t *testing.T) {
	if err := exec.Command(python, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("needs /usr/bin/python3 with python3-zmq and python3-msgpack (apt-get install -y python3-zmq python3-msgpack)")
	}
	const bs = 4
	ports, err := engine.FreePorts(4)
	require.NoError(t, err)
	ep := func(i int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", ports+i) }
	rl := startRelay(t, "--listen", "127.0.0.1:0",
		"--pool", "std:dc=1,expected=65536,block_size=4",
		"--pool", "eagle:dc=2,expected=65536,block_size=4,hash_format=dynamo_eagle_v1",
		"--source", fmt.Sprintf("std:engine=vllm,endpoint=%s,replay=%s,worker=11", ep(0), ep(1)),
		"--source", fmt.Sprintf("eagle:engine=sglang,endpoint=%s,replay=%s,worker=12,fail_window=30s", ep(2), ep(3)))
	pubs := []*pyPublisher{
		startPublisher(t, ep(0), ep(1), bs, "map", "new", "map", "standard"),
		startPublisher(t, ep(2), ep(3), bs, "array", "old", "array", "eagle"),
	}
	pools := []string{"std", "eagle"}
	cat := getCatalog(t, rl.base)
	for i, want := range []bool{false, true} {
		q := cat[pools[i]].Query
		require.Equal(t, bs, q.BlockSize, pools[i])
		eagle, err := q.Eagle()
		require.NoError(t, err)
		require.Equal(t, want, eagle, "%s: the catalog's hash format", pools[i])
	}
	lanes := wasmLanes(t, rl.base, pools)
	r := startRouter(t, rl.base, pools, lanes, nil)
	for i, p := range pools {
		require.Eventually(t, func() bool {
			st, _ := sourceOf(t, rl.base, p)
			return len(st.Ranks) == 1 && st.Ranks[0].State == "live"
		}, 20*time.Second, 10*time.Millisecond, "%s: source live", p)
		last := pubs[i].run()
		require.Eventually(t, func() bool {
			st, _ := sourceOf(t, rl.base, p)
			return len(st.Ranks) == 1 && int64(st.Ranks[0].Seq) >= last && st.Ranks[0].State == "live"
		}, 20*time.Second, 10*time.Millisecond, "%s: the scenario applied", p)
	}
	// The heartbeats go on; events have stopped: the lanes converge.
	for i, p := range pools {
		converge(t, r, rl.base, p, i)
	}
	for lane, p := range pools {
		eagle, _ := cat[p].Query.Eagle()
		held := pubs[lane].truth()
		reqs := requests(t, held, bs, eagle)
		require.Len(t, reqs, len(held))
		var full, salted, imaged int
		for _, q := range reqs {
			var res consumer.QueryResult
			o := ckf.HashOptions{MM: q.mm, Eagle: eagle}
			require.NoError(t, lanes.QueryTokensWith(q.tokens, bs, q.salt, o, &res))
			require.Equal(t, q.depth, res.Depths[lane], "%s: request of %d blocks", p, q.blocks)
			if q.depth == uint32(q.blocks) {
				full++
			}
			if q.salt != ckf.BaseSalt && q.depth > 0 {
				salted++
				require.NoError(t, lanes.QueryTokensWith(q.tokens, bs, ckf.BaseSalt, o, &res))
				assert.Less(t, res.Depths[lane], q.depth, "%s: a tenant's request without its namespace", p)
			}
			if hasMM(q.mm) && q.depth == uint32(q.blocks) {
				imaged++
				require.NoError(t, lanes.QueryTokensWith(q.tokens, bs, q.salt, ckf.HashOptions{Eagle: eagle}, &res))
				assert.Less(t, res.Depths[lane], q.depth, "%s: a multimodal request without its mm hashes", p)
			}
		}
		t.Logf("%s: %d requests, %d found whole, %d namespaced, %d multimodal", p, len(reqs), full, salted, imaged)
		assert.GreaterOrEqual(t, full, len(held)-3, "%s: requests found whole (all but those crossing a chain link under Eagle)", p)
		assert.Positive(t, salted, "%s: namespaced requests", p)
		assert.Positive(t, imaged, "%s: multimodal requests", p)
		st, _ := sourceOf(t, rl.base, p)
		assert.Zero(t, st.Rejected, p)
		assert.Equal(t, "live", st.State, p)
		if !eagle {
			assert.Positive(t, st.DroppedByReason["hash_format"], "%s: the Eagle chain into a standard pool", p)
		}
	}
}

func hasMM(mm [][]uint64) bool {
	for _, l := range mm {
		if len(l) > 0 {
			return true
		}
	}
	return false
}
