// Package server is the relay's network side (SPEC §11): it hosts pools (one
// producer actor, publisher lease and hub each), accepts KV events and rank
// recovery commands over HTTP, serves each pool's frame stream to remote
// consumers, and exposes a catalog, health and Prometheus metrics.
package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/zeebo/xxh3"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("server: invalid config")

// PoolSpec configures one hosted pool (one data center). JSON names are the
// config file's keys.
type PoolSpec struct {
	// Name is the pool's URL name: [a-z0-9_-]{1,64}.
	Name string `json:"name"`
	// DCID is the data-center id carried in the pool identity.
	DCID uint64 `json:"dc_id"`
	// ExpectedBlocks sizes the filter (≈80% design load). Default 1,048,576.
	ExpectedBlocks uint64 `json:"expected_blocks,omitempty"`
	// Seed keys addressing and relocation. Default ckf.DefaultSeed.
	Seed *uint64 `json:"seed,omitempty"`
	// PublishEveryNEvents is the publication cadence. Default 16.
	PublishEveryNEvents uint64 `json:"publish_every_n_events,omitempty"`
	// PublicationDelay publishes a sparse tail after this long. Default 1ms.
	PublicationDelay Duration `json:"publication_delay,omitempty"`
	// MaxKicks bounds a relocation chain. Default 500.
	MaxKicks int `json:"max_kicks,omitempty"`
}

// Config is the whole relay configuration.
type Config struct {
	// Listen is the HTTP listen address. Default "127.0.0.1:7878".
	Listen string `json:"listen,omitempty"`
	// TLSCertFile and TLSKeyFile enable TLS when both are set.
	TLSCertFile string `json:"tls_cert_file,omitempty"`
	TLSKeyFile  string `json:"tls_key_file,omitempty"`
	// AuthToken, when set, is required as "Authorization: Bearer <token>" on
	// every endpoint except /healthz.
	AuthToken string `json:"auth_token,omitempty"`
	// DataDir, when set, keeps every pool's exact state there (a Pebble
	// database) so a relay killed without warning restarts with it.
	DataDir string `json:"data_dir,omitempty"`
	// CacheSemantics and RoutingScope name the routing domain; their digests
	// are XXH3-128 of the strings, marked explicit when set and
	// default-derived ("ckfrelay/default") otherwise.
	CacheSemantics string `json:"cache_semantics,omitempty"`
	RoutingScope   string `json:"routing_scope,omitempty"`
	// Limits.
	MaxFrameBytes     int   `json:"max_frame_bytes,omitempty"`      // default 8 MiB
	MaxRequestBytes   int64 `json:"max_request_bytes,omitempty"`    // default 16 MiB
	MaxEventsPerBatch int   `json:"max_events_per_batch,omitempty"` // default 4096
	MaxBlocksPerEvent int   `json:"max_blocks_per_event,omitempty"` // default 4096
	MaxSubscribers    int   `json:"max_subscribers,omitempty"`      // per pool, default 256
	// MaxLeaseRecords bounds, per pool, the remembered (consumer, lane) lease
	// epochs; idle ones are forgotten beyond it. Default 65,536; ≥ max_subscribers.
	MaxLeaseRecords int `json:"max_lease_records,omitempty"`
	// SubscriberQueue and SubscriberQueueBytes bound each pool's delta log,
	// which every subscriber shares: how far one may trail before it is
	// closed lagged. Defaults 65,536 deltas and 64 MiB.
	SubscriberQueue      int   `json:"subscriber_queue,omitempty"`
	SubscriberQueueBytes int64 `json:"subscriber_queue_bytes,omitempty"`
	// SnapshotGenerations bounds, per pool, the table copies snapshots in
	// flight share (each costs one table). Default 2.
	SnapshotGenerations int      `json:"snapshot_generations,omitempty"`
	HeartbeatInterval   Duration `json:"heartbeat_interval,omitempty"` // default 1s
	// StreamWriteTimeout bounds one write to a stream: a subscriber that
	// stops reading is dropped after it, so it cannot pin a handler (or
	// delay shutdown) forever. Default 10s.
	StreamWriteTimeout Duration   `json:"stream_write_timeout,omitempty"`
	ShutdownGrace      Duration   `json:"shutdown_grace,omitempty"` // default 10s
	Pools              []PoolSpec `json:"pools"`
}

