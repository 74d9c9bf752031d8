package replica

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/ckfrelay/ckfrelay/producer"
)

// checkpointAt is the sample checkpoint under stream sequence seq.
func checkpointAt(c *Checkpoint, seq uint64) *Checkpoint {
	d := *c
	d.Seq = seq
	return &d
}

// TestCheckpoints_IndexKeepsTheNewestTwo: Put names the newest two in the
// index and deletes the rest, also when a late store is older than both or
// two connections store at once; the purge bound is the older kept one.
func TestCheckpoints_IndexKeepsTheNewestTwo(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	_, js2 := srv.JetStream(t)
	ctx := t.Context()
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	cs2, err := EnsureCheckpoints(ctx, js2, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	c := sampleCheckpoint(t)

	_, below, err := cs.Put(ctx, "p", checkpointAt(c, 10))
	require.NoError(t, err)
	assert.Zero(t, below, "one checkpoint: nothing may be purged")
	_, below, err = cs.Put(ctx, "p", checkpointAt(c, 20))
	require.NoError(t, err)
	assert.Equal(t, uint64(10), below)
	_, below, err = cs.Put(ctx, "p", checkpointAt(c, 30))
	require.NoError(t, err)
	assert.Equal(t, uint64(20), below)
	seqs, err := cs.List(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []uint64{30, 20}, seqs)
	_, err = cs.Get(ctx, "p", 10)
	require.ErrorIs(t, err, ErrDamagedCheckpoint, "a dropped checkpoint is deleted")

	// A late store older than both kept ones is not named, and deleted.
	_, below, err = cs2.Put(ctx, "p", checkpointAt(c, 15))
	require.NoError(t, err)
	assert.Equal(t, uint64(20), below)
	seqs, err = cs.List(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []uint64{30, 20}, seqs)
	_, err = cs.Get(ctx, "p", 15)
	require.ErrorIs(t, err, ErrDamagedCheckpoint)

	// Two connections store at once: the index ends with the two newest
	// of all, and exactly those objects are left.
	var wg sync.WaitGroup
	for i, s := range []*Checkpoints{cs, cs2} {
		wg.Go(func() {
			for k := range 5 {
				_, _, err := s.Put(ctx, "p", checkpointAt(c, uint64(100+10*k+i)))
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	seqs, err = cs.List(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []uint64{141, 140}, seqs)
	infos, err := cs.os.List(ctx)
	require.NoError(t, err)
	var names []string
	for _, info := range infos {
		names = append(names, info.Name)
	}
	assert.ElementsMatch(t, []string{"p/ckpt-141", "p/ckpt-140"}, names, "objects the index does not name were left")
	for _, seq := range seqs {
		got, err := cs2.Get(ctx, "p", seq)
		require.NoError(t, err)
		assert.Equal(t, seq, got.Seq)
	}
}

// TestCheckpoints_RefuseForgedIndexAndMetadata: what a writer to the
// checkpoint streams could forge is refused as damage before anything
// large is read, and a checkpoint the index names but no replica has is
// not damage (it may load later).
func TestCheckpoints_RefuseForgedIndexAndMetadata(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	c := sampleCheckpoint(t)

	// A garbage index: List says damaged; the next Put replaces it.
	_, err = cs.index.Put(ctx, "p", []byte("12,x"))
	require.NoError(t, err)
	_, err = cs.List(ctx, "p")
	require.ErrorIs(t, err, ErrDamagedCheckpoint)
	_, err = cs.index.Put(ctx, "p", []byte("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"))
	require.NoError(t, err)
	_, err = cs.List(ctx, "p")
	require.ErrorIs(t, err, ErrDamagedCheckpoint, "an index naming 17 checkpoints")
	_, _, err = cs.Put(ctx, "p", checkpointAt(c, 50))
	require.NoError(t, err)
	seqs, err := cs.List(ctx, "p")
	require.NoError(t, err)
	assert.Equal(t, []uint64{50}, seqs)

	// The index names a checkpoint no replica has: not damage.
	_, err = cs.Get(ctx, "p", 77)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	require.NotErrorIs(t, err, ErrDamagedCheckpoint)

	// Forged metadata: more chunks than bytes, a size beyond the bound,
	// a wrong digest.
	info, err := cs.info(ctx, checkpointName("p", 50))
	require.NoError(t, err)
	forge := func(edit func(*jetstream.ObjectInfo)) error {
		f := *info
		edit(&f)
		b, err := json.Marshal(&f)
		require.NoError(t, err)
		m := nats.NewMsg(cs.metaSubject(checkpointName("p", 50)))
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		m.Data = b
		_, err = js.PublishMsg(ctx, m)
		require.NoError(t, err)
		_, err = cs.Get(ctx, "p", 50)
		return err
	}
	start := time.Now()
	require.ErrorIs(t, forge(func(f *jetstream.ObjectInfo) { f.Chunks = 1 << 31 }), ErrDamagedCheckpoint)
	require.Less(t, time.Since(start), time.Second, "the reader asked for the forged chunks")
	require.ErrorIs(t, forge(func(f *jetstream.ObjectInfo) { f.Size = 1 << 40; f.Chunks = 1 }), ErrDamagedCheckpoint)
	require.ErrorIs(t, forge(func(f *jetstream.ObjectInfo) { f.Size, f.Chunks = 1<<29, 1<<20 }), ErrDamagedCheckpoint)
	require.ErrorIs(t, forge(func(f *jetstream.ObjectInfo) { f.Digest = "SHA-256=" + "AAAA" }), ErrDamagedCheckpoint)
	require.ErrorIs(t, forge(func(f *jetstream.ObjectInfo) { f.Deleted = true }), ErrDamagedCheckpoint)
	require.NoError(t, forge(func(*jetstream.ObjectInfo) {}), "the original metadata loads again")
}

// TestStartPool_UnreadCheckpointIsNotStateLost: a checkpoint the index
// names but no NATS replica answers is not damage. While the subject still
// starts at its first record the replica replays it; once the subject is
// purged it fails to start (Run retries), and never with ErrStateLost —
// that stops the replica for good.
func TestStartPool_UnreadCheckpointIsNotStateLost(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	ls, err := OpenLeases(ctx, js, LeaseConfig{TTL: time.Second, Replicas: 1})
	require.NoError(t, err)
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	subject, _ := Subject("", "pool")
	started := 0
	n, err := NewNode(NodeConfig{Pool: "pool", Node: "x", JS: js, Stream: s, Leases: ls, Checkpoints: cs,
		NewPool: func() (Pool, error) {
			started++
			r, stop := startReplica(t, 64)
			return Pool{Handle: r.h, Recorder: r.rec, Close: stop}, nil
		},
		PoolFromImage: func(*producer.Image) (Pool, error) { panic("no checkpoint loads here") }})
	require.NoError(t, err)

	// Two records (sequences 1 and 2); the index names a checkpoint at 2
	// whose object no replica has.
	app := NewAppender(js, s, subject, 1, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "a"}))
	require.NoError(t, app.Append(ctx, 0, []Command{{Kind: KindCursor, Cursor: producer.Cursor{Source: "s", Seq: 1}}}))
	_, err = cs.index.Put(ctx, "pool", []byte("2"))
	require.NoError(t, err)

	p, from, err := n.startPool(ctx)
	require.NoError(t, err, "a whole subject is replayed when its checkpoint cannot be read")
	assert.Equal(t, 1, started)
	assert.Zero(t, from.seq)
	p.Close()

	require.NoError(t, Purge(ctx, s, subject, 2))
	_, _, err = n.startPool(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrStateLost, "an unread checkpoint was taken for a lost state")
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	assert.Equal(t, 1, started, "a purged subject was replayed from its middle")

	// Deleted, it is provably gone: the state is lost.
	_, err = cs.os.PutBytes(ctx, checkpointName("pool", 2), []byte("x"))
	require.NoError(t, err)
	require.NoError(t, cs.os.Delete(ctx, checkpointName("pool", 2)))
	_, _, err = n.startPool(ctx)
	require.ErrorIs(t, err, ErrStateLost)
}

// TestEnsureCheckpoints_KeepsAnOperatorsSettings: a replica's start opens
// the existing checkpoint store and index; it does not rewrite a cap the
// operator set on them (as EnsureStream keeps the records stream's).
func TestEnsureCheckpoints_KeepsAnOperatorsSettings(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	_, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	for _, name := range []string{"OBJ_" + DefaultCheckpointBucket, "KV_" + DefaultCheckpointBucket + "_INDEX"} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.MaxBytes = 1 << 30
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	for _, name := range []string{"OBJ_" + DefaultCheckpointBucket, "KV_" + DefaultCheckpointBucket + "_INDEX"} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		assert.Equal(t, int64(1<<30), s.CachedInfo().Config.MaxBytes, "%s: the operator's cap was rewritten", name)
	}
	_, _, err = cs.Put(ctx, "p", checkpointAt(sampleCheckpoint(t), 3))
	require.NoError(t, err)
}

// TestCheckpoints_SweepDeletesOnlyWhatNoIndexCanName: Sweep deletes the
// pool's objects below the purge bound — what no index can name again —
// and leaves the kept ones, one above the bound that another replica may
// be about to name, and other pools' objects.
func TestCheckpoints_SweepDeletesOnlyWhatNoIndexCanName(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	cs, err := EnsureCheckpoints(ctx, js, CheckpointConfig{Replicas: 1})
	require.NoError(t, err)
	ck := sampleCheckpoint(t)
	for _, seq := range []uint64{10, 20} {
		_, _, err := cs.Put(ctx, "pool", checkpointAt(ck, seq))
		require.NoError(t, err)
	}
	for _, name := range []string{checkpointName("pool", 5), checkpointName("pool", 15), checkpointName("pool", 100), checkpointName("pool2", 1), "pool/other"} {
		_, err := cs.os.PutBytes(ctx, name, []byte("x"))
		require.NoError(t, err)
	}
	_, below, err := cs.Put(ctx, "pool", checkpointAt(ck, 30))
	require.NoError(t, err)
	require.EqualValues(t, 20, below)
	n, err := cs.Sweep(ctx, "pool", below)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	objs, err := cs.os.List(ctx)
	require.NoError(t, err)
	var names []string
	for _, o := range objs {
		names = append(names, o.Name)
	}
	assert.ElementsMatch(t, []string{checkpointName("pool", 20), checkpointName("pool", 30), checkpointName("pool", 100), checkpointName("pool2", 1), "pool/other"}, names)
}
