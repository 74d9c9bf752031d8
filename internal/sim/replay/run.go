package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// consumerInstance is the router consumer's instance id in every lease.
const consumerInstance = 7

// admit is one event admitted to a pool: when, and the canonical blocks it
// made resident in the pool's filter (in flight until its delta is visible).
type admit struct {
	at    time.Duration
	fresh []uint64
}

// outbound is a published delta on its way to the router.
type outbound struct {
	delta     ckf.Delta
	visibleAt time.Duration // trace time
	admits    []admit
	published time.Time // wall time
}

// sinkSlot is a producer.Sink that hands the one delta Publish enqueues back
// to the harness, which stamps it with its visibility time.
type sinkSlot struct {
	d   ckf.Delta
	has bool
}

func (s *sinkSlot) Enqueue(d ckf.Delta) error { s.d, s.has = d, true; return nil }

// dataCenter is one pool with its publisher, its pending window and its
// deltas in flight, plus the bookkeeping that explains under-reports.
type dataCenter struct {
	pool *ckf.Pool
	pub  *producer.Publisher
	sink sinkSlot

	window     []admit // admitted since the pool's last drain
	windowOpen bool
	windowAt   time.Duration // trace time of the window's first event
	queue      []outbound    // published, not yet visible; FIFO, visibleAt ascending

	inflight map[uint64]int32    // canonical → admitted-but-invisible residency gains
	omitted  map[uint64]struct{} // canonicals stored but left non-resident for capacity
}

// harness is one replay's state. It is owned by one goroutine.
type harness struct {
	cfg   Config
	fleet *workload.Fleet
	dcs   []*dataCenter
	cons  client.Lanes
	rep   Report // the harness's own figures; sc fills the scoring ones
	sc    *Scorer
	place *Placer // policy and latency model

	frame wire.Frame
	buf   []byte
	res   consumer.QueryResult

	now        time.Duration // trace clock
	before     []bool        // scratch: residency before an event
	deliveryNs []int64

	// The request being scored, for the Explainer methods: its chain, the
	// deepest true prefix, and the consumer's Contains mask per position of
	// that prefix (filled on the first under-report).
	chain    []uint64
	maxTruth int
	masks    []uint16
}

// Run replays reqs (in order; timestamps must not decrease) under cfg and
// returns the report. It stops early, returning ctx's error, when ctx ends.
// An error wrapping [ErrInvariant] means the pipeline disagreed with itself.
func Run(ctx context.Context, cfg Config, reqs []workload.Request) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h, err := newHarness(cfg)
	if err != nil {
		return nil, err
	}
	if err := h.run(ctx, reqs); err != nil {
		return nil, err
	}
	return &h.rep, nil
}