// Duration is a time.Duration that reads and writes as a Go duration string.
type Duration time.Duration

// UnmarshalJSON accepts "250ms"-style strings.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"1ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Relay defaults (SPEC §2.1 relay column, §9, §11).
const (
	DefaultListen            = "127.0.0.1:7878"
	DefaultExpectedBlocks    = 1 << 20
	DefaultPublishEveryN     = 16
	DefaultMaxFrameBytes     = 8 << 20
	DefaultMaxRequestBytes   = 16 << 20
	DefaultMaxEventsPerBatch = 4096
	DefaultMaxBlocksPerEvent = 4096
	DefaultMaxSubscribers    = 256
	DefaultSubscriberQueue   = 65536
	DefaultHeartbeat         = time.Second
	DefaultStreamWrite       = 10 * time.Second
	DefaultShutdownGrace     = 10 * time.Second
)

var poolName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	setDefault(&c.Listen, DefaultListen)
	setDefault(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	setDefault(&c.MaxRequestBytes, DefaultMaxRequestBytes)
	setDefault(&c.MaxEventsPerBatch, DefaultMaxEventsPerBatch)
	setDefault(&c.MaxBlocksPerEvent, DefaultMaxBlocksPerEvent)
	setDefault(&c.MaxSubscribers, DefaultMaxSubscribers)
	setDefault(&c.MaxLeaseRecords, max(hub.DefaultMaxLeaseRecords, c.MaxSubscribers))
	setDefault(&c.SubscriberQueue, DefaultSubscriberQueue)
	setDefault(&c.SubscriberQueueBytes, hub.DefaultQueueBytes)
	setDefault(&c.SnapshotGenerations, hub.DefaultSnapshotGenerations)
	setDefault(&c.HeartbeatInterval, Duration(DefaultHeartbeat))
	setDefault(&c.ShutdownGrace, Duration(DefaultShutdownGrace))
	setDefault(&c.StreamWriteTimeout, Duration(DefaultStreamWrite))
	pools := make([]PoolSpec, len(c.Pools))
	for i, p := range c.Pools {
		setDefault(&p.ExpectedBlocks, DefaultExpectedBlocks)
		setDefault(&p.PublishEveryNEvents, DefaultPublishEveryN)
		setDefault(&p.PublicationDelay, Duration(time.Millisecond))
		setDefault(&p.MaxKicks, ckf.DefaultMaxKicks)
		if p.Seed == nil {
			s := ckf.DefaultSeed
			p.Seed = &s
		}
		pools[i] = p
	}
	c.Pools = pools
	return c
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate checks a defaulted configuration.
func (c Config) Validate() error {
	if len(c.Pools) == 0 {
		return invalid("no pools configured")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return invalid("tls_cert_file and tls_key_file must be set together")
	}
	switch {
	case c.MaxFrameBytes < 1<<16:
		return invalid("max_frame_bytes %d < 65536", c.MaxFrameBytes)
	case c.MaxRequestBytes < 1<<10:
		return invalid("max_request_bytes %d < 1024", c.MaxRequestBytes)
	case c.MaxEventsPerBatch < 1, c.MaxBlocksPerEvent < 1, c.MaxSubscribers < 1, c.SubscriberQueue < 1,
		c.SubscriberQueueBytes < 1, c.SnapshotGenerations < 1:
		return invalid("limits must be ≥ 1")
	case c.MaxLeaseRecords < c.MaxSubscribers:
		return invalid("max_lease_records %d < max_subscribers %d", c.MaxLeaseRecords, c.MaxSubscribers)
	case c.HeartbeatInterval <= 0 || c.ShutdownGrace <= 0 || c.StreamWriteTimeout <= 0:
		return invalid("heartbeat_interval, shutdown_grace and stream_write_timeout must be > 0")
	}
	names := map[string]bool{}
	dcs := map[uint64]bool{}
	for _, p := range c.Pools {
		if !poolName.MatchString(p.Name) {
			return invalid("pool name %q must match %s", p.Name, poolName)
		}
		if names[p.Name] {
			return invalid("duplicate pool name %q", p.Name)
		}
		if dcs[p.DCID] {
			return invalid("pool %q: duplicate dc_id %d", p.Name, p.DCID)
		}
		names[p.Name], dcs[p.DCID] = true, true
		if err := p.ckfConfig().Validate(); err != nil {
			return invalid("pool %q: %v", p.Name, err)
		}
		if p.PublicationDelay <= 0 {
			return invalid("pool %q: publication_delay must be > 0", p.Name)
		}
	}
	return nil
}

// Format returns the filter layout (seed, bucket count) a defaulted pool
// publishes: what a router's consumer manifest must name for it.
func (p PoolSpec) Format() (ckf.Format, error) { return p.ckfConfig().Format() }

func (p PoolSpec) ckfConfig() ckf.Config {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = p.ExpectedBlocks
	if p.Seed != nil {
		cfg.Seed = *p.Seed
	}
	cfg.MaxKicks = p.MaxKicks
	cfg.PublishEveryNEvents = p.PublishEveryNEvents
	return cfg
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Domain returns the routing domain the configuration names.
func (c Config) Domain() ckf.Domain {
	return ckf.Domain{CacheSemantics: scopedDigest(c.CacheSemantics), RoutingScope: scopedDigest(c.RoutingScope)}
}

// DefaultDomainName is hashed for a domain digest left unset.
const DefaultDomainName = "ckfrelay/default"

func scopedDigest(name string) ckf.ScopedDigest {
	src := ckf.DigestExplicit
	if name == "" {
		name, src = DefaultDomainName, ckf.DigestDefaultDerived
	}
	return ckf.ScopedDigest{Digest: xxh3.HashString128(name).Bytes(), Source: src}
}

// LoadConfigFile reads a JSON configuration file. Unknown keys are errors, so
// a misspelt limit is never silently ignored.
func LoadConfigFile(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return Config{}, invalid("%s: %v", path, err)
	}
	return c, nil
}

// ParsePoolFlag parses the --pool flag form
// "name:dc=1,expected=1048576,seed=0x5DEE…,cadence=16,delay=1ms,kicks=500";
// every key but dc is optional.
func ParsePoolFlag(s string) (PoolSpec, error) {
	name, rest, _ := strings.Cut(s, ":")
	p := PoolSpec{Name: name}
	seenDC := false
	if rest != "" {
		for _, kv := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return PoolSpec{}, invalid("pool %q: %q is not key=value", name, kv)
			}
			var err error
			switch k {
			case "dc":
				p.DCID, err = strconv.ParseUint(v, 0, 64)
				seenDC = true
			case "expected":
				p.ExpectedBlocks, err = strconv.ParseUint(v, 0, 64)
			case "seed":
				var s uint64
				s, err = strconv.ParseUint(v, 0, 64)
				p.Seed = &s
			case "cadence":
				p.PublishEveryNEvents, err = strconv.ParseUint(v, 0, 64)
			case "delay":
				var d time.Duration
				d, err = time.ParseDuration(v)
				p.PublicationDelay = Duration(d)
			case "kicks":
				p.MaxKicks, err = strconv.Atoi(v)
			default:
				return PoolSpec{}, invalid("pool %q: unknown key %q", name, k)
			}
			if err != nil {
				return PoolSpec{}, invalid("pool %q: %s: %v", name, k, err)
			}
		}
	}
	if !seenDC {
		return PoolSpec{}, invalid("pool %q: dc=<id> is required", name)
	}
	return p, nil
}
