package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/source/zmq"
)

// runningSource is one started source of a pool.
type runningSource struct {
	pool string
	src  source.Source
	done chan struct{}
}

// poolSources are the sources the server runs, stopped before the pools.
type poolSources struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	// byPool: written before serving, and with HA at every role change (a
	// leader runs its pool's sources, a standby none).
	byPool map[string][]*runningSource
}

// set replaces pool's running sources (HA role changes).
func (ps *poolSources) set(pool string, l []*runningSource) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.byPool[pool] = l
}

// of returns pool's running sources.
func (ps *poolSources) of(pool string) []*runningSource {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.byPool[pool]
}

// newSource builds the source a spec names. Each transport is one case.
// The relay's batch limits bound what a source decodes, as they bound HTTP
// posts (token ids: 256 per block at most).
// The pool's block size is the default of a ZMQ source's, and its hash
// format decides the source's windows.
func newSource(spec SourceSpec, pool PoolSpec, cfg Config, log *slog.Logger) (source.Source, error) {
	switch spec.Engine {
	case "vllm", "sglang", "trtllm":
		if spec.URL != "" || spec.Subject != "" || spec.Stream != "" || spec.Durable != "" {
			return nil, fmt.Errorf("engine %q publishes on ZMQ: url, subject, stream and durable are NATS fields", spec.Engine)
		}
		bs := spec.BlockSize
		if bs == 0 {
			bs = pool.BlockSize
		}
		return zmq.New(zmq.Config{Engine: spec.Engine, Endpoint: spec.Endpoint, Bind: spec.Bind, Replay: spec.Replay,
			Topic: spec.Topic, DPRanks: spec.DPRanks, Worker: spec.Worker, BlockSize: bs,
			SourceTimeout: time.Duration(spec.SourceTimeout), Logger: log, Eagle: pool.Eagle(),
			MaxMessageBytes: cmp.Or(spec.MaxMessageBytes, cfg.MaxRequestBytes), MaxReplayBytes: spec.MaxReplayBytes,
			Ingest: zmq.IngestOptions{ImageTokenID: spec.ImageTokenID, VideoTokenID: spec.VideoTokenID, FailWindow: time.Duration(spec.FailWindow),
				MaxNamespaceBlocks: spec.MaxNamespaceBlocks},
			Limits: zmq.Limits{MaxEvents: cfg.MaxEventsPerBatch, MaxBlocks: cfg.MaxBlocksPerEvent, MaxTokens: 256 * cfg.MaxBlocksPerEvent}})
	case "dynamo":
		return newDynamoSource(spec, cfg, pool.MaxMembers)
	}
	return nil, fmt.Errorf("unknown engine %q", spec.Engine)
}

// startSources starts every configured source after its pool, so a source
// never admits into a pool that is not running.
func (s *Server) startSources() error {
	ctx, cancel := context.WithCancel(context.Background())
	s.sources = &poolSources{cancel: cancel, byPool: map[string][]*runningSource{}}
	for _, p := range s.order {
		for i, spec := range p.spec.Sources {
			src, err := newSource(spec, p.spec, s.cfg, s.log.With("pool", p.spec.Name))
			if err != nil {
				cancel()
				return invalid("pool %q: source %d: %v", p.spec.Name, i, err)
			}
			if p.ha != nil {
				continue // checked; its leader runs it (ha.go)
			}
			rs := &runningSource{pool: p.spec.Name, src: src, done: make(chan struct{})}
			go func() {
				defer close(rs.done)
				// Stopped by Shutdown is not an error (the Dynamo source
				// returns its context's error then), as in ha.go.
				if err := src.Run(ctx, p.sink()); err != nil && ctx.Err() == nil {
					p.log.Error("source stopped", "source", src.Status().Name, "err", err)
				}
			}()
			s.sources.byPool[p.spec.Name] = append(s.sources.byPool[p.spec.Name], rs)
		}
	}
	s.m.reg.MustRegister(&sourceCollector{s: s.sources})
	return nil
}

