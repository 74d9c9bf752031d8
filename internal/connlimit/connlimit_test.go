package connlimit

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serve runs l's accept loop and hands accepted connections to the test.
func serve(t *testing.T, cfg Config) (*Listener, string, <-chan *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := New(ln, cfg)
	accepted := make(chan *Conn, 1024)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*Conn)
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l, ln.Addr().String(), accepted
}

// dial connects from ip and waits until the listener has accepted it.
func dial(t *testing.T, addr, ip string, accepted <-chan *Conn) (net.Conn, *Conn) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	select {
	case sc := <-accepted:
		return c, sc
	case <-time.After(5 * time.Second):
		require.FailNow(t, "not accepted")
		return nil, nil
	}
}

// closed reports whether the peer's side of c is closed within d.
func closed(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return err != nil && !(ok && ne.Timeout())
}

func TestListener_BusyWithinClosesConnectionsThatNeverTurnBusy(t *testing.T) {
	l, addr, accepted := serve(t, Config{MaxConns: 4, MaxIdlePerClient: 4, BusyWithin: 200 * time.Millisecond})
	lazy, _ := dial(t, addr, "127.0.0.1", accepted)
	worker, sc := dial(t, addr, "127.0.0.1", accepted)
	l.SetIdle(sc, false)
	l.SetIdle(sc, true) // busy once is enough
	assert.True(t, closed(lazy, 2*time.Second), "never busy: closed at the deadline")
	assert.False(t, closed(worker, 500*time.Millisecond), "busy once: kept")
	assert.Same(t, sc, l.Lookup(sc.RemoteAddr(), sc.LocalAddr()))
	assert.Equal(t, 1, l.Open())
}

func TestListener_MaxPerClient(t *testing.T) {
	var refused atomic.Int64
	l, addr, accepted := serve(t, Config{MaxConns: 8, MaxIdlePerClient: 8, MaxPerClient: 2, RefuseWhenBusy: true,
		OnRefused: func() { refused.Add(1) }})
	a1, _ := dial(t, addr, "127.0.0.2", accepted)
	_, s2 := dial(t, addr, "127.0.0.2", accepted)
	l.SetIdle(s2, false)
	_, s3 := dial(t, addr, "127.0.0.2", accepted) // closes s1, the address's idle one
	assert.True(t, closed(a1, 2*time.Second))
	l.SetIdle(s3, false)
	third, err := net.DialTCP("tcp", &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, l.Addr().(*net.TCPAddr))
	require.NoError(t, err)
	defer third.Close()
	assert.True(t, closed(third, 2*time.Second), "all of the address's connections busy: the new one is refused")
	assert.Equal(t, int64(1), refused.Load())
	_, _ = dial(t, addr, "127.0.0.1", accepted) // another address is served
	assert.Equal(t, 3, l.Open())
}

// TestListener_hammer: connections accepted, marked busy and idle, evicted
// and closed from many goroutines at once; the slots always add up.
func TestListener_hammer(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) / 2)
	const clients, rounds, max = 8, 50, 6
	l, addr, accepted := serve(t, Config{MaxConns: max, MaxIdlePerClient: 3, MaxPerClient: 5, RefuseWhenBusy: true})
	go func() {
		for c := range accepted {
			go func() {
				for i := range 3 {
					l.SetIdle(c, i%2 == 0)
				}
				_ = c.Close()
			}()
		}
	}()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range rounds {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				_, _ = c.Read(make([]byte, 1))
				_ = c.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Eventually(t, func() bool { return l.Open() == 0 && l.IdleLen() == 0 }, 5*time.Second, time.Millisecond,
		"every slot and idle entry given back: open %d idle %d", l.Open(), l.IdleLen())
	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Empty(t, l.conns)
	assert.Empty(t, l.open)
	assert.Empty(t, l.byAddr)
}

func TestListener_OnEvictedCountsConnectionsClosedForRoom(t *testing.T) {
	var evicted atomic.Int64
	_, addr, accepted := serve(t, Config{MaxConns: 2, MaxIdlePerClient: 2, RefuseWhenBusy: true,
		OnEvicted: func() { evicted.Add(1) }})
	first, _ := dial(t, addr, "127.0.0.1", accepted)
	dial(t, addr, "127.0.0.1", accepted)
	dial(t, addr, "127.0.0.2", accepted) // closes first, the longest idle
	assert.True(t, closed(first, 2*time.Second))
	assert.Equal(t, int64(1), evicted.Load())
}

func TestClient_IsTheHost(t *testing.T) {
	assert.Equal(t, "10.0.0.1", Client("10.0.0.1:443"))
	assert.Equal(t, "::1", Client("[::1]:80"))
	assert.Equal(t, "pipe", Client("pipe"))
}