func newHarness(cfg Config) (*harness, error) {
	fleet, err := workload.NewFleet(workload.FleetConfig{DataCenters: cfg.DataCenters, WorkersPerDC: cfg.WorkersPerDC,
		RanksPerWorker: cfg.RanksPerWorker, BlocksPerRank: cfg.BlocksPerRank})
	if err != nil {
		return nil, &ConfigError{Field: "fleet", Reason: err.Error()}
	}
	pc := ckf.Config{ExpectedBlocks: cfg.expectedBlocks(), Seed: ckf.DefaultSeed, MaxKicks: ckf.DefaultMaxKicks,
		VerificationWindow: ckf.DefaultVerificationWindow, PublishEveryNEvents: cfg.PublishEveryNEvents}
	domain := ckf.Domain{
		CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{'c', 'k', 'f', 'r', 'e', 'p', 'l', 'a', 'y'}, Source: ckf.DigestExplicit},
		RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{'s', 'c', 'o', 'p', 'e'}, Source: ckf.DigestExplicit},
	}
	h := &harness{cfg: cfg, fleet: fleet}
	h.place = NewPlacer(cfg, fleet)
	if h.sc, err = NewScorer(cfg.DataCenters, h); err != nil {
		return nil, err
	}
	var m consumer.Manifest
	for d := range cfg.DataCenters {
		pool, err := ckf.NewPool(pc)
		if err != nil {
			return nil, &ConfigError{Field: "expected blocks", Reason: err.Error()}
		}
		id := ckf.PoolID{Domain: domain, DCID: uint64(d + 1)}
		dc := &dataCenter{pool: pool, inflight: make(map[uint64]int32), omitted: make(map[uint64]struct{})}
		dc.pub = producer.NewPublisher(producer.Scope{Pool: id, ProducerIncarnation: 1, LayoutGeneration: 1}.Identity(pool.Format()), 0, &dc.sink)
		h.dcs = append(h.dcs, dc)
		m.Lanes[d] = &id
	}
	m.ConsumerInstance, m.Domain, m.Format = consumerInstance, domain, h.dcs[0].pool.Format()
	m.VerificationWindow = ckf.DefaultVerificationWindow
	newConsumer := cfg.NewConsumer
	if newConsumer == nil {
		newConsumer = func(m consumer.Manifest) (client.Lanes, error) { return client.NewNative(m) }
	}
	if h.cons, err = newConsumer(m); err != nil {
		return nil, fmt.Errorf("replay: consumer: %w", err)
	}
	// Subscribe every lane: assign, barrier snapshot, chunk frames as bytes.
	for d, dc := range h.dcs {
		lease := ckf.LaneLease{ConsumerInstance: consumerInstance, PhysicalLane: uint8(d), AssignmentEpoch: 1}
		if err := h.cons.Assign(dc.pub.Identity(), lease); err != nil {
			return nil, fmt.Errorf("%w: assign lane %d: %v", ErrInvariant, d, err)
		}
		snap, err := dc.pub.SnapshotAfterBarrier(dc.pool, lease)
		if err != nil {
			return nil, fmt.Errorf("%w: snapshot dc %d: %v", ErrInvariant, d, err)
		}
		chunks, err := wire.SplitSnapshot(&snap, 0)
		if err != nil {
			return nil, fmt.Errorf("%w: split snapshot: %v", ErrInvariant, err)
		}
		for i := range chunks {
			h.frame = wire.Frame{Kind: wire.KindSnapshotChunk, Snapshot: chunks[i]}
			want := consumer.SnapshotChunkAccepted
			if i == len(chunks)-1 {
				want = consumer.SnapshotInstalled
			}
			if err := h.apply(want); err != nil {
				return nil, err
			}
		}
	}
	h.rep = Report{Policy: cfg.Policy.String(), Exact: cfg.Exact, DataCenters: cfg.DataCenters,
		RanksPerDC: fleet.Ranks(), BlocksPerRank: cfg.BlocksPerRank, ExpectedBlocks: cfg.expectedBlocks(),
		BucketCount: m.Format.BucketCount}
	return h, nil
}

// apply encodes h.frame and applies the bytes to the consumer, expecting want.
func (h *harness) apply(want consumer.Outcome) error {
	var err error
	if h.buf, err = wire.AppendFrame(h.buf[:0], &h.frame); err != nil {
		return fmt.Errorf("%w: encode: %v", ErrInvariant, err)
	}
	h.rep.FrameBytes += uint64(len(h.buf))
	res, err := h.cons.ApplyFrame(h.buf)
	if err != nil {
		return fmt.Errorf("%w: consumer refused a %v frame: %v", ErrInvariant, h.frame.Kind, err)
	}
	if res.Outcome != want {
		return fmt.Errorf("%w: consumer answered %v to a %v frame, want %v", ErrInvariant, res, h.frame.Kind, want)
	}
	return nil
}

