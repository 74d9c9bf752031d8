package zmq

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// hostileReplay is a replay (ROUTER) socket at ep that answers each request
// with what serve sends; the request's start sequence is passed in.
func hostileReplay(t *testing.T, ep string, serve func(send func(seq int64, payload []byte) error, start int64)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := zmq4.NewRouter(ctx, zmq4.WithLogger(zmqLogger))
	require.NoError(t, r.Listen(ep))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := r.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
				continue
			}
			id := m.Frames[0]
			serve(func(seq int64, payload []byte) error {
				return r.SendMulti(zmq4.NewMsgFrom(id, []byte{}, binary.BigEndian.AppendUint64(nil, uint64(seq)), payload))
			}, int64(binary.BigEndian.Uint64(m.Frames[2])))
		}
	}()
	t.Cleanup(func() { cancel(); _ = r.Close(); <-done })
}

// TestSource_ReplayStopsAtTheGapEnd: a replay socket that sends the batches
// of the gap and then goes quiet (no end marker: it could as well go on
// sending the rest of its buffer) fills the gap at once. The source stops
// reading once [from, gap end) is covered instead of waiting for the end
// marker until the replay timeout and resetting the rank degraded.
func TestSource_ReplayStopsAtTheGapEnd(t *testing.T) {
	pub, rep := endpoint(t, 1)
	_, proxy := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub, Replay: rep})
	// The proxy relays the engine's replay replies, but never its marker.
	hostileReplay(t, proxy, func(send func(int64, []byte) error, start int64) {
		got, err := Replay(context.Background(), rep, start, 1<<62, ReplayLimits{Timeout: time.Second, MaxBatches: 1000})
		if err != nil {
			return
		}
		for _, m := range got {
			if send(m.Seq, m.Payload) != nil {
				return
			}
		}
	})
	hs := newHarness(t, Config{Endpoint: pub, Replay: proxy, Worker: 1, ReplayTimeout: 5 * time.Second})
	hs.publishUntilSeen(e, 0)
	e.DropNext(3)
	storeSome(t, e) // 4 batches, the first 3 lost
	start := time.Now()
	r := hs.publishUntilSeen(e, 0)
	st := hs.src.Status()
	assert.EqualValues(t, 1, st.Gaps)
	assert.Zero(t, st.Degraded, "the gap was filled")
	assert.Equal(t, RankLive, r.State)
	assert.Less(t, time.Since(start), 4*time.Second, "no wait for the end marker")
}

// vmHWM is this process's peak resident set (bytes), from /proc.
func vmHWM(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("needs /proc")
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmHWM")
	return 0
}

// TestSource_ReplayBytesAreBounded: a replay socket answering with 40
// replies of 15 MiB (600 MiB) costs the source at most its replay byte
// budget (64 MiB by default) plus the transport's read-ahead, not the
// 600 MiB: the replay fails past the budget and the rank is reset degraded.
// The test's own peak resident set is the measure (the source joins
// mid-stream and replays once, then replays the gap).
func TestSource_ReplayBytesAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 600 MiB over loopback")
	}
	before := vmHWM(t)
	pub, _ := endpoint(t, 1)
	_, hostile := endpoint(t, 1)
	e := startEngine(t, engine.Config{Endpoint: pub})
	big := make([]byte, 15<<20)
	hostileReplay(t, hostile, func(send func(int64, []byte) error, start int64) {
		for i := range int64(40) {
			if send(start+i, big) != nil {
				return
			}
		}
		_ = send(EndOfReplay, nil)
	})
	hs := newHarness(t, Config{Endpoint: pub, Replay: hostile, Worker: 1, ReplayTimeout: 10 * time.Second})
	hs.publishUntilSeen(e, 0) // joining mid-stream asks the hostile socket too
	base := hs.src.Status().Degraded
	e.DropNext(50)
	for range 51 {
		require.NoError(t, e.Heartbeat())
	}
	r := hs.publishUntilSeen(e, 0)
	grew := vmHWM(t) - before
	t.Logf("peak RSS grew by %d MiB over two replays of 40 × 15 MiB replies", grew>>20)
	st := hs.src.Status()
	assert.EqualValues(t, base+1, st.Degraded, "the replay failed: the rank was reset degraded")
	assert.Equal(t, RankDegraded, r.State)
	assert.Less(t, grew, int64(400<<20), fmt.Sprintf("peak RSS grew by %d MiB", grew>>20))
}
