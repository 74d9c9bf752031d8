package grpcserver

import (
	"io"
	"net"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// closedWithin reports whether the server closes c within d (a read ends in
// EOF or a reset rather than the read deadline).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 256)
	for {
		if _, err := c.Read(buf); err != nil {
			ne, ok := err.(net.Error)
			return !ok || !ne.Timeout()
		}
	}
}

// Peers that connect and say nothing neither hold the listener's
// descriptors for long nor lock RPCs out: at max_connections a new
// connection closes the longest-idle one, a silent one is closed after the
// handshake timeout, and a real client is served.
//
// Each half has a relay of its own: the eviction is checked with the
// handshake timeout out of reach (with a 2 s one, a scheduler delay of 2 s
// after the connections were counted let it close them all, and the count
// never read 4 again; it could also close silent[0] in the eviction's place).
func TestListener_SilentPeersAreBoundedAndClosed(t *testing.T) {
	relay := func(handshake time.Duration) *testRelay {
		cfg := testConfig()
		cfg.GRPC.MaxConnections = 4
		cfg.GRPC.HandshakeTimeout = server.Duration(handshake)
		return startRelay(t, cfg.WithDefaults())
	}
	silentPeers := func(r *testRelay) []net.Conn {
		var silent []net.Conn
		for range 4 {
			c, err := net.Dial("tcp", r.grpc)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			silent = append(silent, c)
		}
		require.Eventually(t, func() bool { return r.g.openConnections() == 4 }, 5*time.Second, time.Millisecond, "4 silent connections hold every slot")
		return silent
	}

	r := relay(time.Hour)
	silent := silentPeers(r)
	extra, err := net.Dial("tcp", r.grpc)
	require.NoError(t, err)
	defer extra.Close()
	assert.True(t, closedWithin(silent[0], 5*time.Second), "a connection beyond max_connections closes the longest-idle one")
	assert.Eventually(t, func() bool {
		resp, err := http.Get(r.http + "/metrics")
		require.NoError(t, err)
		metrics, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		return regexp.MustCompile(`(?m)^ckfrelay_grpc_connections_open 4$`).Match(metrics)
	}, 5*time.Second, time.Millisecond, "the newcomer took the evicted connection's slot")

	r = relay(2 * time.Second)
	for i, c := range silentPeers(r) {
		assert.True(t, closedWithin(c, 5*time.Second), "silent connection %d is closed after the handshake timeout", i)
	}
	info, err := r.client.GetRelayInfo(t.Context(), stamped(&kvrelaypb.RelayInfoRequest{}))
	require.NoError(t, err, "a real client is served once the silent peers are gone")
	assert.NotNil(t, info.GetRelay())
}
