package persist

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// faultFS is the real file system with a rule deciding which of the
// operations that change it fail, with EFBIG as a file-size limit (the relay
// e2e's full disk) makes them fail. Pebble's own errorfs never fails a
// Close, the operation that crashed the relay, hence this one.
type faultFS struct {
	vfs.FS
	rule func(faultOp) bool // true: the operation fails

	mu       sync.Mutex
	ops      int   // operations counted so far
	bytes    int64 // bytes written so far
	failures []faultOp
	all      []faultOp
}

// faultOp is one operation that changes the file system.
type faultOp struct {
	Index int    // 1 for the first operation counted
	Kind  string // create, open-rw, reuse, rename, link, remove, write, sync, close, preallocate
	Path  string
	Bytes int64 // bytes written with this operation included (write)
}

func (fs *faultFS) check(kind, path string, n int) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.ops++
	op := faultOp{Index: fs.ops, Kind: kind, Path: path, Bytes: fs.bytes + int64(n)}
	fs.all = append(fs.all, op)
	if fs.rule != nil && fs.rule(op) {
		fs.failures = append(fs.failures, op)
		return &os.PathError{Op: kind, Path: path, Err: syscall.EFBIG}
	}
	fs.bytes += int64(n)
	return nil
}

func (fs *faultFS) failed() []faultOp {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]faultOp(nil), fs.failures...)
}

func (fs *faultFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := fs.check("create", name, 0); err != nil {
		return nil, err
	}
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, name, err)
}

func (fs *faultFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	if err := fs.check("open-rw", name, 0); err != nil {
		return nil, err
	}
	f, err := fs.FS.OpenReadWrite(name, c, o...)
	return fs.wrap(f, name, err)
}

func (fs *faultFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := fs.check("reuse", newname, 0); err != nil {
		return nil, err
	}
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(f, newname, err)
}

func (fs *faultFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(f, name, err)
}

func (fs *faultFS) Rename(oldname, newname string) error {
	if err := fs.check("rename", newname, 0); err != nil {
		return err
	}
	return fs.FS.Rename(oldname, newname)
}

func (fs *faultFS) Link(oldname, newname string) error {
	if err := fs.check("link", newname, 0); err != nil {
		return err
	}
	return fs.FS.Link(oldname, newname)
}

func (fs *faultFS) Remove(name string) error {
	if err := fs.check("remove", name, 0); err != nil {
		return err
	}
	return fs.FS.Remove(name)
}

func (fs *faultFS) wrap(f vfs.File, name string, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &faultFile{File: f, fs: fs, name: name}, nil
}

type faultFile struct {
	vfs.File
	fs   *faultFS
	name string
}

func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.check("write", f.name, len(p)); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.check("write", f.name, len(p)); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.check("sync", f.name, 0); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) SyncData() error {
	if err := f.fs.check("sync", f.name, 0); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f *faultFile) SyncTo(length int64) (bool, error) {
	if err := f.fs.check("sync", f.name, 0); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

func (f *faultFile) Preallocate(off, length int64) error {
	if err := f.fs.check("preallocate", f.name, 0); err != nil {
		return err
	}
	return f.File.Preallocate(off, length)
}

// Close closes the file and then reports the failure, as a kernel reporting
// a deferred write error at close does.
func (f *faultFile) Close() error {
	err := f.File.Close()
	if ferr := f.fs.check("close", f.name, 0); ferr != nil {
		return ferr
	}
	return err
}

// isWAL: a write-ahead log file (NNNNNN.log).
func isWAL(path string) bool { return strings.HasSuffix(path, ".log") }

// fsRun is what runOnFaultFS saw.
type fsRun struct {
	openErr    error  // open's error; nothing else ran when set
	writeError string // the journal's, before it was closed
	poolClose  error
	storeClose error
	admitted   uint64 // commands journalled
}

// failure is what the run ended on: every error it met, joined.
func (r fsRun) failure() error { return errors.Join(r.openErr, r.poolClose, r.storeClose) }

// runOnFaultFS opens a store in dir on fs, journals a pool through an actor
// — bursts of events of 16 blocks, so the write-ahead log rotates and the
// memtable is flushed, with a checkpoint every 256 commands — and closes
// everything. Each step must return within limit (within).
func runOnFaultFS(t *testing.T, dir string, fs vfs.FS, bursts int, limit time.Duration) fsRun {
	t.Helper()
	ctx := context.Background()
	var r fsRun
	var st *Store
	within(t, limit, "open", func() { st, r.openErr = open(dir, StoreOptions{ReserveBytes: -1, Logger: discard}, fs, 64<<10) })
	if r.openErr != nil {
		return r
	}
	pl := st.Pool("p", Options{CheckpointEvery: 256, Logger: discard})
	rec, err := pl.Load()
	require.NoError(t, err)
	h := newActor(t, 1<<16, pl)
	var ierr error
	within(t, limit, "restore and ingest", func() {
		if ierr = pl.Restore(ctx, h, rec); ierr != nil {
			return
		}
		for b := range bursts {
			if ierr = burst(ctx, h, uint64(b)*100*16, 100); ierr != nil {
				return
			}
			// One group commit a burst, nearly: the operations
			// vary little from run to run.
			if ierr = pl.WaitDurable(ctx); ierr != nil {
				return
			}
		}
		ierr = h.Shutdown(ctx)
	})
	require.NoError(t, ierr, "the actor never waits on a failed store")
	r.writeError, r.admitted = pl.Stats().WriteError, pl.Stats().Position
	within(t, limit, "PoolLog.Close", func() { r.poolClose = pl.Close(ctx) })
	within(t, limit, "Store.Close", func() { r.storeClose = st.Close() })
	return r
}

var discard = slog.New(slog.DiscardHandler)

// faultDir is a directory for a store on a faultFS, removed after the test
// as far as it can be: a failed store's Pebble may still be writing into it
// (its database is never closed), which t.TempDir would report as a failure.
func faultDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "persist-fault-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// within runs f and fails the test, with every goroutine's stack, if it has
// not returned after limit.
func within(t *testing.T, limit time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		require.Failf(t, "did not return in time", "%s did not return within %v; goroutines:\n%s", what, limit, stacks())
	}
}