func (h *harness) run(ctx context.Context, reqs []workload.Request) error {
	start := time.Now()
	nextTick := start.Add(time.Second)
	var last Progress
	mark := 0
	var events []ckf.RouterEvent
	var locals []uint64
	var chain []uint64
	truth := make([]int, h.cfg.DataCenters)
	reported := make([]int, h.cfg.DataCenters)
	for i := range reqs {
		if err := ctx.Err(); err != nil {
			return err
		}
		req := &reqs[i]
		at := time.Duration(req.TimestampMs) * time.Millisecond
		if at < h.now {
			return &ConfigError{Field: "trace", Reason: fmt.Sprintf("request %d at %v before the previous one at %v", i, at, h.now)}
		}
		if h.cfg.Speed > 0 {
			if err := sleepUntil(ctx, start.Add(time.Duration(float64(at)/h.cfg.Speed))); err != nil {
				return err
			}
		}
		if err := h.advance(at); err != nil {
			return err
		}
		locals = locals[:0]
		for _, id := range req.HashIDs {
			locals = append(locals, workload.TokensHash(id))
		}
		chain = ckf.AppendSequenceHashes(chain[:0], locals)
		query, err := h.query(chain, truth, reported)
		if err != nil {
			return err
		}
		chosen := Deepest(reported, h.place.Served()) // the router's answer, before this request counts
		pl := h.place.Place(i, at, req, chain, reported)
		if err := h.score(chain, truth, reported, chosen, pl.DC, query); err != nil {
			return err
		}
		if err := h.serve(pl, chain, locals, &events); err != nil {
			return err
		}
		if err := h.advance(at); err != nil { // lag 0: visible before the next query
			return err
		}
		if h.cfg.Progress != nil {
			if now := time.Now(); !now.Before(nextTick) {
				var p Progress
				p, mark = h.progress(now.Sub(start), mark)
				dt := (p.Elapsed - last.Elapsed).Seconds()
				p.EventsPerSec = float64(p.Events-last.Events) / dt
				p.BlocksPerSec = float64(p.Blocks-last.Blocks) / dt
				h.cfg.Progress(p)
				last = p
				nextTick = now.Add(time.Second)
			}
		}
	}
	wall := time.Since(start)
	// Drain: publish every tail and deliver everything, then the lanes must
	// hold exactly their pools' words.
	for _, dc := range h.dcs {
		if dc.windowOpen {
			if err := h.publish(dc, dc.pool.Flush(), h.now); err != nil {
				return err
			}
		}
	}
	if err := h.advance(math.MaxInt64); err != nil {
		return err
	}
	if err := h.verifyLanes(); err != nil {
		return err
	}
	h.finish(wall)
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// advance moves the trace clock to t: every publication timer that expires
// by t fires (at its own expiry time), and every delta visible by t is
// applied to the consumer, in order.
func (h *harness) advance(t time.Duration) error {
	if t != math.MaxInt64 {
		h.now = t
	}
	for _, dc := range h.dcs {
		if dc.windowOpen && dc.windowAt+h.cfg.PublicationDelay <= t {
			if err := h.publish(dc, dc.pool.Flush(), dc.windowAt+h.cfg.PublicationDelay); err != nil {
				return err
			}
		}
		n := 0
		for ; n < len(dc.queue) && dc.queue[n].visibleAt <= t; n++ {
			o := &dc.queue[n]
			h.frame = wire.Frame{Kind: wire.KindDelta, Delta: o.delta}
			if err := h.apply(consumer.Applied); err != nil {
				return err
			}
			h.deliveryNs = append(h.deliveryNs, time.Since(o.published).Nanoseconds())
			for _, a := range o.admits {
				if len(a.fresh) > 0 {
					h.sc.ObserveFreshness(o.visibleAt - a.at)
				}
			}
			h.release(dc, o.admits)
			*o = outbound{}
		}
		dc.queue = append(dc.queue[:0], dc.queue[n:]...)
	}
	return nil
}

// publish sequences a drained batch at trace time at. A nil batch (nothing
// net-changed) makes the window's admissions visible at once.
func (h *harness) publish(dc *dataCenter, b *ckf.Batch, at time.Duration) error {
	admits := dc.window
	dc.window, dc.windowOpen = nil, false
	if b == nil {
		h.release(dc, admits)
		return nil
	}
	out, err := dc.pub.Publish(b)
	if err != nil || !out.Published || !dc.sink.has {
		return fmt.Errorf("%w: publish: %+v %v", ErrInvariant, out, err)
	}
	h.rep.Deltas++
	h.rep.Images += uint64(out.ImageCount)
	dc.queue = append(dc.queue, outbound{delta: dc.sink.d, visibleAt: at + h.cfg.Lag, admits: admits, published: time.Now()})
	dc.sink = sinkSlot{}
	return nil
}

func (h *harness) release(dc *dataCenter, admits []admit) {
	for _, a := range admits {
		for _, c := range a.fresh {
			if dc.inflight[c]--; dc.inflight[c] <= 0 {
				delete(dc.inflight, c)
			}
		}
	}
}

// query asks the router for every lane's depth of chain (or the exact
// index, with Config.Exact) and computes the exact truth per data center.
// It returns how long the router's answer took.
func (h *harness) query(chain []uint64, truth, reported []int) (time.Duration, error) {
	n := len(chain)
	t0 := time.Now()
	if h.cfg.Exact {
		for d, dc := range h.dcs {
			k := 0
			for k < n {
				if owners, _ := dc.pool.Owners(chain[k]); owners == 0 {
					break
				}
				k++
			}
			reported[d] = k
		}
	} else if n > 0 {
		if err := h.cons.QuerySequenceHashes(chain, &h.res); err != nil {
			return 0, fmt.Errorf("%w: query: %v", ErrInvariant, err)
		}
		for d := range h.dcs {
			if h.res.Mask&(1<<d) == 0 {
				return 0, fmt.Errorf("%w: lane %d not ready", ErrInvariant, d)
			}
			reported[d] = int(h.res.Depths[d])
		}
	} else {
		clear(reported)
	}
	took := time.Since(t0)
	for d := range h.dcs {
		truth[d] = h.fleet.Depth(d, chain)
	}
	return took, nil
}

// score hands one request to the scorer: chosen is the router's pick (the
// deepest reported lane, ties to the data center that served the fewest
// requests), served where the policy placed it.
func (h *harness) score(chain []uint64, truth, reported []int, chosen, served int, query time.Duration) error {
	h.chain, h.maxTruth, h.masks = chain, 0, h.masks[:0]
	for d := range h.dcs {
		h.maxTruth = max(h.maxTruth, truth[d])
	}
	return h.sc.Observe(truth, reported, chosen, served, len(chain), query)
}

// ExplainOver implements [Explainer]: an over-report whose first missing
// block the pool's own filter holds is a false positive the producer
// published; otherwise the block's removal is still in flight.
func (h *harness) ExplainOver(d, truth int) (Cause, error) {
	if h.dcs[d].pool.Contains(h.chain[truth]) {
		return CauseFalsePositive, nil
	}
	return CauseStale, nil
}

// ExplainUnder implements [Explainer]: every block of the true prefix the
// lane lacks must be a counted capacity omission or in flight, and at least
// one must be lacking. The exact index has no excuse.
func (h *harness) ExplainUnder(d, _, truth int) (Cause, error) {
	if h.cfg.Exact {
		return CauseUnexplained, nil
	}
	if len(h.masks) == 0 { // once per request: Contains per position, all lanes
		for p := range h.maxTruth {
			m, err := h.cons.Contains(h.chain[p])
			if err != nil {
				return 0, fmt.Errorf("%w: contains: %v", ErrInvariant, err)
			}
			h.masks = append(h.masks, m)
		}
	}
	dc := h.dcs[d]
	var c Cause
	holes, unexplained := 0, false
	for p, b := range h.chain[:truth] {
		if h.masks[p]&(1<<d) != 0 {
			continue
		}
		holes++
		if _, ok := dc.omitted[b]; ok {
			if owners, resident := dc.pool.Owners(b); owners > 0 && !resident {
				c |= CauseCapacity
				continue
			}
		}
		if dc.inflight[b] > 0 {
			c |= CauseInFlight
			continue
		}
		unexplained = true
	}
	if holes == 0 || unexplained {
		c |= CauseUnexplained
	}
	return c, nil
}

// serve runs the request on the placement's rank and admits the events it
// emits to the data center's pool.
func (h *harness) serve(pl Placement, chain, locals []uint64, events *[]ckf.RouterEvent) error {
	d, r, k := pl.DC, pl.Rank, pl.RankDepth
	dc := h.dcs[d]
	*events = h.fleet.Serve((*events)[:0], d, r, chain, locals)
	for i := range *events {
		ev := &(*events)[i]
		var canon []uint64
		var before []bool
		if ev.Kind == ckf.EventStored {
			canon = chain[k : k+len(ev.Blocks)]
			before = h.before[:0]
			for _, c := range canon {
				_, res := dc.pool.Owners(c)
				before = append(before, res)
			}
			h.before = before
		}
		out := dc.pool.ApplyEvent(ev)
		if out.FirstError != nil && !errors.Is(out.FirstError, ckf.ErrCapacityExhausted) {
			return fmt.Errorf("%w: dc %d rejected a fleet event: %v", ErrInvariant, d, out.FirstError)
		}
		h.rep.Events++
		h.rep.EventBlocks += uint64(ev.BlockCount())
		var fresh []uint64
		for j, c := range canon {
			owners, res := dc.pool.Owners(c)
			switch {
			case res:
				delete(dc.omitted, c)
				if !before[j] {
					fresh = append(fresh, c)
				}
			case owners > 0:
				if _, ok := dc.omitted[c]; !ok {
					dc.omitted[c] = struct{}{}
					h.rep.CapacityOmissions++
				}
			}
		}
		if !h.cfg.testSkipInflight {
			for _, c := range fresh {
				dc.inflight[c]++
			}
		} else {
			fresh = nil
		}
		if !dc.windowOpen {
			dc.windowOpen, dc.windowAt = true, h.now
		}
		dc.window = append(dc.window, admit{at: h.now, fresh: fresh})
		if out.PublicationBoundary {
			if err := h.publish(dc, out.Batch, h.now); err != nil {
				return err
			}
		}
	}
	return nil
}

// verifyLanes checks, after the final drain, that every lane holds exactly
// its pool's words: the whole stream arrived and applied byte for byte.
func (h *harness) verifyLanes() error {
	var words []uint64
	for d, dc := range h.dcs {
		var err error
		if words, err = h.cons.AppendLaneWords(words[:0], d); err != nil {
			return fmt.Errorf("%w: lane %d words: %v", ErrInvariant, d, err)
		}
		if !slices.Equal(words, dc.pool.Words()) {
			return fmt.Errorf("%w: lane %d words differ from its pool after the final drain", ErrInvariant, d)
		}
	}
	return nil
}

// finish fills the report's rates, percentiles, FPR and memory.
func (h *harness) finish(wall time.Duration) {
	r := &h.rep
	loads := make([]float64, len(h.dcs))
	for d, dc := range h.dcs {
		loads[d] = float64(dc.pool.Stats().OccupiedSlots) / float64(4*r.BucketCount)
	}
	// A consumer that fails a Contains probe stops the probing; the rate
	// counts the missing probes as misses.
	_ = h.sc.ProbeFPR(h.cons.Contains, loads, h.cfg.FPRProbes, h.cfg.Seed)
	h.sc.Fill(r)
	h.place.Fill(r)
	r.TraceSeconds = h.now.Seconds()
	r.WallSeconds = wall.Seconds()
	if s := wall.Seconds(); s > 0 {
		r.EventsPerSec = float64(r.Events) / s
		r.BlocksPerSec = float64(r.EventBlocks) / s
	}
	r.DeliveryP50Ns, r.DeliveryP99Ns = Percentile(h.deliveryNs, 0.50), Percentile(h.deliveryNs, 0.99)

	var exact uint64
	for d, dc := range h.dcs {
		st := dc.pool.Stats()
		r.TrackedBlocks += uint64(st.UniqueBlocks)
		r.ProducerBytes += st.FilterBytes + st.DirtyTrackingBytes + st.ExactStateBytes
		exact += st.ExactStateBytes
		r.HeldBlocks += uint64(h.fleet.HeldBlocks(d))
	}
	if r.TrackedBlocks > 0 {
		r.ProducerBytesPerBlock = float64(r.ProducerBytes) / float64(r.TrackedBlocks)
		r.ExactStateBytesPerBlock = float64(exact) / float64(r.TrackedBlocks)
	}
	if st, err := h.cons.Stats(); err == nil {
		r.ConsumerBytes = st.TableBytes
	}
}

// progress returns the running view over the queries since mark, and the
// next mark.
func (h *harness) progress(elapsed time.Duration, mark int) (Progress, int) {
	inflight := 0
	for _, dc := range h.dcs {
		inflight += len(dc.queue)
	}
	p50, p99, next := h.sc.QueryWindow(mark)
	return Progress{Elapsed: elapsed, TraceTime: h.now, Requests: h.sc.Requests(), Events: h.rep.Events,
		Blocks: h.rep.EventBlocks, AgreementPct: h.sc.AgreementPct(),
		InFlight: inflight, QueryP50: p50, QueryP99: p99}, next
}

// Percentile returns the p-quantile of ns (nearest rank); 0 when empty.
// Every percentile of a [Report] is this one, the demo's included.
func Percentile(ns []int64, p float64) int64 {
	if len(ns) == 0 {
		return 0
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
