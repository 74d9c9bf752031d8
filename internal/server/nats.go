package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/internal/natspub"
	"github.com/ckfrelay/ckfrelay/internal/source"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// NATSOut configures broadcasting every pool's frames through NATS JetStream
// (docs/deploy.md). Off while URL is empty.
type NATSOut struct {
	// URL of the NATS server(s), comma-separated (e.g. "nats://127.0.0.1:4222").
	URL string `json:"url,omitempty"`
	// Prefix of subjects, streams and buckets. Default "ckfrelay".
	Prefix string `json:"prefix,omitempty"`
	// SnapshotInterval is the snapshot refresh cadence; the frames stream
	// keeps three intervals. Default 30s.
	SnapshotInterval Duration `json:"snapshot_interval,omitempty"`
	// Replicas of each stream and bucket (a clustered JetStream). Default 1.
	Replicas int `json:"replicas,omitempty"`
	// CredsFile is a NATS credentials file, when the server requires one.
	CredsFile string `json:"creds_file,omitempty"`
}

func (o NATSOut) validate() error {
	if o.URL == "" {
		return nil
	}
	if _, err := natsjs.For(o.Prefix, "pool"); err != nil {
		return invalid("nats: %v", err)
	}
	if o.SnapshotInterval < 0 || o.Replicas < 0 {
		return invalid("nats: snapshot_interval and replicas must not be negative")
	}
	return nil
}

// natsOut is the running broadcast: one connection, one publisher per pool
// (with HA, per pool the current leader's).
type natsOut struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  natspub.Config // without Pool
	stop context.CancelFunc
	ctx  context.Context
	wg   sync.WaitGroup

	mu   sync.Mutex
	pubs map[string]*natspub.Publisher
}

// startNATS connects and starts a publisher per pool (a replicated pool's
// when it leads). The connection retries by itself (also when the server is
// down at start): the relay serves HTTP whatever NATS does.
func (s *Server) startNATS() error {
	o := s.cfg.NATS
	if o.URL == "" {
		return nil
	}
	opts := []nats.Option{nats.Name("ckfrelay"), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond)}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return fmt.Errorf("server: nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("server: nats: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	out := &natsOut{nc: nc, js: js, pubs: map[string]*natspub.Publisher{}, stop: stop, ctx: ctx,
		cfg: natspub.Config{Prefix: o.Prefix, SnapshotInterval: time.Duration(o.SnapshotInterval), Heartbeat: time.Duration(s.cfg.HeartbeatInterval),
			Replicas: o.Replicas, EndReason: closeReason, Logger: s.log}}
	for _, p := range s.order {
		if p.ha != nil {
			continue // its leader starts it (ha.go)
		}
		if err := out.start(p, p.mirror(), ctx, nil); err != nil {
			stop()
			nc.Close()
			return err
		}
	}
	s.nats = out
	s.m.reg.MustRegister(newNATSCollector(out))
	return nil
}

// start runs pool p's publisher of hub h until ctx ends or the hub closes;
// done, if set, is closed when it returned.
func (o *natsOut) start(p *hostedPool, h *hub.Hub, ctx context.Context, done chan struct{}) error {
	cfg := o.cfg
	cfg.Pool = p.spec.Name
	if p.ha != nil {
		// Checked before every publish: a leader resumed past its lease
		// publishes nothing more, even before its replica loop notices.
		cfg.Leading = p.ha.node.Leads
	}
	pub, err := natspub.New(o.js, h, cfg)
	if err != nil {
		return fmt.Errorf("server: nats: %w", err)
	}
	o.mu.Lock()
	o.pubs[p.spec.Name] = pub
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		if done != nil {
			defer close(done)
		}
		_ = pub.Run(ctx)
	}()
	return nil
}

// stopNATS waits for every publisher to publish its pool's end (the hubs are
// closed by then), bounded by ctx, then closes the connection.
func (s *Server) stopNATS(ctx context.Context) error {
	out := s.nats
	if out == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { out.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("server: nats publishers: %w", ctx.Err())
	}
	out.stop()
	<-done
	if ferr := out.nc.FlushTimeout(time.Second); ferr != nil && err == nil && !errors.Is(ferr, nats.ErrConnectionClosed) {
		err = fmt.Errorf("server: nats flush: %w", ferr)
	}
	out.nc.Close()
	return err
}

