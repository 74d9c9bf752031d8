package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

const testConsumer = 7

var (
	testDomain = ckf.Domain{
		CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}, Source: ckf.DigestExplicit},
		RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{2}, Source: ckf.DigestExplicit},
	}
	testPool   = ckf.PoolID{Domain: testDomain, DCID: 1}
	testFormat = ckf.NewFormat(ckf.DefaultSeed, 64)
	testID     = ckf.ProducerIdentity{Pool: testPool, ProducerIncarnation: 1, LayoutGeneration: 1, Format: testFormat}
)

func newNative(t *testing.T) *Native {
	t.Helper()
	m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: testDomain, Format: testFormat, VerificationWindow: 2}
	m.Lanes[0] = &testPool
	n, err := NewNative(m)
	require.NoError(t, err, "NewNative")
	return n
}

// session is one stream request the fake relay saw. Frames are written by
// the handler's own goroutine: write hands it a function and waits.
type session struct {
	lane  int
	epoch uint64
	body  io.Writer // the response, for writes (on the handler goroutine) past the writer's frame limit
	ops   chan func(w *wire.Writer) error
	errs  chan error
	done  <-chan struct{} // the request's context
}

// write runs fn on the handler goroutine and flushes.
func (s session) write(t *testing.T, fn func(w *wire.Writer) error) {
	t.Helper()
	select {
	case s.ops <- fn:
	case <-s.done:
		require.Fail(t, "stream ended before the write")
	}
	require.NoError(t, <-s.errs, "fake relay write")
}

func (s session) frame(t *testing.T, f wire.Frame) {
	t.Helper()
	s.write(t, func(w *wire.Writer) error { return w.WriteFrame(&f) })
}

// fakeRelay serves /v1/pools/p/stream by handing each request to the test
// through a channel; the handler then runs the test's writes until the
// request ends or the test sends on release.
func fakeRelay(t *testing.T) (url string, sessions <-chan session, release chan<- struct{}) {
	t.Helper()
	sc := make(chan session)
	rel := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		epoch, err := strconv.ParseUint(r.URL.Query().Get("epoch"), 10, 64)
		lane, lerr := strconv.Atoi(r.URL.Query().Get("lane"))
		if err != nil || lerr != nil || r.URL.Query().Get("consumer") != strconv.Itoa(testConsumer) {
			http.Error(w, "bad query", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		s := session{lane: lane, epoch: epoch, body: w, ops: make(chan func(*wire.Writer) error), errs: make(chan error, 1), done: r.Context().Done()}
		select {
		case sc <- s:
		case <-r.Context().Done():
			return
		}
		fw := wire.NewWriter(w, 0)
		for {
			select {
			case fn := <-s.ops:
				err := fn(fw)
				if err == nil {
					err = rc.Flush()
				}
				s.errs <- err
			case <-rel:
				return
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, sc, rel
}

func startRouter(t *testing.T, cfg Config, lanes Lanes) *Router {
	t.Helper()
	r, err := New(cfg, lanes)
	require.NoError(t, err, "New")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done // Run must return: no session goroutine outlives it
	})
	return r
}

func lease(epoch uint64) ckf.LaneLease {
	return ckf.LaneLease{ConsumerInstance: testConsumer, PhysicalLane: 0, AssignmentEpoch: epoch}
}

func words(seed uint64) []uint64 {
	w := make([]uint64, testFormat.BucketCount)
	for i := range w {
		w[i] = seed*1000 + uint64(i)
	}
	return w
}

func nextSession(t *testing.T, sessions <-chan session) session {
	t.Helper()
	select {
	case s := <-sessions:
		return s
	case <-time.After(30 * time.Second):
		require.Fail(t, "router did not open a stream")
		return session{}
	}
}

func TestBackoff_BoundsAndGrowth(t *testing.T) {
	lo, hi := 10*time.Millisecond, 640*time.Millisecond
	tests := []struct {
		failures int
		ceil     time.Duration
	}{
		{0, 10 * time.Millisecond},
		{1, 20 * time.Millisecond},
		{3, 80 * time.Millisecond},
		{6, 640 * time.Millisecond},
		{7, 640 * time.Millisecond},
		{29, 640 * time.Millisecond},
		{63, 640 * time.Millisecond}, // a shift that would overflow
		{1000, 640 * time.Millisecond},
	}
	for _, tt := range tests {
		var top time.Duration
		for range 2000 {
			d := backoff(lo, hi, tt.failures)
			require.GreaterOrEqual(t, d, time.Duration(0), "backoff(%v, %v, %d) = %v, want within [0, %v]", lo, hi, tt.failures, d, tt.ceil)
			require.LessOrEqual(t, d, tt.ceil, "backoff(%v, %v, %d) = %v, want within [0, %v]", lo, hi, tt.failures, d, tt.ceil)
			top = max(top, d)
		}
		// Full jitter spreads over the whole range: 2000 uniform draws all
		// below half the ceiling has probability 2^-2000.
		assert.Greater(t, top, tt.ceil/2, "backoff(%d failures): max of 2000 draws %v, want > %v (jitter spans the range)", tt.failures, top, tt.ceil/2)
	}
}

func TestNew_RejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no url", Config{Targets: []Target{{Pool: "p", Lane: 0}}}},
		{"no targets", Config{Relays: []Relay{{Addrs: []string{"http://x"}}}}},
		{"lane too high", Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Pool: "p", Lane: 16}}}},
		{"negative lane", Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Pool: "p", Lane: -1}}}},
		{"duplicate lane", Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Pool: "p", Lane: 1}, {Pool: "q", Lane: 1}}}},
		{"unnamed pool", Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Lane: 1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg, nil)
			assert.Error(t, err, "New(%+v)", tt.cfg)
		})
	}
}