// stopSources stops every source and waits for them (or ctx).
func (s *Server) stopSources(ctx context.Context) error {
	if s.sources == nil {
		return nil
	}
	s.sources.cancel()
	for _, rs := range s.sources.all() {
		select {
		case <-rs.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (ps *poolSources) all() []*runningSource {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*runningSource
	for _, l := range ps.byPool {
		out = append(out, l...)
	}
	return out
}

// SourceStatuses reports the named pool's sources, as the catalog lists them.
func (s *Server) SourceStatuses(pool string) []source.Status {
	if s.sources == nil {
		return nil
	}
	var out []source.Status
	for _, rs := range s.sources.of(pool) {
		out = append(out, rs.src.Status())
	}
	return out
}

// sourceCollector exports every source's Status at scrape time.
type sourceCollector struct{ s *poolSources }

var (
	sourceLabels  = []string{"pool", "source", "engine"}
	sourceCounter = map[string]string{
		"batches": "Batches admitted.", "events": "Events admitted.",
		"rejected": "Messages rejected as malformed.", "dropped": "Blocks or events dropped on purpose (wrong block size, lost parent, non-local).",
		"gaps": "Sequence gaps detected.", "replays": "Replay requests made.", "resets": "Rank resets.",
		"restarts": "Engine restarts detected (new source epoch).", "degraded": "Resets after a gap nothing could fill.",
		"silences": "Ranks reset after silence past source_timeout.", "duplicates": "Batches received twice and skipped.",
		"reconnects":    "Lost connections redialled.",
		"reordered":     "Messages that arrived ahead of a hole in their publisher's sequence and were applied in order once a redelivery filled it (Dynamo JetStream).",
		"peers_refused": "Peer connections dropped: not ZMTP, handshake too slow, a message above max_message_bytes, beyond max_peers, or idle (never published) and closed for a newcomer.",
	}
	sourceDescs = func() map[string]*prometheus.Desc {
		m := map[string]*prometheus.Desc{}
		for k, help := range sourceCounter {
			m[k] = prometheus.NewDesc("ckfrelay_source_"+k+"_total", help, sourceLabels, nil)
		}
		return m
	}()
	sourceRankState = prometheus.NewDesc("ckfrelay_source_rank_state",
		"1 for the state each rank of a source is in (live, degraded, reset).", append(sourceLabels, "dp_rank", "state"), nil)
	sourceDroppedReason = prometheus.NewDesc("ckfrelay_source_dropped_reason_total",
		"Blocks (or block-less events) dropped on purpose, by reason.", append(sourceLabels, "reason"), nil)
	sourceRejectedReason = prometheus.NewDesc("ckfrelay_source_rejected_reason_total",
		"Batches rejected as malformed, by reason.", append(sourceLabels, "reason"), nil)
	sourceFailing = prometheus.NewDesc("ckfrelay_source_failing",
		"1 while the source hears nothing useful (state failing).", sourceLabels, nil)
	sourceHeld = prometheus.NewDesc("ckfrelay_source_held",
		"Messages held ahead of a hole in their publisher's sequence, waiting for the redelivery that fills it (Dynamo JetStream).", sourceLabels, nil)
	sourceLastEvent = prometheus.NewDesc("ckfrelay_source_last_event_seconds",
		"Unix time the source last heard anything.", sourceLabels, nil)
)

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range sourceDescs {
		ch <- d
	}
	ch <- sourceRankState
	ch <- sourceLastEvent
	ch <- sourceDroppedReason
	ch <- sourceRejectedReason
	ch <- sourceFailing
	ch <- sourceHeld
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, rs := range c.s.all() {
		st := rs.src.Status()
		l := []string{rs.pool, st.Name, st.Engine}
		for k, v := range map[string]catalog.U64{"batches": st.Batches, "events": st.Events, "rejected": st.Rejected,
			"dropped": st.Dropped, "gaps": st.Gaps, "replays": st.Replays, "resets": st.Resets, "restarts": st.Restarts,
			"degraded": st.Degraded, "silences": st.Silences, "duplicates": st.Duplicates, "reconnects": st.Reconnects, "peers_refused": st.PeersRefused,
			"reordered": st.Reordered} {
			ch <- prometheus.MustNewConstMetric(sourceDescs[k], prometheus.CounterValue, float64(v), l...)
		}
		for why, v := range st.DroppedByReason {
			ch <- prometheus.MustNewConstMetric(sourceDroppedReason, prometheus.CounterValue, float64(v), append(l, why)...)
		}
		for why, v := range st.RejectedByReason {
			ch <- prometheus.MustNewConstMetric(sourceRejectedReason, prometheus.CounterValue, float64(v), append(l, why)...)
		}
		failing := 0.0
		if st.State == source.StateFailing {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(sourceFailing, prometheus.GaugeValue, failing, l...)
		ch <- prometheus.MustNewConstMetric(sourceHeld, prometheus.GaugeValue, float64(st.Held), l...)
		for _, r := range st.Ranks {
			ch <- prometheus.MustNewConstMetric(sourceRankState, prometheus.GaugeValue, 1,
				append(l, strconv.FormatUint(uint64(r.DPRank), 10), r.State)...)
		}
		if !st.LastEvent.IsZero() {
			ch <- prometheus.MustNewConstMetric(sourceLastEvent, prometheus.GaugeValue, float64(st.LastEvent.UnixNano())/1e9, l...)
		}
	}
}

// ParseSourceFlag parses the --source flag form
// "pool:engine=vllm,endpoint=tcp://host:5557,replay=tcp://host:5558,worker=7,block_size=16"
// (keys: engine, endpoint, bind, replay, topic, dp_ranks, worker,
// block_size, source_timeout, max_message_bytes, max_replay_bytes, image_token_id, fail_window,
// max_namespace_blocks; url, subject, stream, durable for dynamo) and
// returns the pool's name and the spec.
func ParseSourceFlag(s string) (string, SourceSpec, error) {
	pool, rest, ok := strings.Cut(s, ":")
	if !ok || rest == "" {
		return "", SourceSpec{}, invalid("source %q: want pool:engine=…,endpoint=…", s)
	}
	var spec SourceSpec
	err := parseKeyValues(fmt.Sprintf("source %q", s), rest, func(k, v string) (err error) {
		switch k {
		case "engine":
			spec.Engine = v
		case "endpoint":
			spec.Endpoint = v
		case "bind":
			spec.Bind = v
		case "replay":
			spec.Replay = v
		case "topic":
			spec.Topic = v
		case "dp_ranks":
			spec.DPRanks, err = strconv.Atoi(v)
		case "worker":
			spec.Worker, err = strconv.ParseUint(v, 0, 64)
		case "block_size":
			spec.BlockSize, err = strconv.Atoi(v)
		case "url":
			spec.URL = v
		case "subject":
			spec.Subject = v
		case "stream":
			spec.Stream = v
		case "durable":
			spec.Durable = v
		case "max_message_bytes":
			spec.MaxMessageBytes, err = strconv.ParseInt(v, 0, 64)
		case "max_replay_bytes":
			spec.MaxReplayBytes, err = strconv.ParseInt(v, 0, 64)
		case "source_timeout":
			var d time.Duration
			d, err = time.ParseDuration(v)
			spec.SourceTimeout = Duration(d)
		case "image_token_id":
			var id uint64
			id, err = strconv.ParseUint(v, 0, 32)
			t := uint32(id)
			spec.ImageTokenID = &t
		case "video_token_id":
			var id uint64
			id, err = strconv.ParseUint(v, 0, 32)
			t := uint32(id)
			spec.VideoTokenID = &t
		case "fail_window":
			var d time.Duration
			d, err = time.ParseDuration(v)
			spec.FailWindow = Duration(d)
		case "max_namespace_blocks":
			spec.MaxNamespaceBlocks, err = strconv.Atoi(v)
		default:
			return errUnknownKey
		}
		return err
	})
	if err != nil {
		return "", SourceSpec{}, err
	}
	if spec.Engine == "" {
		return "", SourceSpec{}, invalid("source %q: engine=<vllm|sglang|trtllm|dynamo> is required", s)
	}
	return pool, spec, nil
}

// AddSource appends spec to the named pool of c.
func (c *Config) AddSource(pool string, spec SourceSpec) error {
	for i := range c.Pools {
		if c.Pools[i].Name == pool {
			c.Pools[i].Sources = append(c.Pools[i].Sources, spec)
			return nil
		}
	}
	return invalid("source for unknown pool %q", pool)
}
