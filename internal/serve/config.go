// Package serve is the `relay serve` command: it assembles the server's
// configuration from a JSON file, CKFRELAY_* environment variables and flags
// (later sources override earlier ones), then serves the pools over HTTP and,
// with --grpc-listen, Dynamo's dynamo.kvrelay.v1 over gRPC until its context
// is done, and shuts down the HTTP side (the pools' streams end with their
// published tail) before the gRPC one.
package serve

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ckfrelay/ckfrelay/internal/server"
)

// ErrUsage is returned when the flags are invalid; the flag package has
// written the message to stderr already, and the command exits 2.
var ErrUsage = errors.New("serve: usage")

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

// parseConfig builds the configuration and returns it with the --log-level
// text: the file (--config or CKFRELAY_CONFIG) first, then CKFRELAY_*
// environment variables, then flags; later sources override earlier ones.
func parseConfig(args []string, stderr io.Writer) (server.Config, string, error) {
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
	haURL := fs.String("ha-nats-url", "", "run every pool as one replica of a hot-standby group on this NATS JetStream (env CKFRELAY_HA_NATS_URL; off when unset; excludes --data-dir; docs/deploy.md)")
	nodeID := fs.String("node-id", "", "this replica's id, distinct within its group, also between relays on one host (env CKFRELAY_HA_NODE_ID; default the host name)")
	var pools poolFlags
	fs.Var(&pools, "pool", "a pool: name:dc=ID[,expected=N][,seed=S][,cadence=N][,delay=D][,kicks=N][,members=N][,tracked=N][,block_size=N][,hash_format=F][,cache_semantics=NAME][,routing_scope=NAME] (repeatable; env CKFRELAY_POOLS, ';'-separated)")
	var sources []string
	fs.Func("source", "an engine source of a pool: pool:engine=vllm|sglang|trtllm,endpoint=tcp://host:5557|bind=tcp://*:5557[,replay=tcp://host:5558][,topic=T][,dp_ranks=N],worker=ID,block_size=N[,source_timeout=D], or pool:engine=dynamo,url=nats://…,subject=S[,stream=S,durable=D][,source_timeout=D] (repeatable; env CKFRELAY_SOURCES, ';'-separated; docs/ingest.md)",
		func(v string) error { sources = append(sources, v); return nil })
	if err := fs.Parse(args); err != nil {
		return server.Config{}, "", ErrUsage
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
	envStr(&cfg.HA.NATSURL, "CKFRELAY_HA_NATS_URL")
	envStr(&cfg.HA.NodeID, "CKFRELAY_HA_NODE_ID")
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
	for dst, v := range map[*string]string{&cfg.Listen: *listen, &cfg.TLSCertFile: *cert, &cfg.TLSKeyFile: *key, &cfg.NATS.URL: *natsURL, &cfg.DataDir: *dataDir, &cfg.GRPC.Listen: *grpcListen,
		&cfg.HA.NATSURL: *haURL, &cfg.HA.NodeID: *nodeID} {
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