func TestRouter_LaneOutOfRangeIsZero(t *testing.T) {
	r, err := New(Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Pool: "p", Lane: 0}}}, newNative(t))
	require.NoError(t, err)
	for _, lane := range []int{-1, 16, 1 << 30} {
		got := r.Lane(lane)
		assert.False(t, got != (LaneInfo{}), "Lane(%d) = %+v, want the zero LaneInfo", lane, got)
	}
}

// A gap deactivates the lane; the router retires it and resubscribes with a
// higher epoch, and the new snapshot converges it. A close frame does the
// same, and epochs keep growing.
func TestRouter_DeactivationResubscribesWithHigherEpoch(t *testing.T) {
	url, sessions, release := fakeRelay(t)
	lanes := newNative(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, lanes)

	// Session 1: snapshot at 5, then a delta from 7: a gap.
	s1 := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s1.epoch), Sequence: 5, Words: words(1)}
	s1.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	s1.frame(t, wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testID, Lease: lease(s1.epoch), BaseSequence: 7, Sequence: 8,
		Images: []ckf.BucketImage{{Bucket: 3, Word: 42}}}})

	// Session 2 starts only after session 1 ended and was recorded.
	s2 := nextSession(t, sessions)
	require.Greater(t, s2.epoch, s1.epoch, "second epoch %d, want > first %d", s2.epoch, s1.epoch)
	li := r.Lane(0)
	require.Contains(t, li.LastError, ErrDeactivated.Error(), "after the gap")
	require.Equal(t, uint64(1), li.Resubscribes, "after the gap")
	require.False(t, li.Ready, "after the gap")
	<-s1.done // the router closed the first stream

	// Session 2: a snapshot at 9 and a delta to 10, then a close frame.
	snap2 := ckf.Snapshot{Identity: testID, Lease: lease(s2.epoch), Sequence: 9, Words: words(2)}
	want := words(2)
	want[5] = 99
	s2.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap2) })
	s2.frame(t, wire.Frame{Kind: wire.KindDelta, Delta: ckf.Delta{Identity: testID, Lease: lease(s2.epoch), BaseSequence: 9, Sequence: 10,
		Images: []ckf.BucketImage{{Bucket: 5, Word: 99}}}})
	// Check convergence before the close frame: the retire that follows it
	// forgets the lane's words.
	waitFor(t, func() bool { return r.Lane(0).Sequence == 10 })
	got, seq, err := r.AppendLaneWords(nil, 0)
	require.NoError(t, err, "lane words after resubscribe")
	require.Equal(t, uint64(10), seq, "lane words after resubscribe: sequence")
	require.Equal(t, want, got, "lane words after resubscribe: the second snapshot plus the delta at 10")
	s2.frame(t, wire.Frame{Kind: wire.KindClose, Close: wire.Close{Reason: wire.CloseShuttingDown, Message: "bye"}})

	s3 := nextSession(t, sessions)
	require.Greater(t, s3.epoch, s2.epoch, "third epoch %d, want > second %d", s3.epoch, s2.epoch)
	li = r.Lane(0)
	require.Contains(t, li.LastError, ErrStreamClosed.Error(), "after the close frame")
	require.Equal(t, uint64(2), li.Resubscribes, "after the close frame")
	release <- struct{}{}
}

