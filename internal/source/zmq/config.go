// Package zmq is the relay's ZeroMQ event source: it subscribes to the KV
// events vLLM, SGLang and TensorRT-LLM publish (three frames: topic, 8-byte
// big-endian sequence, msgpack batch), converts them as NVIDIA Dynamo does,
// and heals every gap itself: a sequence gap is filled from the engine's
// replay socket, an uncoverable gap or a silent engine resets the rank, and an
// engine restart starts a new source epoch (docs/ingest.md).
//
// It uses github.com/go-zeromq/zmq4 (pure Go, so the build stays cgo-free)
// but owns the reconnect loop: the library's Dial gives up after a few
// retries and its automatic reconnect races.
package zmq

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("zmq source: invalid config")

// Defaults.
const (
	DefaultSourceTimeout = 10 * time.Second
	DefaultReplayTimeout = 2 * time.Second
	DefaultMinBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff    = 5 * time.Second
	// DefaultMaxReplayBatches bounds one replay (vLLM buffers 10,000).
	DefaultMaxReplayBatches = 100_000
	// DefaultMaxReplayBytes bounds the bytes one replay keeps (docs/limits.md):
	// 10,000 batches of a few KiB fit many times over.
	DefaultMaxReplayBytes = 64 << 20
	// DefaultMaxMessageBytes bounds one ZMQ message (its frames' bodies
	// together); the relay passes its max_request_bytes instead.
	DefaultMaxMessageBytes = 16 << 20
	// MaxFramesPerMessage bounds a message's frames (an engine message has
	// 3, a replay reply at most 4).
	MaxFramesPerMessage = 16
	// DefaultHandshakeTimeout bounds a peer's part of the ZMTP handshake.
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultMaxPeers bounds the connections of a bound source.
	DefaultMaxPeers = 1024
	// DefaultMaxRanks bounds the data-parallel ranks a source tracks when
	// dp_ranks is not configured: ranks 0..DefaultMaxRanks-1.
	DefaultMaxRanks = 64
)

