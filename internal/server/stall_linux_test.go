package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/wire"
)

// smallWindowStream opens a stream over a socket with a 4 KiB receive
// buffer (which also turns off receive autotuning), reads its snapshot and
// returns the frame reader: the caller then reads on, or stops like a
// SIGSTOPped process whose kernel still acknowledges what fits.
func smallWindowStream(t *testing.T, addr string, consumer int) *wire.Reader {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = fmt.Fprintf(c, "GET /v1/pools/dc-a/stream?consumer=%d&lane=0&epoch=%d HTTP/1.1\r\nHost: x\r\n\r\n", consumer, time.Now().UnixNano())
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	fr := wire.NewReader(resp.Body, 0)
	var f wire.Frame
	for {
		require.NoError(t, fr.ReadFrame(&f))
		if f.Kind == wire.KindSnapshotChunk && f.Snapshot.ChunkIndex+1 == f.Snapshot.ChunkCount {
			return fr
		}
	}
}

func TestStream_StoppedSubscriberIsDropped(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval = Duration(5 * time.Millisecond)
	cfg.StreamStallTimeout = Duration(300 * time.Millisecond)
	cfg.StreamWriteTimeout = Duration(time.Minute) // not what catches it
	s, base, addr := serveReal(t, cfg)
	hub := s.pools["dc-a"].mirror()

	// A live subscriber with the same small window keeps its stream.
	live := smallWindowStream(t, addr, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		var f wire.Frame
		for ctx.Err() == nil && live.ReadFrame(&f) == nil {
		}
	}()
	require.Equal(t, 1, hub.Stats().Subscribers)

	// A subscriber that stops reading after its snapshot is dropped once
	// its window has closed and nothing moved for the stall timeout.
	_ = smallWindowStream(t, addr, 2)
	require.Equal(t, 2, hub.Stats().Subscribers)
	require.Eventually(t, func() bool { return hub.Stats().Subscribers == 1 }, 10*time.Second, 10*time.Millisecond,
		"the stopped subscriber must be dropped long before the write timeout")
	assert.Contains(t, metricsText(t, base), `ckfrelay_subscriber_stalled_total{pool="dc-a"} 1`)

	// The live one is still there, well past several stall timeouts.
	time.Sleep(4 * time.Duration(cfg.StreamStallTimeout))
	assert.Equal(t, 1, hub.Stats().Subscribers)
	cancel()
}