// A stream that goes silent (no heartbeat) is abandoned after IdleTimeout.
func TestRouter_IdleStreamResubscribes(t *testing.T) {
	url, sessions, _ := fakeRelay(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: 50 * time.Millisecond}, newNative(t))
	s1 := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s1.epoch), Sequence: 1, Words: words(1)}
	s1.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	s2 := nextSession(t, sessions) // the handler of s1 still holds its stream open
	require.Greater(t, s2.epoch, s1.epoch, "epoch after idle %d, want > %d", s2.epoch, s1.epoch)
	li := r.Lane(0)
	require.Contains(t, li.LastError, ErrIdle.Error(), "LastError %q, want it to name %q", li.LastError, ErrIdle)
}

// A refusal (HTTP error) is reported and retried, never spun on.
func TestRouter_HTTPErrorIsRetried(t *testing.T) {
	calls := make(chan uint64, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e, _ := strconv.ParseUint(r.URL.Query().Get("epoch"), 10, 64)
		select {
		case calls <- e:
		default:
		}
		http.Error(w, `{"error":{"code":"unknown_pool"}}`, http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{srv.URL}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}, newNative(t))
	var prev uint64
	for i := range 3 {
		e := <-calls
		require.Greater(t, e, prev, "attempt %d epoch %d, want > %d", i, e, prev)
		prev = e
	}
	waitFor(t, func() bool { return strings.Contains(r.Lane(0).LastError, "404") })
	li := r.Lane(0)
	assert.False(t, li.Ready, "ready")
	assert.False(t, li.Connected, "connected")
}

// waitFor polls a condition the router reaches asynchronously; it is for
// observing an end state, not for ordering.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "condition not reached in 30s")
		time.Sleep(time.Millisecond)
	}
}

// TestRouter_StopIsNotAResubscribe: stopping the router retires its lanes
// (nobody keeps them fresh any more) but counts no resubscribe.
func TestRouter_StopIsNotAResubscribe(t *testing.T) {
	url, sessions, _ := fakeRelay(t)
	lanes := newNative(t)
	r, err := New(Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, lanes)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	s := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s.epoch), Sequence: 5, Words: words(1)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
	cancel()
	<-done
	li := r.Lane(0)
	require.Zero(t, li.Resubscribes, "after stop")
	require.False(t, li.Ready, "after stop")
	require.Empty(t, li.LastError, "after stop")
	_, err = lanes.Contains(1)
	require.Error(t, err, "a stopped router's lane still answers queries")
}

func TestNextFailures_OnlyLongInstalledSessionsReset(t *testing.T) {
	const healthy = time.Second
	tests := []struct {
		name     string
		failures int
		lived    time.Duration
		want     int
	}{
		{"no snapshot", 3, -1, 3},
		{"no snapshot, first failure", 0, -1, 0},
		{"installed, dropped at once", 3, 0, 3},
		{"installed, dropped just short", 5, healthy - 1, 5},
		{"installed, lived exactly healthy", 5, healthy, 0},
		{"installed, lived long", 9, time.Hour, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := nextFailures(tt.failures, tt.lived, healthy)
			assert.Equal(t, tt.want, got, "nextFailures(%d, %v, %v) = %d, want %d", tt.failures, tt.lived, healthy, got, tt.want)
		})
	}
}

func TestNew_HealthySessionDefault(t *testing.T) {
	for _, tt := range []struct {
		maxBackoff, healthy, want time.Duration
	}{
		{0, 0, 5 * time.Second}, // MaxBackoff defaults to 5s
		{2 * time.Millisecond, 0, time.Second},
		{30 * time.Second, -1, 30 * time.Second},
		{2 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond},
	} {
		r, err := New(Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, Targets: []Target{{Pool: "p"}}, MinBackoff: time.Millisecond,
			MaxBackoff: tt.maxBackoff, HealthySession: tt.healthy}, nil)
		require.NoError(t, err)
		assert.Equal(t, tt.want, r.cfg.HealthySession, "MaxBackoff %v, HealthySession %v: got %v, want %v", tt.maxBackoff, tt.healthy, r.cfg.HealthySession, tt.want)
	}
}