func stacks() string {
	buf := make([]byte, 1<<24)
	return string(buf[:runtime.Stack(buf, true)])
}

// parkedIn reports whether a goroutine parked by failFS has fn on its stack.
func parkedIn(fn string) bool {
	for _, g := range strings.Split(stacks(), "\n\n") {
		if strings.Contains(g, "persist.(*failFS).park") && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}

// burst admits n stored events of 16 fresh blocks each (blocks first+1 on)
// and waits until the actor applied them.
func burst(ctx context.Context, h interface {
	AdmitEvent(context.Context, uint64, ckf.RouterEvent) error
	Flush(context.Context) error
}, first uint64, n int) error {
	for i := range uint64(n) {
		hashes := make([]uint64, 16)
		for j := range hashes {
			hashes[j] = first + i*16 + uint64(j) + 1
		}
		if err := h.AdmitEvent(ctx, 1, stored(1+i%8, 0, nil, hashes...)); err != nil {
			return err
		}
	}
	return h.Flush(ctx)
}

// calibrate runs the workload on a file system that fails nothing and
// returns the operations it counted.
func calibrate(t *testing.T) []faultOp {
	t.Helper()
	ffs := &faultFS{FS: vfs.Default}
	r := runOnFaultFS(t, faultDir(t), ffs, 8, time.Minute)
	require.NoError(t, r.failure())
	require.Empty(t, r.writeError)
	return ffs.all
}

// TestStore_FaultFSWorkloadReachesEveryKindOfWrite: the workload of the
// fault tests, on a file system that fails nothing, writes every kind of
// file Pebble writes — the OPTIONS file (through a rename), the MANIFEST and
// its marker, write-ahead logs it rotates (a new one and a recycled one), and
// tables a flush writes — so the faults below reach each.
func TestStore_FaultFSWorkloadReachesEveryKindOfWrite(t *testing.T) {
	ops := calibrate(t)
	seen := map[string]bool{}
	for i, op := range ops {
		base := op.Path[strings.LastIndexByte(op.Path, '/')+1:]
		switch {
		case op.Kind == "close" && isWAL(base) && i+1 < len(ops) && isWAL(ops[i+1].Path):
			seen["a WAL closed at rotation"] = true
		case op.Kind == "reuse" && isWAL(base):
			seen["a WAL recycled"] = true
		case op.Kind == "sync" && isWAL(base):
			seen["a WAL synced"] = true
		case op.Kind == "write" && strings.HasSuffix(base, ".sst"):
			seen["a table written"] = true
		case op.Kind == "write" && strings.HasPrefix(base, "MANIFEST-"):
			seen["the MANIFEST written"] = true
		case op.Kind == "create" && strings.HasPrefix(base, "marker."):
			seen["a marker created"] = true
		case op.Kind == "rename" && strings.HasPrefix(base, "OPTIONS-"):
			seen["the OPTIONS file renamed"] = true
		}
	}
	assert.Len(t, seen, 7, "%v", seen)
	t.Logf("%d operations", len(ops))
}

// TestStore_WALCloseFailingAtRotationFailsTheStore: closing the previous
// write-ahead log when Pebble rotates it fails (EFBIG, as under a file-size
// limit) — the path that crashed the relay with "fatal error: sync: unlock
// of unlocked mutex" (Pebble v2.1.7 db.go rotateWAL panics on the error).
// The process lives on: the goroutine is parked in rotateWAL, the store
// fails with ErrWriteFailed naming the file, further writes return it, the
// actor goes on serving from memory, and both Closes return.
func TestStore_WALCloseFailingAtRotationFailsTheStore(t *testing.T) {
	ffs := &faultFS{FS: vfs.Default, rule: func(op faultOp) bool { return op.Kind == "close" && isWAL(op.Path) }}
	st, pl, h := openOnFaultFS(t, ffs)
	failed := fillUntilTheStoreFails(t, pl, h)
	assert.Contains(t, pl.Stats().WriteError, "close ")
	assert.Contains(t, pl.Stats().WriteError, ".log: ")
	assert.Contains(t, pl.Stats().WriteError, syscall.EFBIG.Error())
	require.Len(t, ffs.failed(), 1)
	assert.True(t, parkedIn("rotateWAL"), "the goroutine that met the error is parked in rotateWAL")
	assertFailedStoreKeepsServing(t, st, pl, h, failed)
}

// TestStore_WALSyncFailingFailsTheStore: a write-ahead log's sync fails (on
// every log from then on, as on a disk that stays full). Pebble would turn
// it into Logger.Fatalf from the committing goroutine and, for any commit
// queued behind it, a panic in commitWrite; the store fails instead, and
// nothing waits on the commit that never finishes.
func TestStore_WALSyncFailingFailsTheStore(t *testing.T) {
	var armed atomic.Bool
	ffs := &faultFS{FS: vfs.Default, rule: func(op faultOp) bool { return armed.Load() && op.Kind == "sync" && isWAL(op.Path) }}
	st, pl, h := openOnFaultFS(t, ffs)
	armed.Store(true)
	failed := fillUntilTheStoreFails(t, pl, h)
	assert.Contains(t, pl.Stats().WriteError, "sync ")
	assert.Contains(t, pl.Stats().WriteError, ".log: ")
	require.NotEmpty(t, ffs.failed())
	assert.True(t, parkedIn("flushLoop") || parkedIn("rotateWAL"), "the WAL's writer is parked")
	assertFailedStoreKeepsServing(t, st, pl, h, failed)
}

// TestStore_FullDiskAfterSomeBytesFailsTheStore: every write past 400 KiB
// (of all files) fails, as on a disk that filled up: whichever of Pebble's
// writes meets it first — a WAL's, a table's, the MANIFEST's — the store
// fails and the process lives on.
func TestStore_FullDiskAfterSomeBytesFailsTheStore(t *testing.T) {
	ffs := &faultFS{FS: vfs.Default, rule: func(op faultOp) bool { return op.Kind == "write" && op.Bytes > 400<<10 }}
	st, pl, h := openOnFaultFS(t, ffs)
	failed := fillUntilTheStoreFails(t, pl, h)
	assert.Contains(t, pl.Stats().WriteError, "write ")
	assert.True(t, parkedIn("persist.(*failFile).Write"))
	assertFailedStoreKeepsServing(t, st, pl, h, failed)
}

// openOnFaultFS opens a store (64 KiB memtables) on ffs with one pool
// journalling an actor.
func openOnFaultFS(t *testing.T, ffs *faultFS) (*Store, *PoolLog, producer.Handle) {
	t.Helper()
	st, err := open(faultDir(t), StoreOptions{ReserveBytes: -1, Logger: discard}, ffs, 64<<10)
	require.NoError(t, err)
	pl := st.Pool("p", Options{Logger: discard})
	rec, err := pl.Load()
	require.NoError(t, err)
	h := startActor(t, pl)
	require.NoError(t, pl.Restore(context.Background(), h, rec))
	return st, pl, h
}

// fillUntilTheStoreFails admits bursts of events until the journal stops on
// the store's failure, and returns how many bursts it admitted.
func fillUntilTheStoreFails(t *testing.T, pl *PoolLog, h producer.Handle) int {
	t.Helper()
	ctx := context.Background()
	for b := range 40 {
		require.NoError(t, burst(ctx, h, uint64(b)*100*16, 100))
		var err error
		within(t, 10*time.Second, "WaitDurable", func() { err = pl.WaitDurable(ctx) })
		require.NoError(t, err)
		if pl.Stats().WriteError != "" {
			return b + 1
		}
	}
	require.Failf(t, "the store never failed", "journal %+v", pl.Stats())
	return 0
}

// assertFailedStoreKeepsServing: after the store failed with ErrWriteFailed,
// a commit and a checkpoint return that failure at once, the actor admits
// and exports as before (the relay serves from memory), and PoolLog.Close
// and Store.Close return it within a second.
func assertFailedStoreKeepsServing(t *testing.T, st *Store, pl *PoolLog, h producer.Handle, bursts int) {
	t.Helper()
	ctx := context.Background()
	require.ErrorIs(t, st.failure(), ErrWriteFailed)
	b := st.db.NewBatch()
	require.NoError(t, b.Set([]byte("k"), []byte("v"), nil))
	require.ErrorIs(t, st.commit(b), ErrWriteFailed)
	require.NoError(t, burst(ctx, h, uint64(bursts)*100*16, 100), "the actor goes on")
	state, err := h.ExportState(ctx)
	require.NoError(t, err)
	blocks := 0
	for _, m := range state.Members {
		blocks += len(m.Lineage.Blocks)
	}
	assert.Equal(t, (bursts+1)*100*16, blocks, "every admitted block is served from memory")
	var cerr error
	within(t, time.Second, "WriteCheckpoint", func() { cerr = pl.WriteCheckpoint(state) })
	require.ErrorIs(t, cerr, ErrWriteFailed)
	require.NoError(t, h.Shutdown(ctx))
	within(t, time.Second, "PoolLog.Close", func() { cerr = pl.Close(ctx) })
	require.ErrorIs(t, cerr, ErrWriteFailed)
	within(t, time.Second, "Store.Close", func() { cerr = st.Close() })
	require.ErrorIs(t, cerr, ErrWriteFailed)
}

// TestStore_EveryFailingOperation attacks the store from below: for every
// operation index N the workload reaches (calibrate), one run fails the Nth
// operation that changes the file system and every one after it (a disk that
// fills up and stays full), and one fails only the Nth (a transient error).
// No run may panic (the test binary would die) or hang (within), and each
// ends as its failure says: a failed write, sync, close, create, rename or
// reuse fails the store with ErrWriteFailed — at open, in the journal, or at
// Close — while a failed removal or preallocation, which Pebble tolerates,
// leaves it healthy. A healthy one reopens with everything journalled.
//
// Every index takes ~90 s on 2 cores (~430 operations): by default every
// 5th is tried, with -short every 25th, and CKFRELAY_FAULT_SWEEP_STEP=1
// tries them all.
func TestStore_EveryFailingOperation(t *testing.T) {
	k := len(calibrate(t)) + 5 // a few beyond: the count varies with group commits
	step := 5
	if testing.Short() {
		step = 25
	}
	if v := os.Getenv("CKFRELAY_FAULT_SWEEP_STEP"); v != "" {
		var err error
		step, err = strconv.Atoi(v)
		require.NoError(t, err)
		require.Positive(t, step)
	}
	outcomes := map[string]int{}
	for n := 1; n <= k; n += step {
		for _, sticky := range []bool{true, false} {
			ffs := &faultFS{FS: vfs.Default, rule: func(op faultOp) bool { return op.Index == n || sticky && op.Index > n }}
			dir := faultDir(t)
			r := runOnFaultFS(t, dir, ffs, 8, 20*time.Second)
			fatal := false
			for _, op := range ffs.failed() {
				fatal = fatal || op.Kind != "remove" && op.Kind != "preallocate"
			}
			switch {
			case fatal:
				require.ErrorIs(t, r.failure(), ErrWriteFailed, "n=%d sticky=%v failed %v", n, sticky, ffs.failed())
				require.Equal(t, r.openErr == nil, r.writeError != "" || r.storeClose != nil, "n=%d sticky=%v: a store that opened says why it failed", n, sticky)
			default:
				require.NoError(t, r.failure(), "n=%d sticky=%v failed %v", n, sticky, ffs.failed())
				// Closed whole: everything journalled is there.
				st, err := Open(dir)
				require.NoError(t, err)
				rec, err := st.Pool("p", Options{}).Load()
				require.NoError(t, err)
				require.Equal(t, r.admitted, rec.Position, "n=%d sticky=%v", n, sticky)
				require.Zero(t, rec.Lost)
				require.NoError(t, st.Close())
			}
			outcome := "healthy"
			switch {
			case r.openErr != nil:
				outcome = "open failed"
			case r.writeError != "":
				outcome = "journal stopped"
			case r.poolClose != nil:
				outcome = "journal's close failed"
			case r.storeClose != nil:
				outcome = "store's close failed"
			}
			if len(ffs.failed()) > 0 {
				outcome += " after a failed " + ffs.failed()[0].Kind
			}
			outcomes[outcome]++
		}
	}
	t.Logf("%d indices × 2 modes: %v", (k+step-1)/step, outcomes)
}
