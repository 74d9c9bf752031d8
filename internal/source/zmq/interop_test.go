package zmq

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
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

const debianPython = "/usr/bin/python3"

// TestInterop_PythonPublisher runs testdata/engine_pub.py, a publisher that
// writes the engine wire format from its own reading of it (pyzmq +
// msgpack, no code shared with the relay), including a batch lost on the
// wire that only its replay socket holds, in both batch forms and both event
// forms, with namespaces, multimodal extra_keys, a hybrid model's other
// group, Eagle bigrams and an unknown medium, and checks the pool holds
// exactly the GPU blocks the script says it holds, under the keys the
// script's own model gives them (namespace, mm hashes, token windows).
func TestInterop_PythonPublisher(t *testing.T) {
	if _, err := os.Stat(debianPython); err != nil {
		t.Skip("interop needs Debian's /usr/bin/python3 with python3-zmq and python3-msgpack (apt-get install -y python3 python3-zmq python3-msgpack)")
	}
	if err := exec.Command(debianPython, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("interop needs python3-zmq and python3-msgpack for /usr/bin/python3 (apt-get install -y python3-zmq python3-msgpack)")
	}
	for _, c := range []struct{ form, layout, batch, hash string }{
		{"array", "old", "array", "standard"}, {"map", "new", "array", "standard"}, {"array", "new", "map", "standard"},
		{"map", "old", "map", "standard"}, {"array", "new", "array", "eagle"}, {"map", "new", "map", "eagle"},
	} {
		t.Run(c.form+"_"+c.layout+"_batch_"+c.batch+"_"+c.hash, func(t *testing.T) { runPythonPublisher(t, c.form, c.layout, c.batch, c.hash) })
	}
}

// runPythonPublisher runs one variant; hash is the pool's hash format
// (standard: the publisher's one Eagle chain is dropped; eagle: every chain
// is Eagle and kept).
func runPythonPublisher(t *testing.T, form, layout, batch, hash string) {
	pub, rep := endpoint(t, 1)
	const blockSize = 4
	eagle := hash == "eagle"
	cmd := exec.Command(debianPython, "testdata/engine_pub.py", pub, rep, strconv.Itoa(blockSize), form, layout, batch, hash)
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
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 1<<20)
	readLine := func() string {
		require.True(t, lines.Scan(), "publisher exited: %v", lines.Err())
		return lines.Text()
	}
	require.Equal(t, "ready", readLine())

	hs := newHarness(t, Config{Endpoint: pub, Replay: rep, Topic: "kv-events", Worker: 11, BlockSize: blockSize, Eagle: eagle})
	waitLive := func(seq int64) {
		require.Eventually(t, func() bool {
			r, ok := rankOf(hs.src.Status(), 0)
			return ok && int64(r.Seq) >= seq && r.State == RankLive
		}, 10*time.Second, 2*time.Millisecond)
	}
	waitLive(0)
	fmt.Fprintln(stdin, "go")
	done := strings.Fields(readLine())
	require.Equal(t, "done", done[0])
	last, err := strconv.ParseInt(done[1], 10, 64)
	require.NoError(t, err)
	waitLive(last) // past the scenario, by the heartbeats that follow it
	fmt.Fprintln(stdin, "truth")
	var held map[string]struct {
		Parent *uint64
		Tokens []uint32
		Lora   *string
		NS     *string
		MM     []uint64
	}
	require.NoError(t, json.Unmarshal([]byte(readLine()), &held))
	st := hs.src.Status()
	hs.stop()

	assert.GreaterOrEqual(t, st.Gaps, uint64(1), "the lost batch is a gap")
	assert.GreaterOrEqual(t, st.Replays, uint64(1))
	assert.Positive(t, st.Dropped, "the block of another size is dropped")
	assert.Zero(t, st.Rejected)
	// The expected state, computed from what the script says it holds.
	truth := map[uint64]engine.Block{}
	var canon func(h uint64) uint64
	canon = func(h uint64) uint64 {
		b := held[strconv.FormatUint(h, 10)]
		lora := ""
		if b.Lora != nil {
			lora = *b.Lora
		}
		ns := ""
		if b.NS != nil {
			ns = *b.NS
		}
		local := ckf.LocalBlockHashMM(b.Tokens, b.MM, ckf.Salt(lora, ns))
		if b.Parent == nil {
			return local
		}
		return ckf.ChainHash(canon(*b.Parent), local)
	}
	for k := range held {
		h, err := strconv.ParseUint(k, 10, 64)
		require.NoError(t, err)
		truth[h] = engine.Block{Hash: h, Canonical: canon(h)}
	}
	want := 3 + 2 - 1 + 2 + 1 + 2 + 1 + 2
	if eagle {
		want += 2 // the Eagle chain, dropped by a standard pool
	} else {
		assert.Positive(t, st.DroppedByReason[string(DropHashFormat)], "the Eagle chain into a standard pool")
	}
	require.Len(t, truth, want)
	for _, why := range []DropReason{DropBlockSize, DropKind, DropGroup, DropMedium} {
		assert.Positive(t, st.DroppedByReason[string(why)], why)
	}
	requireExact(t, hs.pool, ckf.Member{WorkerID: 11}, truth)
}
