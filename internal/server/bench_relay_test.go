package server_test

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/stretchr/testify/require"
)

// benchRelay is a relay serving on a loopback port for a benchmark, with its
// completed config, the manifest of a consumer following pool 0 on lane 0,
// and a WaitGroup for the benchmark's stream readers.
type benchRelay struct {
	srv *server.Server
	cfg server.Config
	url string // http://host:port
	m   consumer.Manifest
	wg  sync.WaitGroup
}

// startBenchRelay starts a relay for cfg logging to log (nil: the
// default logger). stop shuts it down (bounded by 10 s) and waits for every
// reader registered in wg, whose streams end with the shutdown.
func startBenchRelay(b *testing.B, cfg server.Config, log *slog.Logger) *benchRelay {
	b.Helper()
	srv, err := server.New(cfg, log)
	require.NoError(b, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go func() { _ = srv.Serve(ln) }()
	r := &benchRelay{srv: srv, cfg: srv.Config(), url: "http://" + ln.Addr().String()}
	format, err := r.cfg.Pools[0].Format()
	require.NoError(b, err)
	r.m = consumer.Manifest{ConsumerInstance: 100, Domain: r.cfg.Domain(), Format: format, VerificationWindow: 2}
	r.m.Lanes[0] = &ckf.PoolID{Domain: r.cfg.Domain(), DCID: r.cfg.Pools[0].DCID}
	return r
}

// stop shuts the relay down and waits for the readers.
func (r *benchRelay) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
	r.wg.Wait()
}
