package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

const debianPython = "/usr/bin/python3"

// needPyzmq skips a test without Debian's python3-zmq and python3-msgpack.
func needPyzmq(t *testing.T) {
	t.Helper()
	if err := exec.Command(debianPython, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("needs /usr/bin/python3 with python3-zmq and python3-msgpack (apt-get install -y python3-zmq python3-msgpack)")
	}
}

// startPyzmqEngine runs testdata/pyzmq_engine.py: a pyzmq PUB that connects
// to ep and publishes one fresh block per batch every interval.
func startPyzmqEngine(t *testing.T, ep string, interval time.Duration, limit int) {
	t.Helper()
	cmd := exec.Command(debianPython, "testdata/pyzmq_engine.py", ep, "16", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), strconv.Itoa(limit))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan(), "engine exited")
	require.Equal(t, "ready", sc.Text())
}

// zmtpGreeting is a ZMTP 3.0 NULL greeting (rfc.zeromq.org/spec:23).
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// zmtpReady is a READY command frame from a socket of type typ.
func zmtpReady(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// hostile sends b to addr and waits (up to 5 s) for the relay to close.
func hostile(t *testing.T, addr string, b []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, _ = c.Write(b)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// waitListening waits for pool dc-a's bound source to listen.
func waitListening(t *testing.T, base string) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, _ := sourceOf(t, base, "dc-a")
		return st.State == "live"
	}, 10*time.Second, 10*time.Millisecond, "the source listens")
}

// openFDs counts the relay process's open descriptors.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(es)
}

// A peer announcing a frame of 2^40 or 2^62 bytes (before or after a
// complete handshake) is dropped and counted; the relay neither crashes nor
// allocates, and an engine connected beside it keeps delivering.
func TestE2E_ZMQOversizedFrameIsRefused(t *testing.T) {
	port, err := engine.FreePorts(1)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536",
		"--source", fmt.Sprintf("dc-a:engine=vllm,bind=tcp://%s,worker=3,block_size=16", addr))
	e, err := engine.Start(engine.Config{Endpoint: "tcp://" + addr, Connect: true})
	require.NoError(t, err)
	defer e.Close()
	stored := 0
	store := func(want int) {
		t.Helper()
		require.Eventually(t, func() bool {
			if _, err := e.Store(0, 1); err == nil {
				stored++
			}
			_, blocks := sourceOf(t, rl.base, "dc-a")
			return blocks >= want
		}, 20*time.Second, 20*time.Millisecond)
	}
	store(1)

	long := func(flags byte, n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{flags}, n) }
	handshake := append(zmtpGreeting(), zmtpReady("PUB")...)
	attacks := [][]byte{
		append(zmtpGreeting(), long(0x06, 1<<40)...),                 // the handshake command itself
		append(zmtpGreeting(), long(0x06, 1<<62)...),                 //
		append(append([]byte{}, handshake...), long(0x02, 1<<40)...), // a data frame after a handshake
		append(append([]byte{}, handshake...), long(0x03, 1<<62)...), //
		append(append([]byte{}, handshake...), long(0x03, 1<<63)...), // above zmq4's own overflow check
	}
	for _, a := range attacks {
		hostile(t, addr, a)
	}
	require.Eventually(t, func() bool {
		st, _ := sourceOf(t, rl.base, "dc-a")
		return uint64(st.PeersRefused) >= uint64(len(attacks))
	}, 10*time.Second, 20*time.Millisecond, "every hostile peer is counted")
	select {
	case <-rl.exited:
		require.FailNow(t, "the relay died", "%v", rl.err)
	default:
	}
	_, before := sourceOf(t, rl.base, "dc-a")
	store(before + 3)
	require.GreaterOrEqual(t, metricValue(t, rl.base, `ckfrelay_source_peers_refused_total{engine="vllm",pool="dc-a",source="vllm@bind:tcp://`+addr+`"}`), float64(len(attacks)))
}

// Idle and half-open connections to a bound source neither lock a real
// pyzmq engine out nor leak descriptors: their handshakes run beside the
// engine's, under a deadline, and failed ones are closed.
func TestE2E_ZMQIdleConnectionsDoNotLockEnginesOut(t *testing.T) {
	needPyzmq(t)
	port, err := engine.FreePorts(1)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "dc-a:dc=1,expected=65536",
		"--source", fmt.Sprintf("dc-a:engine=vllm,bind=tcp://%s,worker=3,block_size=16", addr))
	pid := rl.cmd.Process.Pid
	waitListening(t, rl.base)
	baseline := openFDs(t, pid)

	// 40 idle connections and 10 that stop half-way through the greeting,
	// all held open while the engine publishes.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 50 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		if i%5 == 0 {
			_, _ = c.Write(zmtpGreeting()[:20])
		}
		held = append(held, c)
	}
	startPyzmqEngine(t, "tcp://"+addr, 10*time.Millisecond, 3000)
	require.Eventually(t, func() bool {
		_, blocks := sourceOf(t, rl.base, "dc-a")
		return blocks >= 20
	}, 4*time.Second, 20*time.Millisecond, "the engine's batches arrive while 50 idle connections are held")

	// 300 garbage greetings: each is refused and its descriptor closed.
	garbage := make([]byte, 64)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	for range 300 {
		hostile(t, addr, garbage)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	require.Eventually(t, func() bool {
		st, _ := sourceOf(t, rl.base, "dc-a")
		return uint64(st.PeersRefused) >= 300+50
	}, 15*time.Second, 50*time.Millisecond, "garbage and idle peers are counted")
	// The engine's connection (and its fd) remains; nothing else does.
	require.Eventually(t, func() bool { return openFDs(t, pid) <= baseline+3 }, 10*time.Second, 50*time.Millisecond,
		"descriptors: baseline %d, now %d", baseline, openFDs(t, pid))
}
