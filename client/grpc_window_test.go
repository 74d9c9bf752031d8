package client

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
)

// recordingListener keeps every byte its one connection reads: the
// client's HTTP/2 frames.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns int
	in    bytes.Buffer
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns++
	l.mu.Unlock()
	return &recordingConn{Conn: c, l: l}, nil
}

type recordingConn struct {
	net.Conn
	l *recordingListener
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.l.mu.Lock()
	c.l.in.Write(b[:n])
	c.l.mu.Unlock()
	return n, err
}

// frames returns the client's PING frames (not acks) and the initial
// window its SETTINGS announced (0: none).
func (l *recordingListener) frames(t *testing.T) (pings int, window uint32) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Equal(t, 1, l.conns, "one connection per relay")
	raw := l.in.Bytes()
	require.True(t, bytes.HasPrefix(raw, []byte(http2.ClientPreface)), "HTTP/2 client preface")
	fr := http2.NewFramer(io.Discard, bytes.NewReader(raw[len(http2.ClientPreface):]))
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return pings, window
		}
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.PingFrame:
			if !f.IsAck() {
				pings++
			}
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok && !f.IsAck() {
				window = v
			}
		}
	}
}

// TestGRPC_FixedReceiveWindowSendsNoPings: a router's relay connection
// announces a fixed 4 MiB stream window, which switches off grpc-go's BDP
// estimator, so sparse deltas cost no PING (and ack) each: the client
// sends no PING at all within the keepalive time.
func TestGRPC_FixedReceiveWindowSendsNoPings(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rec := &recordingListener{Listener: ln}
	f, addr := startFakeKVOn(t, rec)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	s := f.next(t)
	rng := rand.New(rand.NewPCG(9, 10))
	words := randomWords(rng, testFormat.BucketCount)
	f.sendSnapshot(t, s, testID, 1, words, 64)
	for seq := uint64(1); seq < 11; seq++ {
		f.sendDelta(t, s, testID, seq, words, rng)
		require.Eventually(t, func() bool { _, at := laneWords(t, r); return at == seq+1 }, 5*time.Second, time.Millisecond)
	}
	pings, window := rec.frames(t)
	assert.Equal(t, uint32(receiveWindowBytes), window, "SETTINGS_INITIAL_WINDOW_SIZE")
	assert.Zero(t, pings, "PING frames from the router (BDP estimation) over 10 sparse deltas")
}
