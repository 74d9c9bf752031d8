package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the relay's Prometheus series. Counters the server sees
// directly are counted as they happen; pool gauges are read from each actor
// at scrape time by poolCollector.
type metrics struct {
	reg          *prometheus.Registry
	events       *prometheus.CounterVec
	blocks       *prometheus.CounterVec
	rejected     *prometheus.CounterVec
	publications *prometheus.CounterVec
	images       *prometheus.CounterVec
	lagged       *prometheus.CounterVec
	oversize     *prometheus.CounterVec
	stalled      *prometheus.CounterVec
	faults       *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_events_admitted_total", Help: "KV events admitted into a pool."}, []string{"pool"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_blocks_admitted_total", Help: "Blocks named by admitted events."}, []string{"pool"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_requests_rejected_total", Help: "HTTP requests rejected, by error code."}, []string{"code"}),
		publications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_publications_total", Help: "Deltas published by a pool."}, []string{"pool"}),
		images: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_bucket_images_total", Help: "Bucket images published by a pool."}, []string{"pool"}),
		lagged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_subscriber_lagged_total", Help: "Remote subscribers closed because they fell behind."}, []string{"pool"}),
		oversize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_stream_oversize_deltas_total", Help: "Streams closed for a resnapshot because a delta exceeded the frame limit."}, []string{"pool"}),
		stalled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_subscriber_stalled_total", Help: "Remote subscribers dropped because they stopped reading (peer window closed, no progress for stream_stall_timeout)."}, []string{"pool"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ckfrelay_faults_total", Help: "Pool faults by category."}, []string{"pool", "category"}),
	}
	m.reg.MustRegister(m.events, m.blocks, m.rejected, m.publications, m.images, m.lagged, m.oversize, m.stalled, m.faults,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// RegisterMetrics adds collectors of a component the server hosts (the gRPC
// listener) to the relay's /metrics.
func (s *Server) RegisterMetrics(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := s.m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// poolCollector reads each pool's actor statistics at scrape time.
type poolCollector struct {
	pools func() []*hostedPool

	unknown, capacity, tracked, resident, occupancy, mailbox, subscribers, sequence, dropped *prometheus.Desc
	// Exact-state bounds (SPEC §4.6) and source-epoch pruning (SPEC §7).
	limitRejections, epochsPruned *prometheus.Desc
	// The hub's shared memory: snapshot generations in flight and the
	// delta log (docs/limits.md).
	generations, generationBytes, logDeltas, logBytes *prometheus.Desc
}

func newPoolCollector(pools func() []*hostedPool) *poolCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"pool"}, nil)
	}
	return &poolCollector{
		pools:       pools,
		unknown:     d("ckfrelay_unknown_removals_total", "Removals of blocks the member did not hold."),
		capacity:    d("ckfrelay_capacity_omissions_total", "Insertions that found no room (blocks tracked, not resident)."),
		tracked:     d("ckfrelay_blocks_tracked", "Distinct canonical blocks with at least one owner."),
		resident:    d("ckfrelay_blocks_resident", "Canonical blocks whose fingerprint is in the filter."),
		occupancy:   d("ckfrelay_filter_occupancy_ratio", "Occupied slots / total slots."),
		mailbox:     d("ckfrelay_mailbox_depth", "Commands queued for the pool actor."),
		subscribers: d("ckfrelay_subscribers", "Remote subscribers attached to the pool's hub."),
		sequence:    d("ckfrelay_sequence", "The pool publisher's last sequence."),
		limitRejections: prometheus.NewDesc("ckfrelay_exact_state_limit_rejections_total",
			"Stored events refused by an exact-state bound (limit: max_members or max_tracked_blocks).", []string{"pool", "limit"}, nil),
		epochsPruned:    d("ckfrelay_source_epochs_pruned_total", "Idle source-epoch records pruned beyond the actor's bound."),
		generations:     d("ckfrelay_hub_snapshot_generations", "Snapshot generations held for subscribers reading a snapshot (at most snapshot_generations)."),
		generationBytes: d("ckfrelay_hub_snapshot_bytes", "Bytes of the snapshot generations held."),
		logDeltas:       d("ckfrelay_hub_log_deltas", "Deltas in the hub's shared log (at most subscriber_queue)."),
		logBytes:        d("ckfrelay_hub_log_bytes", "Bytes of the deltas in the hub's shared log (at most subscriber_queue_bytes)."),
		dropped: prometheus.NewDesc("ckfrelay_events_dropped_total",
			"Admitted events the actor dropped: from a superseded source epoch (stale_source_epoch), or refused as a fault (fault; see ckfrelay_faults_total).",
			[]string{"pool", "reason"}, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.unknown, c.capacity, c.tracked, c.resident, c.occupancy, c.mailbox, c.subscribers, c.sequence, c.dropped,
		c.generations, c.generationBytes, c.logDeltas, c.logBytes} {
		ch <- d
	}
	ch <- c.limitRejections
	ch <- c.epochsPruned
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.pools() {
		name := p.spec.Name
		ch <- prometheus.MustNewConstMetric(c.mailbox, prometheus.GaugeValue, float64(p.actor().MailboxDepth()), name)
		hs := p.mirror().Stats()
		ch <- prometheus.MustNewConstMetric(c.subscribers, prometheus.GaugeValue, float64(hs.Subscribers), name)
		ch <- prometheus.MustNewConstMetric(c.generations, prometheus.GaugeValue, float64(hs.SnapshotGenerations), name)
		ch <- prometheus.MustNewConstMetric(c.generationBytes, prometheus.GaugeValue, float64(hs.SnapshotBytes), name)
		ch <- prometheus.MustNewConstMetric(c.logDeltas, prometheus.GaugeValue, float64(hs.LogDeltas), name)
		ch <- prometheus.MustNewConstMetric(c.logBytes, prometheus.GaugeValue, float64(hs.LogBytes), name)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := p.actor().Stats(ctx)
		cancel()
		if err != nil {
			continue // a stopped actor has no statistics; its gauges vanish
		}
		ps := st.Pool
		ch <- prometheus.MustNewConstMetric(c.unknown, prometheus.CounterValue, float64(ps.UnknownRemovals), name)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.CounterValue, float64(ps.CapacityFailures), name)
		ch <- prometheus.MustNewConstMetric(c.tracked, prometheus.GaugeValue, float64(ps.UniqueBlocks), name)
		ch <- prometheus.MustNewConstMetric(c.resident, prometheus.GaugeValue, float64(ps.ResidentBlocks), name)
		slots := float64(ps.FilterBytes / 8 * 4)
		ch <- prometheus.MustNewConstMetric(c.occupancy, prometheus.GaugeValue, float64(ps.OccupiedSlots)/slots, name)
		ch <- prometheus.MustNewConstMetric(c.sequence, prometheus.GaugeValue, float64(st.Sequence), name)
		ch <- prometheus.MustNewConstMetric(c.limitRejections, prometheus.CounterValue, float64(ps.MemberLimitRejections), name, "max_members")
		ch <- prometheus.MustNewConstMetric(c.limitRejections, prometheus.CounterValue, float64(ps.TrackedBlockLimitRejections), name, "max_tracked_blocks")
		ch <- prometheus.MustNewConstMetric(c.epochsPruned, prometheus.CounterValue, float64(st.SourceEpochsPruned), name)
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.StaleEventsDropped), name, "stale_source_epoch")
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Faults), name, "fault")
	}
}