// Config configures one ZMQ source.
type Config struct {
	// Engine is "vllm", "sglang" or "trtllm" (reported, not interpreted:
	// they share one wire format).
	Engine string
	// Endpoint is the PUB endpoint of DP rank 0 to connect to; rank N is at
	// port+N. Bind instead binds one SUB socket engines connect to. Exactly
	// one is set.
	Endpoint string
	Bind     string
	// Replay is rank 0's replay (ROUTER) endpoint; rank N at port+N. Empty:
	// gaps cannot be filled and reset the rank.
	Replay string
	// Topic is a prefix filter on the topic frame; "" takes every topic.
	Topic string
	// DPRanks is the number of ranks (connect mode: sockets). Default 1.
	DPRanks int
	// Worker is the worker id of every event; BlockSize the engine's block
	// size in tokens (required).
	Worker    uint64
	BlockSize int
	// Eagle: the pool's hash format is Dynamo's DYNAMO_EAGLE_V1 — every
	// block is hashed over block_size+1 tokens at a block_size stride, and
	// events of the standard format are dropped (DropHashFormat); without
	// it, bigram (Eagle) events are the ones dropped.
	Eagle bool
	// SourceTimeout resets a rank heard nothing from for this long.
	SourceTimeout time.Duration
	// ReplayTimeout bounds one replay request.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the reconnect backoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxReplayBatches bounds the batches accepted from one replay.
	MaxReplayBatches int
	// MaxReplayBytes bounds the bytes (payloads and topics) kept from one
	// replay; past it the replay fails and the rank is reset degraded.
	// Default DefaultMaxReplayBytes.
	MaxReplayBytes int64
	// Limits bound one batch.
	Limits Limits
	// Ingest tunes event conversion and the failing state (health.go).
	Ingest IngestOptions
	// MaxMessageBytes bounds one message from a peer: a frame header
	// announcing more drops the peer's connection before anything is
	// allocated. Default DefaultMaxMessageBytes.
	MaxMessageBytes int64
	// HandshakeTimeout bounds a peer's part of the ZMTP handshake. Default
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxPeers bounds the connections of a bound source (handshaking or
	// open); more are closed at once. Default DefaultMaxPeers.
	MaxPeers int
	// MaxPeersPerClient bounds the connections one client address holds on
	// a bound source, so one address cannot take every max_peers slot. At
	// max_peers a newcomer closes the longest-idle peer (one that has not
	// sent a whole message yet); past MaxPeersPerClient it closes its own
	// address's longest-idle one, or is closed when all of them publish.
	// Default a quarter of MaxPeers (256); at most MaxPeers.
	MaxPeersPerClient int
	// Logger receives the transition and rejection lines. Default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.DPRanks == 0 {
		c.DPRanks = 1
	}
	if c.SourceTimeout == 0 {
		c.SourceTimeout = DefaultSourceTimeout
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxReplayBatches == 0 {
		c.MaxReplayBatches = DefaultMaxReplayBatches
	}
	if c.MaxReplayBytes == 0 {
		c.MaxReplayBytes = DefaultMaxReplayBytes
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.MaxPeersPerClient == 0 {
		c.MaxPeersPerClient = max(1, c.MaxPeers/4)
	}
	if c.Ingest.FailWindow <= 0 {
		c.Ingest.FailWindow = DefaultFailWindow
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks a configuration (before defaults fill zero durations).
func (c Config) Validate() error {
	switch {
	case (c.Endpoint == "") == (c.Bind == ""):
		return fmt.Errorf("%w: exactly one of endpoint and bind", ErrInvalidConfig)
	case c.BlockSize < 1:
		return fmt.Errorf("%w: block_size must be ≥ 1", ErrInvalidConfig)
	case c.DPRanks < 0 || c.DPRanks > 1024:
		return fmt.Errorf("%w: dp_ranks must be in [1, 1024]", ErrInvalidConfig)
	case c.MaxMessageBytes < 0 || c.MaxPeers < 0 || c.MaxPeersPerClient < 0 || c.MaxReplayBytes < 0:
		return fmt.Errorf("%w: negative max_message_bytes, max_peers, max_peers_per_client or max_replay_bytes", ErrInvalidConfig)
	case c.MaxPeersPerClient > cmp.Or(c.MaxPeers, DefaultMaxPeers):
		return fmt.Errorf("%w: max_peers_per_client %d above max_peers", ErrInvalidConfig, c.MaxPeersPerClient)
	case c.SourceTimeout < 0 || c.ReplayTimeout < 0 || c.HandshakeTimeout < 0 || c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("%w: negative or inverted durations", ErrInvalidConfig)
	case c.Ingest.FailWindow < 0:
		return fmt.Errorf("%w: fail_window must be ≥ 0", ErrInvalidConfig)
	case c.Ingest.MaxNamespaceBlocks < 0:
		return fmt.Errorf("%w: max_namespace_blocks must be ≥ 0", ErrInvalidConfig)
	}
	for _, ep := range []string{c.Endpoint, c.Bind, c.Replay} {
		if ep == "" {
			continue
		}
		if _, err := RankEndpoint(ep, max(c.DPRanks, 1)-1); err != nil {
			return err
		}
	}
	return nil
}

// Name is how the source is listed: "engine@endpoint" or "engine@bind".
func (c Config) Name() string {
	if c.Endpoint != "" {
		return c.Engine + "@" + c.Endpoint
	}
	return c.Engine + "@bind:" + c.Bind
}

// RankEndpoint returns rank's endpoint under vLLM's layout: tcp port + rank,
// ipc/inproc path suffixed "_dp<rank>"; rank 0 is ep itself.
func RankEndpoint(ep string, rank int) (string, error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || rest == "" {
		return "", fmt.Errorf("%w: endpoint %q is not scheme://address", ErrInvalidConfig, ep)
	}
	switch scheme {
	case "tcp":
		i := strings.LastIndexByte(rest, ':')
		if i < 0 {
			return "", fmt.Errorf("%w: endpoint %q has no port", ErrInvalidConfig, ep)
		}
		port, err := strconv.Atoi(rest[i+1:])
		if err != nil || port < 0 || port+rank > 65535 {
			return "", fmt.Errorf("%w: endpoint %q: bad port for rank %d", ErrInvalidConfig, ep, rank)
		}
		if rank == 0 {
			return ep, nil
		}
		return scheme + "://" + rest[:i+1] + strconv.Itoa(port+rank), nil
	case "ipc", "inproc":
		if rank == 0 {
			return ep, nil
		}
		return ep + "_dp" + strconv.Itoa(rank), nil
	}
	return "", fmt.Errorf("%w: endpoint %q: unsupported scheme %q", ErrInvalidConfig, ep, url.PathEscape(scheme))
}
