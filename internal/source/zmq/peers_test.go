package zmq

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawPeer connects to the bound source at ep from local address from and
// sends a valid ZMTP 3 NULL handshake as a PUB; it publishes nothing. It
// returns the connection and whether the source accepted it: its greeting
// arrived (the source sends it once the connection holds a peer slot), not
// a close.
func rawPeer(t *testing.T, ep, from string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	var c net.Conn
	require.Eventually(t, func() bool { // the source binds as it starts
		var err error
		c, err = d.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	t.Cleanup(func() { c.Close() })
	_, err := c.Write(append(ourGreeting[:], frame(flagCommand, readyBody("Socket-Type", "PUB"))...))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.ReadFull(c, make([]byte, greetingLen))
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	return c, err == nil
}

// publish sends one engine batch with one BlockStored event (block hash h,
// 16 tokens) under sequence seq.
func publish(t *testing.T, c net.Conn, seq int64, h uint64) {
	t.Helper()
	toks := make([]uint32, 16)
	for i := range toks {
		toks[i] = uint32(h)*16 + uint32(i)
	}
	ev := []any{"BlockStored", []any{h}, nil, toks, 16, nil, "GPU"}
	payload := mp(t, []any{float64(time.Now().Unix()), []any{ev}, 0})
	var msg []byte
	msg = append(msg, frame(flagMore, []byte("kv"))...)
	msg = append(msg, frame(flagMore, binary.BigEndian.AppendUint64(nil, uint64(seq)))...)
	msg = append(msg, frame(0, payload)...)
	_, err := c.Write(msg)
	require.NoError(t, err)
}

// waitBatches waits until the source has admitted n batches.
func waitBatches(t *testing.T, hs *harness, n uint64, why string) {
	t.Helper()
	require.Eventually(t, func() bool { return uint64(hs.src.Status().Batches) >= n }, 10*time.Second, 10*time.Millisecond,
		"%s (status %+v)", why, hs.src.Status())
}

// Peers that complete their handshake and never publish hold max_peers
// slots; a newcomer closes the longest-idle of them, so an engine still
// gets in (the red-team lock-out: 1,024 such peers kept every engine out).
func TestBind_IdlePeersDoNotLockEnginesOut(t *testing.T) {
	bind, _ := endpoint(t, 1)
	hs := newHarness(t, Config{Bind: bind, Worker: 1, MaxPeers: 4, MaxPeersPerClient: 4})
	for range 4 {
		_, ok := rawPeer(t, bind, "127.0.0.1")
		require.True(t, ok, "an idle peer within max_peers is accepted")
	}
	engine, ok := rawPeer(t, bind, "127.0.0.2")
	require.True(t, ok, "the engine is accepted: it closes the longest-idle peer")
	publish(t, engine, 0, 0xbeef)
	waitBatches(t, hs, 1, "the engine's batch is admitted although max_peers idle peers were connected first")
	assert.Positive(t, uint64(hs.src.Status().PeersRefused), "the evicted idle peer is counted")
	// The engine has published: it is no longer idle, so newcomers evict
	// the idle peers, never it.
	for range 4 {
		_, ok := rawPeer(t, bind, "127.0.0.1")
		require.True(t, ok)
	}
	publish(t, engine, 1, 0xbef0)
	waitBatches(t, hs, 2, "the publishing engine outlives newcomers")
}

// One client address holds at most max_peers_per_client peers, publishing
// or not: the others' engines keep their share.
func TestBind_OneAddressHoldsItsShareOfPeers(t *testing.T) {
	bind, _ := endpoint(t, 1)
	hs := newHarness(t, Config{Bind: bind, Worker: 1, MaxPeers: 4, MaxPeersPerClient: 2})
	// Two publishing peers from one address fill its share (neither is idle).
	for i := range 2 {
		c, ok := rawPeer(t, bind, "127.0.0.1")
		require.True(t, ok)
		publish(t, c, int64(i), uint64(0x100+i))
		waitBatches(t, hs, uint64(i+1), "a peer within its address's share publishes")
	}
	for range 2 {
		_, ok := rawPeer(t, bind, "127.0.0.1")
		assert.False(t, ok, "a peer past its address's share, with none of the address's peers idle, is closed")
	}
	engine, ok := rawPeer(t, bind, "127.0.0.2")
	require.True(t, ok)
	publish(t, engine, 2, 0xbeef)
	waitBatches(t, hs, 3, "another address's engine gets in")
}

func TestConfig_PeersPerClientWithinMaxPeers(t *testing.T) {
	base := Config{Bind: "tcp://127.0.0.1:1", BlockSize: 16}
	for _, c := range []struct{ peers, per int }{{4, 5}, {0, DefaultMaxPeers + 1}, {4, -1}} {
		cfg := base
		cfg.MaxPeers, cfg.MaxPeersPerClient = c.peers, c.per
		assert.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "max_peers %d, per client %d", c.peers, c.per)
	}
	cfg := base
	cfg.MaxPeers, cfg.MaxPeersPerClient = 4, 4
	assert.NoError(t, cfg.Validate())
	assert.Equal(t, DefaultMaxPeers/4, base.withDefaults().MaxPeersPerClient, "default: a quarter of max_peers")
}

// deadlineFails is a connection whose SetDeadline fails from its n-th
// call on, as a connection closed under the handshake does.
type deadlineFails struct {
	net.Conn
	n int
}

func (c *deadlineFails) SetDeadline(t time.Time) error {
	if c.n--; c.n <= 0 {
		return net.ErrClosed
	}
	return c.Conn.SetDeadline(t)
}

// A connection closed (evicted for a newcomer) just as its handshake
// completes is a failed handshake: before, handshake returned a nil
// connection and a nil error, and the bound source's accept path
// dereferenced it (a crash the red-team repro hit under eviction).
func TestHandshake_ClosedAtTheEndIsAnError(t *testing.T) {
	ours, theirs := net.Pipe()
	defer theirs.Close()
	go func() {
		_, _ = io.ReadFull(theirs, make([]byte, greetingLen))
		_, _ = theirs.Write(append(ourGreeting[:], frame(flagCommand, readyBody("Socket-Type", "PUB"))...))
	}()
	g := guardOf(t.Context())
	zc, err := handshake(t.Context(), &deadlineFails{Conn: ours, n: 2}, g)
	require.Error(t, err)
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.Nil(t, zc)
}
