package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/connlimit"
	"github.com/ckfrelay/ckfrelay/internal/persist"
)

// Server hosts the configured pools behind the HTTP API. Create it with
// [New], run it with [Server.Serve], stop it with [Server.Shutdown].
type Server struct {
	cfg         Config
	log         *slog.Logger
	m           *metrics
	pools       map[string]*hostedPool
	store       *persist.Store // nil without a data dir
	order       []*hostedPool  // configuration order, for the catalog
	incarnation uint64
	http        *http.Server
	stopping    atomic.Bool
	ingestSlots chan struct{} // a token per ingest request in progress
	ingestMu    sync.Mutex
	ingestBy    map[string]int // ingest slots held per client address; ≤ MaxConcurrentIngest entries
	nats        *natsOut       // nil unless cfg.NATS.URL is set
	sources     *poolSources   // engine sources (sources.go)
	listener    atomic.Pointer[connlimit.Listener]
	ha          *haGroup // nil unless cfg.HA.NATSURL is set
	haOnce      sync.Once
	haErr       error
}

// New validates cfg (after applying defaults), starts every pool's actor and
// hub, and returns the server. The producer incarnation is the start time in
// nanoseconds, so a restarted relay publishes a new identity and consumers
// re-snapshot.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	cfg, err := cfg.ResolveAuthToken()
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log, m: newMetrics(), pools: map[string]*hostedPool{},
		incarnation: uint64(time.Now().UnixNano()), ingestSlots: make(chan struct{}, cfg.MaxConcurrentIngest), ingestBy: map[string]int{}}
	var tlsConfig *tls.Config
	if cfg.TLSCertFile != "" {
		// Load the key pair now: a bad path or key fails New, before the
		// caller announces that it is listening.
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("server: tls: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if cfg.DataDir != "" {
		st, err := persist.OpenWith(cfg.DataDir, persist.StoreOptions{Logger: log, ReserveBytes: cfg.DataDirReserveBytes})
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		s.store = st
	}
	if cfg.HA.Enabled() {
		if s.ha, err = openHA(cfg.HA); err != nil {
			return nil, err
		}
		if ttl := s.ha.leases.TTL(); ttl != time.Duration(cfg.HA.LeaseTTL) {
			// The group's lease bucket was made with another TTL: it is
			// the one NATS expires keys by, so it is the lease.
			s.log.Warn("ha: the lease bucket's ttl differs from ha.lease_ttl; leasing with the bucket's (all replicas of a group share one)",
				"bucket_ttl", ttl, "ha.lease_ttl", time.Duration(cfg.HA.LeaseTTL))
		}
	}
	for _, spec := range cfg.Pools {
		var p *hostedPool
		var err error
		if s.ha != nil {
			p, err = s.newHAPool(spec)
		} else {
			p, err = startPool(spec, cfg, cfg.PoolDomain(spec), s.incarnation, log, s.m, s.store)
		}
		if err != nil {
			s.stopPools(context.Background())
			return nil, fmt.Errorf("server: pool %q: %w", spec.Name, err)
		}
		s.pools[spec.Name] = p
		s.order = append(s.order, p)
	}
	if err := s.startNATS(); err != nil {
		s.stopPools(context.Background())
		return nil, err
	}
	s.m.reg.MustRegister(newPoolCollector(func() []*hostedPool { return s.order }))
	if s.ha != nil {
		s.m.reg.MustRegister(newHACollector(func() []*hostedPool { return s.order }))
	}
	if err := s.startSources(); err != nil {
		s.stopPools(context.Background())
		return nil, err
	}
	s.http = &http.Server{
		TLSConfig:         tlsConfig,
		Handler:           s.routes(),
		ReadHeaderTimeout: time.Duration(cfg.ReadHeaderTimeout),
		IdleTimeout:       time.Duration(cfg.IdleTimeout),
		ConnContext:       withConn,
		// No ReadTimeout or WriteTimeout: they would cut long-lived streams.
		// Bodies get their own deadline (readBody), stream frames theirs
		// (stream.write).
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Config returns the defaulted configuration.
func (s *Server) Config() Config { return s.cfg }

// Handler returns the HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.http.Handler }

// StartHA starts the replicas of a relay with HA (nothing without),
// announcing httpURL and grpcTarget as this replica's addresses unless
// ha.advertise and ha.advertise_grpc name them. Serve calls it with its
// listener's address when it was not called before.
func (s *Server) StartHA(httpURL, grpcTarget string) error {
	s.haOnce.Do(func() { s.haErr = s.startHA(httpURL, grpcTarget) })
	return s.haErr
}

// Serve accepts connections on ln until Shutdown. It returns nil after a
// clean shutdown.
func (s *Server) Serve(ln net.Listener) error {
	scheme := "http"
	if s.http.TLSConfig != nil {
		scheme = "https"
	}
	if err := s.StartHA(DefaultAdvertise(scheme, ln.Addr()), ""); err != nil {
		return err
	}
	bl := newBoundedListener(ln, s.cfg.MaxConnections, s.cfg.MaxIdlePerClient)
	s.http.ConnState = connState(bl)
	s.listener.Store(bl)
	ln = bl
	var err error
	if s.http.TLSConfig != nil {
		err = s.http.ServeTLS(ln, "", "") // certificates loaded by New
	} else {
		err = s.http.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops admitting events, drains every pool (admitted events are
// applied and their tail published), ends every stream with its final deltas,
// a drain marker and a close frame, then closes the HTTP server. ctx bounds
// the whole sequence.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopping.Store(true)
	err := s.stopPools(ctx)
	if nerr := s.stopNATS(ctx); nerr != nil && err == nil {
		err = nerr
	}
	if herr := s.http.Shutdown(ctx); herr != nil {
		// Out of time: cut what is still open rather than leave handlers
		// (and their goroutines) behind.
		_ = s.http.Close()
		if err == nil {
			err = herr
		}
	}
	return err
}

func (s *Server) stopPools(ctx context.Context) error {
	first := s.stopSources(ctx) // sources first: they admit into the pools
	for _, p := range s.order {
		if err := p.shutdown(ctx); err != nil && first == nil {
			first = fmt.Errorf("server: pool %q: %w", p.spec.Name, err)
		}
	}
	if s.ha != nil {
		s.ha.nc.Close()
	}
	if s.store != nil {
		if err := s.store.Close(); err != nil && first == nil {
			first = fmt.Errorf("server: %w", err)
		}
		s.store = nil
	}
	return first
}
