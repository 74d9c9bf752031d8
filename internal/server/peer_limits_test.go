package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// TestServer_EpochCeilingBoundsRepeatedSteps: each reset within
// max_source_epoch_jump cannot, repeated, climb a member's epoch past
// producer.MaxSourceEpoch; the step past it is an error its sender sees.
func TestServer_EpochCeilingBoundsRepeatedSteps(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSourceEpochJump = 1 << 61
	s, ts := startTestServer(t, cfg)
	reset := func(epoch uint64) (int, string) {
		code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/reset", "application/json",
			fmt.Sprintf(`{"worker_id": 1, "source_epoch": %d}`, epoch))
		return code, errCode(body)
	}
	for _, e := range []uint64{1 << 61, 1 << 62} {
		code, ec := reset(e)
		require.Equal(t, http.StatusOK, code, "epoch %d: %s", e, ec)
	}
	for _, e := range []uint64{1<<62 + 1, 1<<62 + 1<<61} {
		code, ec := reset(e)
		assert.Equal(t, http.StatusBadRequest, code, "epoch %d", e)
		assert.Equal(t, CodeEpochOutOfRange, ec, "epoch %d", e)
	}
	code, body := post(t, ts.URL+"/v1/pools/dc-a/ranks/replace", "application/json",
		fmt.Sprintf(`{"ranks": [{"worker_id": 1, "source_epoch": %d, "events": []}]}`, uint64(1<<62+1)))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, CodeEpochOutOfRange, errCode(body))
	epoch, ok := s.pools["dc-a"].actor().SourceEpoch(ckf.Member{WorkerID: 1})
	require.True(t, ok)
	assert.Equal(t, uint64(producer.MaxSourceEpoch), epoch, "the refused steps changed nothing")

	// The producer refuses it too, for callers other than HTTP (sources).
	err := s.pools["dc-a"].actor().ResetRank(t.Context(), producer.MaxSourceEpoch+1, ckf.Member{WorkerID: 2}, false)
	assert.ErrorIs(t, err, producer.ErrEpochOutOfRange)
}

// TestServer_IdleConnectionsMakeRoom: at max_connections a new connection
// closes the longest-idle keep-alive connection instead of waiting behind
// it; and one client address keeps at most max_idle_per_client idle ones.
func TestServer_IdleConnectionsMakeRoom(t *testing.T) {
	// idleHealth opens a connection, GETs /healthz on it and waits until the
	// server counts it idle (want idle connections in all).
	idleHealth := func(t *testing.T, s *Server, addr string, want int) (net.Conn, *bufio.Reader) {
		c, br := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Eventually(t, func() bool { return s.listener.Load().IdleLen() == want }, 5*time.Second, time.Millisecond)
		return c, br
	}
	t.Run("at max_connections", func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxConnections = 2
		s, _, addr := serveReal(t, cfg)
		_, oldest := idleHealth(t, s, addr, 1)
		_, _ = idleHealth(t, s, addr, 2)
		_, _ = idleHealth(t, s, addr, 2) // a third is served at once ...
		_, err := oldest.ReadByte()
		assert.ErrorIs(t, err, io.EOF, "... by closing the longest-idle connection")
	})
	t.Run("per client", func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxIdlePerClient = 2
		s, _, addr := serveReal(t, cfg)
		_, oldest := idleHealth(t, s, addr, 1)
		c2, second := idleHealth(t, s, addr, 2)
		_, _ = idleHealth(t, s, addr, 2)
		_, err := oldest.ReadByte()
		assert.ErrorIs(t, err, io.EOF, "the address's longest-idle connection is closed past its bound")
		require.NoError(t, c2.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
		_, err = second.ReadByte()
		var ne net.Error
		require.ErrorAs(t, err, &ne, "the others stay open")
		assert.True(t, ne.Timeout())
	})
}
