package grpcserver

import (
	"io"
	"net"
	"net/http"
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
// descriptors for long nor lock RPCs out: beyond max_connections a
// connection is closed at once, a silent one after the handshake timeout,
// and a real client is served once they are gone.
func TestListener_SilentPeersAreBoundedAndClosed(t *testing.T) {
	cfg := testConfig()
	cfg.GRPC.MaxConnections = 4
	cfg.GRPC.HandshakeTimeout = server.Duration(300 * time.Millisecond)
	r := startRelay(t, cfg.WithDefaults())

	var silent []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", r.grpc)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
	}
	require.Eventually(t, func() bool { return len(r.g.connSlots) == 4 }, 5*time.Second, time.Millisecond, "4 silent connections hold every slot")
	extra, err := net.Dial("tcp", r.grpc)
	require.NoError(t, err)
	defer extra.Close()
	assert.True(t, closedWithin(extra, 2*time.Second), "a connection beyond max_connections is closed at once")
	assert.Positive(t, r.g.RefusedConnections())
	resp, err := http.Get(r.http + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^ckfrelay_grpc_connections_refused_total [1-9]`, string(metrics), "the refusal is counted on /metrics")
	assert.Regexp(t, `(?m)^ckfrelay_grpc_connections_open 4$`, string(metrics))

	for i, c := range silent {
		assert.True(t, closedWithin(c, 5*time.Second), "silent connection %d is closed after the handshake timeout", i)
	}
	info, err := r.client.GetRelayInfo(t.Context(), stamped(&kvrelaypb.RelayInfoRequest{}))
	require.NoError(t, err, "a real client is served once the silent peers are gone")
	assert.NotNil(t, info.GetRelay())
}
