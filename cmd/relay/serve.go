package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/internal/grpcserver"
	"github.com/ckfrelay/ckfrelay/internal/server"
)

var errUsage = errors.New("usage")

// poolFlags collects repeated --pool flags.
type poolFlags []server.PoolSpec

func (p *poolFlags) String() string { return fmt.Sprint(len(*p), " pools") }
func (p *poolFlags) Set(s string) error {
	spec, err := server.ParsePoolFlag(s)
	if err != nil {
		return err
	}
	*p = append(*p, spec)
	return nil
}

// serveConfig builds the configuration: the file (--config or
// CKFRELAY_CONFIG) first, then CKFRELAY_* environment variables, then flags;
// later sources override earlier ones.
func serveConfig(args []string, stderr io.Writer) (server.Config, string, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", os.Getenv("CKFRELAY_CONFIG"), "JSON config file (env CKFRELAY_CONFIG)")
	listen := fs.String("listen", "", "listen address (env CKFRELAY_LISTEN; default "+server.DefaultListen+")")
	token := fs.String("auth-token", "", "bearer token required on every endpoint but /healthz (env CKFRELAY_AUTH_TOKEN); visible in the process list: prefer --auth-token-file")
	tokenFile := fs.String("auth-token-file", "", "file holding the bearer token (env CKFRELAY_AUTH_TOKEN_FILE)")
	cert := fs.String("tls-cert", "", "TLS certificate file (env CKFRELAY_TLS_CERT)")
	key := fs.String("tls-key", "", "TLS key file (env CKFRELAY_TLS_KEY)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	natsURL := fs.String("nats-url", "", "broadcast every pool's frames through this NATS JetStream server (env CKFRELAY_NATS_URL; off when unset)")
	grpcListen := fs.String("grpc-listen", "", "serve Dynamo's dynamo.kvrelay.v1 gRPC contract on this address (env CKFRELAY_GRPC_LISTEN; off when unset; docs/deploy.md)")
	dataDir := fs.String("data-dir", "", "directory that keeps the pools' exact state across a crash (env CKFRELAY_DATA_DIR; off when unset)")
	var pools poolFlags
	fs.Var(&pools, "pool", "a pool: name:dc=ID[,expected=N][,seed=S][,cadence=N][,delay=D][,kicks=N][,members=N][,tracked=N] (repeatable; env CKFRELAY_POOLS, ';'-separated)")
	var sources []string
	fs.Func("source", "an engine source of a pool: pool:engine=vllm|sglang|trtllm,endpoint=tcp://host:5557|bind=tcp://*:5557[,replay=tcp://host:5558][,topic=T][,dp_ranks=N],worker=ID,block_size=N[,source_timeout=D], or pool:engine=dynamo,url=nats://…,subject=S[,stream=S,durable=D][,source_timeout=D] (repeatable; env CKFRELAY_SOURCES, ';'-separated; docs/ingest.md)",
		func(v string) error { sources = append(sources, v); return nil })
	if err := fs.Parse(args); err != nil {
		return server.Config{}, "", errUsage
	}
	var cfg server.Config
	if *configPath != "" {
		var err error
		if cfg, err = server.LoadConfigFile(*configPath); err != nil {
			return cfg, "", err
		}
	}
	envStr := func(dst *string, name string) {
		if v := os.Getenv(name); v != "" {
			*dst = v
		}
	}
	envStr(&cfg.Listen, "CKFRELAY_LISTEN")
	// A token and a token file exclude each other: the later source wins.
	setToken := func(tok, file string) {
		if tok != "" {
			cfg.AuthToken, cfg.AuthTokenFile = tok, ""
		}
		if file != "" {
			cfg.AuthToken, cfg.AuthTokenFile = "", file
		}
	}
	setToken(os.Getenv("CKFRELAY_AUTH_TOKEN"), os.Getenv("CKFRELAY_AUTH_TOKEN_FILE"))
	envStr(&cfg.TLSCertFile, "CKFRELAY_TLS_CERT")
	envStr(&cfg.TLSKeyFile, "CKFRELAY_TLS_KEY")
	envStr(&cfg.NATS.URL, "CKFRELAY_NATS_URL")
	envStr(&cfg.DataDir, "CKFRELAY_DATA_DIR")
	envStr(&cfg.GRPC.Listen, "CKFRELAY_GRPC_LISTEN")
	if v := os.Getenv("CKFRELAY_MAX_SUBSCRIBERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cfg, "", fmt.Errorf("CKFRELAY_MAX_SUBSCRIBERS: %w", err)
		}
		cfg.MaxSubscribers = n
	}
	if v := os.Getenv("CKFRELAY_POOLS"); v != "" && len(pools) == 0 {
		for _, s := range strings.Split(v, ";") {
			if err := pools.Set(strings.TrimSpace(s)); err != nil {
				return cfg, "", fmt.Errorf("CKFRELAY_POOLS: %w", err)
			}
		}
	}
	setToken(*token, *tokenFile)
	for dst, v := range map[*string]string{&cfg.Listen: *listen, &cfg.TLSCertFile: *cert, &cfg.TLSKeyFile: *key, &cfg.NATS.URL: *natsURL, &cfg.DataDir: *dataDir, &cfg.GRPC.Listen: *grpcListen} {
		if v != "" {
			*dst = v
		}
	}
	if len(pools) > 0 {
		cfg.Pools = pools
	}
	if v := os.Getenv("CKFRELAY_SOURCES"); v != "" && len(sources) == 0 {
		sources = strings.Split(v, ";")
	}
	for _, v := range sources {
		pool, spec, err := server.ParseSourceFlag(strings.TrimSpace(v))
		if err == nil {
			err = cfg.AddSource(pool, spec)
		}
		if err != nil {
			return cfg, "", fmt.Errorf("--source: %w", err)
		}
	}
	return cfg.WithDefaults(), *logLevel, nil
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, level, err := serveConfig(args, stderr)
	if err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	srv, err := server.New(cfg, log)
	if err != nil {
		return err
	}
	for _, m := range srv.RouterMismatches() {
		log.Warn("pools of one routing scope cannot share a router: their lanes must agree on domain and format",
			"pool", m.Pool, "first", m.First, "differ", m.Fields)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = srv.Shutdown(context.Background())
		return err
	}
	var gsrv *grpcserver.Server
	var gln net.Listener
	if cfg.GRPC.Listen != "" {
		if gsrv, err = grpcserver.New(srv, log); err == nil {
			gln, err = net.Listen("tcp", cfg.GRPC.Listen)
		}
		if err != nil {
			_ = ln.Close()
			if gsrv != nil {
				_ = gsrv.Shutdown(context.Background())
			}
			_ = srv.Shutdown(context.Background())
			return err
		}
	}
	log.Info("relay serving", "addr", ln.Addr().String(), "pools", len(cfg.Pools), "tls", cfg.TLSCertFile != "")
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if gsrv != nil {
		log.Info("relay serving dynamo.kvrelay.v1 over gRPC", "addr", gln.Addr().String())
		fmt.Fprintf(stdout, "grpc listening on %s\n", gln.Addr())
		go func() { errc <- gsrv.Serve(gln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: draining pools and closing streams")
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.ShutdownGrace))
	defer cancel()
	// The pools first: their filter streams (HTTP and gRPC) end with the
	// published tail; then the gRPC catalog and load streams.
	err = srv.Shutdown(sctx)
	if gsrv != nil {
		if gerr := gsrv.Shutdown(sctx); gerr != nil && err == nil {
			err = gerr
		}
		if gerr := <-errc; gerr != nil && err == nil {
			err = gerr
		}
	}
	if err != nil {
		return err
	}
	return <-errc
}
