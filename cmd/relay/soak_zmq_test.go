package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
	"github.com/ckfrelay/ckfrelay/internal/source"
)

// zmqSoak is the ZMQ half of the soak: a pool ("z") whose bound source hears
// two emulated engines over real sockets while hostile peers attack the same
// socket (oversized frame headers, idle connections, garbage greetings, and
// batches of 5,000 distinct data-parallel ranks).
type zmqSoak struct {
	addr    string
	engines []*engine.Engine
	attacks atomic.Int64 // hostile connections made
	floods  atomic.Int64 // hostile rank batches sent
}

const zmqSoakPool = "z"

// newZMQSoak returns the pool the ZMQ half needs, bound on a free
// loopback port.
func newZMQSoak(t *testing.T) (*zmqSoak, server.PoolSpec) {
	t.Helper()
	port, err := engine.FreePorts(1)
	require.NoError(t, err)
	z := &zmqSoak{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	return z, server.PoolSpec{Name: zmqSoakPool, DCID: 2, ExpectedBlocks: 1 << 16,
		Sources: []server.SourceSpec{{Engine: "vllm", Bind: "tcp://" + z.addr, Worker: 3, BlockSize: 16}}}
}

// softHostile sends b to addr and waits (up to 6 s) for the relay to close
// the connection; it never fails the test (it runs off the test goroutine).
func softHostile(addr string, b []byte, done <-chan struct{}) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() { // the soak's end closes a connection still held
		select {
		case <-done:
		case <-finished:
		}
		c.Close()
	}()
	_, _ = c.Write(b)
	_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// rankBatch is a vLLM array batch [ts, [], data_parallel_rank]: an empty
// batch of rank dp.
func rankBatch(dp uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{0x93, 0x00, 0x90, 0xce}, dp)
}

// start runs the engines and the attackers until done closes.
func (z *zmqSoak) start(t *testing.T, base string, done <-chan struct{}, wg *sync.WaitGroup) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, _ := sourceOf(t, base, zmqSoakPool)
		return st.State == "live"
	}, 10*time.Second, 10*time.Millisecond, "the soak's ZMQ source listens")
	for dp := range uint32(2) {
		e, err := engine.Start(engine.Config{Endpoint: "tcp://" + z.addr, Connect: true, DPRank: dp, Seed: uint64(dp) + 1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Close() })
		z.engines = append(z.engines, e)
		wg.Go(func() { // a chain of 2 blocks every 5 ms; the oldest removed beyond 2,000 held
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			var held []uint64
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				bs, err := e.Store(0, 2)
				if err != nil {
					continue
				}
				held = append(held, bs[0].Hash, bs[1].Hash)
				if len(held) > 2000 {
					_ = e.Remove(held[:2]...)
					held = held[2:]
				}
			}
		})
	}

	// The engines are heard before the attack starts, so every engine batch
	// is counted under attack (the flood's ranks, 100 and up, are outside
	// the source's 0..63 and never tracked, whenever they come).
	require.Eventually(t, func() bool {
		st, _ := sourceOf(t, base, zmqSoakPool)
		_, ok0 := zmqRankOf(st, 0)
		_, ok1 := zmqRankOf(st, 1)
		return ok0 && ok1
	}, 10*time.Second, 10*time.Millisecond, "the engines are heard")

	long := func(flags byte, n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{flags}, n) }
	handshake := append(zmtpGreeting(), zmtpReady("PUB")...)
	oversized := [][]byte{
		append(zmtpGreeting(), long(0x06, 1<<40)...),
		append(append([]byte{}, handshake...), long(0x02, 1<<40)...),
		append(append([]byte{}, handshake...), long(0x03, 1<<62)...),
	}
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	wg.Go(func() { // oversized frame headers and garbage greetings, 50 a second
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			b := garbage
			if n%2 == 0 {
				b = oversized[(n/2)%len(oversized)]
			}
			softHostile(z.addr, b, done)
			z.attacks.Add(1)
		}
	})
	for i := range 64 { // idle connections, redialled when the handshake deadline closes them
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				var b []byte
				if i%4 == 0 {
					b = zmtpGreeting()[:20] // half a greeting
				}
				softHostile(z.addr, b, done)
				z.attacks.Add(1)
			}
		})
	}
	flood, err := engine.Start(engine.Config{Endpoint: "tcp://" + z.addr, Connect: true, DPRank: 99})
	require.NoError(t, err)
	t.Cleanup(func() { _ = flood.Close() })
	wg.Go(func() { // 5,000 distinct ranks (100 … 5,099), over and over, ~1 s a round
		for seq := int64(0); ; seq++ {
			for dp := uint32(100); dp < 5100; dp++ {
				select {
				case <-done:
					return
				default:
				}
				if flood.SendRaw([]byte{}, binary.BigEndian.AppendUint64(nil, uint64(seq)), rankBatch(dp)) == nil {
					z.floods.Add(1)
				}
				if dp%5 == 0 {
					time.Sleep(time.Millisecond) // pace: at most ~5,000 batches a second
				}
			}
		}
	})
}

// finish waits until each engine's last batch is applied and reports what
// was sent and applied; it checks the pool holds exactly the engines' blocks.
func (z *zmqSoak) finish(t *testing.T, base string) (sent, applied int64, st source.Status) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, e := range z.engines {
			_ = e.Heartbeat()
		}
		var blocks int
		st, blocks = sourceOf(t, base, zmqSoakPool)
		applied = 0
		want := 0
		for i, e := range z.engines {
			r, ok := zmqRankOf(st, uint32(i))
			if !ok || int64(r.Seq) != e.Seq() || r.State != "live" {
				return false
			}
			want += len(e.Truth())
		}
		return blocks == want
	}, 30*time.Second, 50*time.Millisecond, "the engines' last batches are applied and the pool holds exactly their blocks: %+v", st)
	for _, e := range z.engines {
		sent += e.Seq() + 1 // with the final heartbeats
	}
	require.Zero(t, st.Gaps, "no engine batch was lost")
	for i := range z.engines {
		r, _ := zmqRankOf(st, uint32(i))
		applied += int64(r.Seq) + 1 // gapless and live since its start: every batch up to its seq was applied
	}
	return sent, applied, st
}

func zmqRankOf(st source.Status, dp uint32) (source.RankStatus, bool) {
	for _, r := range st.Ranks {
		if r.DPRank == dp {
			return r, true
		}
	}
	return source.RankStatus{}, false
}