// A relay that ends every stream right after its snapshot must not get a
// re-snapshot storm: sessions that installed but did not last HealthySession
// count as failures, so the backoff ceiling keeps doubling. With a
// HealthySession they do last, it stays at MinBackoff.
func TestRouter_ShortInstalledSessionsBackOff(t *testing.T) {
	const sessionsRun = 5
	for _, tt := range []struct {
		name    string
		healthy time.Duration
		want    []time.Duration
	}{
		{"short sessions", time.Hour, []time.Duration{1, 2, 4, 8, 16}},
		{"healthy sessions", time.Nanosecond, []time.Duration{1, 1, 1, 1, 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, sessions, release := fakeRelay(t)
			r, err := New(Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
				MinBackoff: time.Millisecond, MaxBackoff: time.Second, HealthySession: tt.healthy, IdleTimeout: -1}, newNative(t))
			require.NoError(t, err)
			ceils := make(chan time.Duration, sessionsRun+1)
			r.onBackoff = func(_ int, c time.Duration) { ceils <- c }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = r.Run(ctx)
			}()
			defer func() { cancel(); <-done }()
			for i := range sessionsRun {
				s := nextSession(t, sessions)
				snap := ckf.Snapshot{Identity: testID, Lease: lease(s.epoch), Sequence: uint64(i + 1), Words: words(1)}
				s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
				release <- struct{}{} // the relay drops the stream right after the snapshot
				c := <-ceils
				require.Equal(t, tt.want[i]*time.Millisecond, c, "after installed session %d: backoff ceiling %v, want %v", i+1, c, tt.want[i]*time.Millisecond)
			}
			li := r.Lane(0)
			assert.GreaterOrEqual(t, li.FramesApplied, uint64(sessionsRun), "frames applied %d, want every session's snapshot installed (≥ %d)", li.FramesApplied, sessionsRun)
		})
	}
}

// TestRouter_PinnedFormatMismatchStopsTheLane: a pool serving another format
// than the manifest pins (a version-1 manifest's one format; the pool was
// resized) stops the lane with a typed error in its status instead of
// resubscribing forever: no resubscribe, no backoff, the error matches
// consumer.ErrFormatMismatch and names the pool's format.
func TestRouter_PinnedFormatMismatchStopsTheLane(t *testing.T) {
	url, sessions, _ := fakeRelay(t)
	lanes := newNative(t) // pins testFormat
	r, err := New(Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, lanes)
	require.NoError(t, err)
	var backoffs atomic.Int32
	r.onBackoff = func(int, time.Duration) { backoffs.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	defer func() { cancel(); <-done }()

	resized := testID
	resized.Format = ckf.NewFormat(ckf.DefaultSeed, 4096)
	s := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: resized, Lease: lease(s.epoch), Sequence: 5, Words: make([]uint64, 4096)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).LastError != "" })
	li := r.Lane(0)
	require.Zero(t, li.Resubscribes, "a refused format is not retried")
	require.Zero(t, backoffs.Load(), "no resubscribe delay was drawn")
	require.False(t, li.Ready)
	var mismatch *FormatMismatchError
	require.ErrorAs(t, li.Stopped, &mismatch)
	require.ErrorIs(t, li.Stopped, consumer.ErrFormatMismatch)
	require.Equal(t, resized.Format, mismatch.Format)
	require.Equal(t, 0, mismatch.Lane)
	require.Contains(t, li.LastError, "4096 buckets")
	<-s.done // the router closed the stream
}

// TestRouter_InvalidFormatIsRetried: a relay sending an invalid format (a
// bucket count that is no power of two) is refused by the consumer with the
// same sentinel as a pinned mismatch, but it is the relay's fault and may
// pass, so the lane resubscribes instead of stopping.
func TestRouter_InvalidFormatIsRetried(t *testing.T) {
	url, sessions, _ := fakeRelay(t)
	m := consumer.Manifest{ConsumerInstance: testConsumer, Domain: testDomain, VerificationWindow: 2} // no pin
	m.Lanes[0] = &testPool
	lanes, err := NewNative(m)
	require.NoError(t, err)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{url}}}, ConsumerInstance: testConsumer, Targets: []Target{{Pool: "p", Lane: 0}},
		MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, IdleTimeout: -1}, lanes)
	bad := testID
	bad.Format.BucketCount = 96
	s := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: bad, Lease: lease(s.epoch), Sequence: 5, Words: make([]uint64, 96)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	s2 := nextSession(t, sessions) // resubscribed
	require.Greater(t, s2.epoch, s.epoch)
	li := r.Lane(0)
	require.Nil(t, li.Stopped)
	require.Equal(t, uint64(1), li.Resubscribes)
	require.Contains(t, li.LastError, consumer.ErrFormatMismatch.Error())
	// The same lane then follows a valid format.
	snap2 := ckf.Snapshot{Identity: testID, Lease: lease(s2.epoch), Sequence: 6, Words: words(1)}
	s2.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap2) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
}
