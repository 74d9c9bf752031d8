package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
)

// TestE2E_QueryGRPCSelectsPools runs the relay binary serving gRPC with
// pools {dc 1, llama}, {dc 1, qwen}, {dc 2, llama} (one cache-semantics
// domain per model), each holding a different known prefix of one request
// (stored over HTTP with sync=published), and `relay query --grpc ADDR`
// (the binary again) through the WebAssembly and the native consumer: with
// --model llama it must answer exactly dc 1's and dc 2's llama depths,
// labelled "1" and "2" (dc 1's qwen pool, which holds the whole request,
// must not leak in); with --model qwen only dc 1's qwen depth; with --dc 2
// only dc 2; --domain and no --model select as the router does; and
// selections the router cannot follow end the command with exit 1.
func TestE2E_QueryGRPCSelectsPools(t *testing.T) {
	bin := relayBinary(t)
	pool := func(name string, dc uint64, model string) server.PoolSpec {
		return server.PoolSpec{Name: name, DCID: dc, ExpectedBlocks: 4096, BlockSize: 16, CacheSemantics: model,
			KvRelay: server.KvPoolSpec{Roles: []string{"aggregated"}, Models: []server.ModelSpec{{ID: model}}}}
	}
	base, addr := grpcRelay(t, server.Config{HeartbeatInterval: server.Duration(50 * time.Millisecond),
		Pools: []server.PoolSpec{pool("llama-1", 1, "llama"), pool("qwen-1", 1, "qwen"), pool("llama-2", 2, "llama")}})
	req := tokensFrom(11, 12)
	holds := map[string]int{"llama-1": 3, "qwen-1": 12, "llama-2": 7}
	for p, n := range holds {
		storeTokensQuery(t, base, p, "source_epoch=1&sync=published", req[:16*n], 1)
	}
	other := tokensFrom(4242, 5)
	storeTokensQuery(t, base, "llama-2", "source_epoch=1&sync=published", other, 2)

	locals := ckf.AppendLocalBlockHashes(nil, req, 16, ckf.BaseSalt)
	type want struct {
		depths map[string]uint32
		best   any
	}
	// requests returns the request lines and their expected answers for
	// the data centers dcs (label → pool).
	requests := func(dcs map[string]string) ([]byte, []want) {
		var in bytes.Buffer
		var wants []want
		add := func(v any, w want) {
			b, err := json.Marshal(v)
			require.NoError(t, err)
			in.Write(append(b, '\n'))
			wants = append(wants, w)
		}
		for k := 0; k <= 12; k++ {
			w := want{depths: map[string]uint32{}}
			var best uint32
			for _, label := range []string{"1", "2"} { // answer order: ascending dc_id
				p, ok := dcs[label]
				if !ok {
					continue
				}
				w.depths[label] = uint32(min(k, holds[p]))
				if w.depths[label] > best {
					best, w.best = w.depths[label], label
				}
			}
			add(map[string]any{"tokens": req[:16*k]}, w)
			add(map[string]any{"local_hashes": decimal(locals[:k])}, w)
		}
		w := want{depths: map[string]uint32{}}
		for label, p := range dcs {
			w.depths[label] = 0
			if p == "llama-2" {
				w.depths[label], w.best = 5, label
			}
		}
		add(map[string]any{"tokens": other}, w)
		return in.Bytes(), wants
	}
	run := func(t *testing.T, impl string, dcs map[string]string, args ...string) {
		in, wants := requests(dcs)
		answers := queryBinary(t, bin, in, append([]string{"--impl", impl, "--grpc", addr, "--wait", "60s"}, args...)...)
		require.Len(t, answers, len(wants), "one answer a request")
		for i, got := range answers {
			assert.Empty(t, got.Error, "answer %d", i)
			assert.Equal(t, wants[i].depths, got.Depths, "answer %d: %+v", i, got)
			assert.Equal(t, wants[i].best, got.Best, "answer %d: %+v", i, got)
			assert.Empty(t, got.NotReady, "answer %d", i)
		}
	}
	for _, impl := range []string{"wasm", "native"} {
		t.Run("impl="+impl+"/model=llama", func(t *testing.T) {
			run(t, impl, map[string]string{"1": "llama-1", "2": "llama-2"}, "--model", "llama")
		})
		t.Run("impl="+impl+"/model=qwen", func(t *testing.T) {
			run(t, impl, map[string]string{"1": "qwen-1"}, "--model", "qwen")
		})
		t.Run("impl="+impl+"/model=llama,dc=2", func(t *testing.T) {
			run(t, impl, map[string]string{"2": "llama-2"}, "--model", "llama", "--dc", "2")
		})
	}

	// --domain narrows the selection to the same pools; with no --model a
	// data center's only pool is followed (dc 2's), and dc 1, which has
	// two, is left out.
	t.Run("impl=native/model=llama,domain", func(t *testing.T) {
		run(t, "native", map[string]string{"1": "llama-1", "2": "llama-2"}, "--model", "llama", "--domain", getCatalog(t, base)["llama-1"].Identity.CacheSemantics)
	})
	t.Run("impl=native/no-model", func(t *testing.T) {
		run(t, "native", map[string]string{"2": "llama-2"})
	})

	t.Run("refusals", func(t *testing.T) {
		qwen := getCatalog(t, base)["qwen-1"].Identity.CacheSemantics
		for _, c := range []struct {
			args []string
			code int
			says string
		}{
			{[]string{"--grpc", addr, "--model", "mistral"}, 1, "no pool selected"},
			{[]string{"--grpc", addr, "--model", "qwen", "--dc", "2"}, 1, "--dc 2: no pool selected"},
			{[]string{"--grpc", addr, "--dc", "1"}, 1, "dc_id 1 has 2 pools; select a model"},           // no --model: a data center's only pool
			{[]string{"--grpc", addr, "--domain", qwen}, 1, "--domain picks a pool a router selecting"}, // the router could not follow it
			{[]string{"--grpc", addr, "--grpc", addr, "--model", "llama"}, 1, "given twice"},
			{[]string{"--grpc", addr, "--model", "llama", "--dc", "1", "--dc", "1"}, 2, "given twice"},
			{[]string{"--grpc", addr, "--pool", "llama-1"}, 2, "not both"},
			{[]string{"--relay", base, "--pool", "llama-1", "--model", "llama"}, 2, "go with --grpc"},
			{[]string{"--grpc", addr, "--role", "decode", "--model", "llama"}, 2, "--role"},
		} {
			cmd := exec.Command(bin, append([]string{"query", "--wait", "5s"}, c.args...)...)
			cmd.Stdin = bytes.NewReader(nil)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "%v: %s", c.args, out)
			assert.Equal(t, c.code, ee.ExitCode(), "%v: %s", c.args, out)
			assert.Contains(t, string(out), c.says, "%v", c.args)
		}
	})
}
