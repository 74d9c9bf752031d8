package client

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// TestGRPC_QuietDynamoPoolKeepsItsLane: against a pool whose only traffic is
// heartbeats at Dynamo's default interval, a lane stays up without a
// resubscribe. The interval and the router's default idle bound are scaled
// down together (by 1/20), so the test takes seconds.
func TestGRPC_QuietDynamoPoolKeepsItsLane(t *testing.T) {
	const scale = 20
	probe, err := New(Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{"x"}}}, Targets: []Target{{Pool: "p"}}}, newNative(t))
	require.NoError(t, err)
	idle, every := probe.cfg.IdleTimeout/scale, DynamoHeartbeat/scale

	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, func(c *Config) { c.IdleTimeout = idle })
	s := f.next(t)
	f.sendSnapshot(t, s, testID, 3, randomWords(rand.New(rand.NewPCG(1, 2)), testFormat.BucketCount), 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range 10 {
		<-tick.C
		s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_HEARTBEAT, 3, 3, nil))
	}
	li := r.Lane(0)
	assert.True(t, li.Ready, "%+v", li)
	assert.Zero(t, li.Resubscribes, "a quiet pool is not resubscribed: %+v", li)
	assert.GreaterOrEqual(t, probe.cfg.IdleTimeout, 3*DynamoHeartbeat, "the default idle bound is well past Dynamo's heartbeat")
}

// blackhole is a TCP proxy whose cut makes its open connections silent
// (bytes read and dropped both ways, nothing closed): a relay whose
// network path died without a FIN or RST. New connections forward again.
type blackhole struct {
	ln  net.Listener
	mu  sync.Mutex
	cut []*atomic.Bool
}

func startBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackhole{ln: ln}
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			dead := &atomic.Bool{}
			b.mu.Lock()
			b.cut = append(b.cut, dead)
			b.mu.Unlock()
			cmu.Lock()
			conns = append(conns, c, up)
			cmu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						return
					}
					if !dead.Load() {
						if _, err := dst.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return b
}

// silence makes every connection open now silent.
func (b *blackhole) silence() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.cut {
		d.Store(true)
	}
}

// TestGRPC_KeepaliveNoticesADeadConnection: a relay connection that dies
// silently is noticed by keepalive within KeepaliveTime + KeepaliveTimeout
// (the idle bound is far longer here), and the lane reopens on a new
// connection.
func TestGRPC_KeepaliveNoticesADeadConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("waits gRPC's 10 s minimum keepalive time")
	}
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	bh := startBlackhole(t, addr)
	const ka, kaTimeout = 10 * time.Second, time.Second
	r, _ := startGRPCRouter(t, bh.ln.Addr().String(), func(c *Config) {
		c.IdleTimeout = 10 * time.Minute
		c.GRPC.KeepaliveTime, c.GRPC.KeepaliveTimeout = ka, kaTimeout
	})
	s := f.next(t)
	f.sendSnapshot(t, s, testID, 3, randomWords(rand.New(rand.NewPCG(1, 2)), testFormat.BucketCount), 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	bh.silence()
	start := time.Now()
	require.Eventually(t, func() bool { return r.Lane(0).Resubscribes > 0 }, ka+kaTimeout+10*time.Second, 10*time.Millisecond)
	took := time.Since(start)
	t.Logf("dead connection noticed after %v (bound %v)", took, ka+kaTimeout)
	assert.LessOrEqual(t, took, ka+kaTimeout+2*time.Second)
	assert.Contains(t, r.Lane(0).LastError, "keepalive")
	f.next(t) // the lane subscribes again on a new connection
}