// NATSStats returns each pool's NATS publisher counters (nil when off).
func (s *Server) NATSStats() map[string]natspub.Stats {
	if s.nats == nil {
		return nil
	}
	s.nats.mu.Lock()
	defer s.nats.mu.Unlock()
	m := make(map[string]natspub.Stats, len(s.nats.pubs))
	for name, p := range s.nats.pubs {
		m[name] = p.Stats()
	}
	return m
}

// closeReason maps a hub's close cause to a close frame's reason, as HTTP
// streams do.
func closeReason(cause error) wire.CloseReason {
	switch {
	case errors.Is(cause, hub.ErrLagged):
		return wire.CloseLagged
	case errors.Is(cause, errShuttingDown):
		return wire.CloseShuttingDown
	case errors.Is(cause, errFenced), errors.Is(cause, hub.ErrSuperseded):
		return wire.CloseFenced
	}
	return wire.CloseProducerChanged
}

// newDynamoSource builds the source of a SourceSpec with engine "dynamo":
// Dynamo's KV events on NATS (docs/ingest.md "Dynamo over NATS"). The pool's
// source switch (sources.go) calls it for that engine, with the pool's
// max_members: the source tracks at most that many members.
func newDynamoSource(spec SourceSpec, cfg Config, maxMembers int) (source.Source, error) {
	if spec.URL == "" || spec.Subject == "" {
		return nil, invalid("dynamo source: url and subject are required")
	}
	if spec.Endpoint != "" || spec.Bind != "" || spec.Replay != "" || spec.ImageTokenID != nil || spec.VideoTokenID != nil || spec.FailWindow != 0 ||
		spec.MaxNamespaceBlocks != 0 || spec.MaxReplayBytes != 0 {
		return nil, invalid("dynamo source: endpoint, bind, replay, image_token_id, video_token_id, fail_window, max_namespace_blocks and max_replay_bytes are ZMQ fields")
	}
	s, err := dynamonats.New(dynamonats.Config{URL: spec.URL, Subject: spec.Subject, Stream: spec.Stream,
		Durable: spec.Durable, SourceTimeout: time.Duration(spec.SourceTimeout), MaxMembers: maxMembers,
		Limits: wire.BatchLimits{MaxEvents: cfg.MaxEventsPerBatch, MaxBlocksPerEvent: cfg.MaxBlocksPerEvent}})
	if err != nil {
		return nil, invalid("%v", err)
	}
	return s, nil
}

// natsCollector exports each pool's NATS publisher counters.
type natsCollector struct {
	out                                                     *natsOut
	deltas, heartbeats, snapshots, retries, resubs, snapSeq *prometheus.Desc
}

func newNATSCollector(out *natsOut) *natsCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"pool"}, nil)
	}
	return &natsCollector{out: out,
		deltas:     d("ckfrelay_nats_deltas_total", "Deltas published to the pool's JetStream stream."),
		heartbeats: d("ckfrelay_nats_heartbeats_total", "Heartbeats published to the pool's JetStream stream."),
		snapshots:  d("ckfrelay_nats_snapshots_total", "Snapshots written to the pool's object store bucket."),
		retries:    d("ckfrelay_nats_retries_total", "NATS publishes and snapshot writes retried after an error."),
		resubs:     d("ckfrelay_nats_resubscribes_total", "Times the NATS publisher restarted from a new hub snapshot (it lagged)."),
		snapSeq:    d("ckfrelay_nats_snapshot_sequence", "Sequence of the newest snapshot in the bucket."),
	}
}

func (c *natsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.deltas, c.heartbeats, c.snapshots, c.retries, c.resubs, c.snapSeq} {
		ch <- d
	}
}

func (c *natsCollector) Collect(ch chan<- prometheus.Metric) {
	c.out.mu.Lock()
	stats := make(map[string]natspub.Stats, len(c.out.pubs))
	for name, p := range c.out.pubs {
		stats[name] = p.Stats()
	}
	c.out.mu.Unlock()
	for name, st := range stats {
		ch <- prometheus.MustNewConstMetric(c.deltas, prometheus.CounterValue, float64(st.Deltas), name)
		ch <- prometheus.MustNewConstMetric(c.heartbeats, prometheus.CounterValue, float64(st.Heartbeats), name)
		ch <- prometheus.MustNewConstMetric(c.snapshots, prometheus.CounterValue, float64(st.Snapshots), name)
		ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(st.Retries), name)
		ch <- prometheus.MustNewConstMetric(c.resubs, prometheus.CounterValue, float64(st.Resubscribes), name)
		ch <- prometheus.MustNewConstMetric(c.snapSeq, prometheus.GaugeValue, float64(st.SnapshotSequence), name)
	}
}
