// Package persist keeps a relay's exact pool state on disk so a relay killed
// without warning (kill -9, a crash, a lost host process) restarts with what
// it had admitted instead of empty data centers.
//
// Each pool has a checkpoint — every member's source epoch and lineage, from
// [producer.Handle.ExportState] — and a journal of the commands the actor
// applied after it, in the actor's order ([producer.Journal]). Both live in
// one Pebble database per relay (data_dir). The actor only appends a pointer
// to an in-memory queue; a writer goroutine encodes the queue and commits it
// with an fsync (group commit), so the durable state trails the admitted one
// by at most one commit (a few milliseconds; [PoolLog.Stats] shows the
// backlog) and the actor blocks only when Options.MaxPending commands wait.
// A new checkpoint is taken every Options.CheckpointEvery commands and the
// journal before it deleted, so a restart replays a bounded journal.
//
// A restart loads the checkpoint and journal ([PoolLog.Load]) and replays
// them into the fresh actor ([PoolLog.Restore]) before the relay serves: the
// recovered state is published under the new incarnation like any other.
package persist

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// Options tune a pool's journal. Zero fields take the defaults.
type Options struct {
	// MaxPending bounds the commands journalled but not yet committed; at
	// the bound the actor waits for the writer. Default 65,536.
	MaxPending int
	// CheckpointEvery and CheckpointEveryBlocks are how many journalled
	// commands, or blocks named by them, trigger a new checkpoint: they bound
	// the journal a restart replays. Defaults 262,144 and 1,048,576.
	CheckpointEvery       uint64
	CheckpointEveryBlocks uint64
	// Logger receives write errors, each with the pool's name ("pool");
	// nil means slog.Default().
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.MaxPending <= 0 {
		o.MaxPending = 65536
	}
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = 262144
	}
	if o.CheckpointEveryBlocks == 0 {
		o.CheckpointEveryBlocks = 1 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// StoreOptions tune a relay's database. Zero fields take the defaults.
type StoreOptions struct {
	// ReserveBytes is the free space the data dir's file system must keep:
	// a commit that would leave less is not attempted and the store stops
	// taking writes ([ErrLowSpace]) while the database is still whole,
	// instead of meeting the full disk inside Pebble. Default
	// [DefaultReserveBytes]; negative turns the check off.
	ReserveBytes int64
	// Logger receives the store's and Pebble's errors; nil means
	// slog.Default().
	Logger *slog.Logger
}

// DefaultReserveBytes is StoreOptions.ReserveBytes' default: 256 MiB, room
// for Pebble's own flushes and compactions after the last commit allowed.
const DefaultReserveBytes = 256 << 20

// Store is a relay's Pebble database.
//
// A store whose writes fail — the disk full, a file-size limit, an I/O error,
// or Pebble reporting a fatal error — is abandoned, not exited on: every
// pool's journal stops (Stats.WriteError says why), the pools go on without
// persistence, and no further write reaches the database (docs/RATIONALE.md
// "Why does a data dir that stops taking writes leave the relay running
// without persistence?").
type Store struct {
	db  *pebble.DB
	dir string
	opt StoreOptions

	mu     sync.Mutex
	failed error         // set once: the store takes no more writes
	damage error         // the first corruption Pebble reported (ErrDamaged), or nil
	dead   chan struct{} // closed when failed is set
	broken chan struct{} // closed when a goroutine was parked inside Pebble (breakDown)
	opened bool          // pebble.Open returned: a failure now leaves the pools without persistence
	pools  []*PoolLog    // told when the store fails
}

// ErrLocked: another process holds the data directory.
var ErrLocked = errors.New("persist: data directory in use")

// ErrWriteFailed matches the error a pool's journal stopped on when the
// database failed a write (or Pebble reported a fatal error): the pool's
// state is no longer kept.
var ErrWriteFailed = errors.New("persist: the data directory stopped taking writes")

// ErrDamaged: a file of the data directory fails its checksum (Pebble's
// corruption report). At start the relay refuses the directory, naming the
// file; while running it matches the error every pool's journal stopped on
// (with ErrWriteFailed): the pools go on without persistence.
var ErrDamaged = errors.New("persist: the data directory is damaged")

// ErrLowSpace matches the error a pool's journal stopped on when the data
// dir's free space fell below StoreOptions.ReserveBytes.
var ErrLowSpace = errors.New("persist: free space in the data directory is below the reserve")

// Open opens (creating if needed) the database in dir with the default
// options. A directory another relay holds fails with [ErrLocked].
func Open(dir string) (*Store, error) { return OpenWith(dir, StoreOptions{}) }

// OpenWith is [Open] with options. A directory that fails a write while the
// database is opened (a full disk) fails with [ErrWriteFailed].
func OpenWith(dir string, opt StoreOptions) (*Store, error) { return open(dir, opt, vfs.Default, 0) }

// open is [OpenWith] on the file system fs, with Pebble's memtable size
// when memTable is not 0 (tests inject faults into fs, and make Pebble
// flush and compact within a small workload).
func open(dir string, opt StoreOptions, fs vfs.FS, memTable uint64) (*Store, error) {
	if opt.ReserveBytes == 0 {
		opt.ReserveBytes = DefaultReserveBytes
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Store{dir: dir, opt: opt, dead: make(chan struct{}), broken: make(chan struct{})}
	el := pebble.EventListener{BackgroundError: func(err error) {
		// A flush or compaction that fails (a full disk) is retried by
		// Pebble while commits stall behind it: stop writing now.
		s.fail(fmt.Errorf("%w: background write: %w", ErrWriteFailed, err))
	}, DataCorruption: func(info pebble.DataCorruptionInfo) {
		// Pebble's default sends this to the logger's Fatalf, which parks
		// the reporting goroutine (storeLogger): a compaction that Open
		// started and waits for would then hang Open forever. Reported
		// here, the read or compaction fails with the corruption error and
		// Pebble goes on.
		dmg := fmt.Errorf("%w: %s fails its checksum (%s); move the directory aside to start empty",
			ErrDamaged, info.Path, info.Details.Error())
		s.mu.Lock()
		if s.damage == nil {
			s.damage = dmg
		}
		s.mu.Unlock()
		s.fail(fmt.Errorf("%w: %w", ErrWriteFailed, dmg))
	}}
	db, err := s.openDB(&pebble.Options{FS: &failFS{FS: fs, s: s}, Logger: storeLogger{s}, EventListener: &el, MemTableSize: memTable})
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK) {
		// Pebble's LOCK file is flock'ed by the process holding the
		// database: another relay (or this one, twice).
		return nil, fmt.Errorf("%w: another relay holds the data directory %s (its LOCK file is locked)", ErrLocked, dir)
	}
	if err != nil {
		if pebble.IsCorruptionError(err) {
			err = fmt.Errorf("%w: %w", ErrDamaged, err)
		}
		return nil, fmt.Errorf("persist: open %s: %w", dir, err)
	}
	s.db = db
	s.mu.Lock()
	s.opened = true
	failed := s.failed
	s.mu.Unlock()
	if dmg := s.damaged(); dmg != nil {
		// Found while opening (a compaction read a damaged table): refuse
		// the directory now rather than run on a store that takes no writes.
		_ = s.closeDB()
		return nil, fmt.Errorf("persist: open %s: %w", dir, dmg)
	}
	if failed != nil {
		// A background write failed while Pebble opened (and returned):
		// said now, as fail says it once the store is open.
		s.logFailure(failed)
	}
	return s, nil
}

// openDB opens the database on a goroutine of its own: a write that fails
// while Pebble opens it (the OPTIONS file, the MANIFEST, the first
// write-ahead log on a full disk) parks that goroutine (failFS), and the
// open then fails with the store's failure instead of hanging the relay's
// start.
func (s *Store) openDB(opts *pebble.Options) (*pebble.DB, error) {
	type opened struct {
		db  *pebble.DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		db, err := pebble.Open(s.dir, opts)
		done <- opened{db, err}
	}()
	select {
	case o := <-done:
		return o.db, o.err
	case <-s.broken:
		return nil, s.failure()
	}
}

// Close closes the database; close every pool's journal first. It returns
// the error the store failed with, if any. A database that failed a write is
// left as it is (a Pebble goroutine is parked inside it, and Pebble after a
// fatal error may block or panic in Close): the process's exit releases it.
// One stopped below the reserve is whole and closed. Close never waits on a
// parked goroutine: a write that fails while Pebble closes (the last
// write-ahead log's trailer and sync) parks the goroutine closing it, and
// Close returns the failure.
func (s *Store) Close() error {
	err := s.failure()
	if err != nil && !errors.Is(err, ErrLowSpace) {
		return err
	}
	return cmp.Or(err, s.closeDB())
}

// closeDB closes the database on a goroutine of its own and returns its
// error, or the store's failure once a goroutine is parked inside Pebble
// (then or before): the database is then left to the process's exit.
func (s *Store) closeDB() error {
	done := make(chan error, 1)
	go func() {
		select {
		case <-s.broken:
			done <- s.failure()
		default:
			done <- s.db.Close()
		}
	}()
	select {
	case err := <-done:
		return err
	case <-s.broken:
		return s.failure()
	}
}

// damaged returns the first corruption Pebble reported, or nil.
func (s *Store) damaged() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.damage
}

// failure returns why the store stopped taking writes, or nil.
func (s *Store) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *Store) logFailure(err error) {
	s.opt.Logger.Error("persist: the data directory stopped taking writes; every pool goes on without persistence until a restart",
		"dir", s.dir, "err", err)
}

// fail abandons the store (once): no write reaches the database from now
// on, and every pool's journal stops.
func (s *Store) fail(err error) {
	s.mu.Lock()
	if s.failed != nil {
		s.mu.Unlock()
		return
	}
	s.failed = err
	close(s.dead)
	pools := slices.Clone(s.pools)
	opened := s.opened
	s.mu.Unlock()
	if !opened {
		return // Open fails with err, or says it when it returns
	}
	s.logFailure(err)
	for _, p := range pools {
		p.abandon(err)
	}
}

// breakDown fails the store because a goroutine is about to be parked inside
// Pebble (a failed write, failFS; a fatal error, storeLogger): Pebble's state
// is no longer known, so the database is not even closed.
func (s *Store) breakDown(err error) {
	s.fail(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.broken:
	default:
		close(s.broken)
	}
}

// commit commits b with an fsync unless the store failed, and fails the
// store on an error — also on one Pebble reported through Fatalf during the
// commit. Pebble commits on a goroutine of its own here: a failed write or
// a Fatalf on the commit path parks the goroutine that met it (failFS,
// storeLogger), and the caller must not be that goroutine — it learns of the
// failure from s.dead and goes on without the database. commit owns b and
// closes it once Pebble is done with it: a batch whose commit never returns
// is never closed, so Pebble's pool never hands it out again while the
// parked commit still holds it.
func (s *Store) commit(b *pebble.Batch) error {
	if err := s.failure(); err != nil {
		_ = b.Close()
		return err
	}
	if s.opt.ReserveBytes > 0 {
		if free, err := freeBytes(s.dir); err == nil && free < uint64(s.opt.ReserveBytes)+uint64(len(b.Repr())) {
			err := fmt.Errorf("%w: %d bytes free, reserve %d, commit %d", ErrLowSpace, free, s.opt.ReserveBytes, len(b.Repr()))
			_ = b.Close()
			s.fail(err)
			return err
		}
	}
	done := make(chan error, 1)
	go func() {
		err := b.Commit(pebble.Sync)
		_ = b.Close()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrWriteFailed, err)
			s.fail(err)
			return err
		}
		return s.failure()
	case <-s.dead:
		return s.failure()
	}
}

// Key layout, under the pool's name and a 0 byte (pool names never hold one):
// 'm' meta (JSON), 't' the time of the last commit (unix nanoseconds, 8 bytes
// big endian), 'c'+worker(8)+rank(4) a checkpointed member, 'l'+position(8)
// a journalled command; big-endian numbers keep the order.
func poolKey(pool string, section byte, suffix ...byte) []byte {
	k := make([]byte, 0, len(pool)+2+len(suffix))
	k = append(k, pool...)
	k = append(k, 0, section)
	return append(k, suffix...)
}

func memberKey(pool string, m ckf.Member) []byte {
	var s [12]byte
	binary.BigEndian.PutUint64(s[:], m.WorkerID)
	binary.BigEndian.PutUint32(s[8:], m.DPRank)
	return poolKey(pool, 'c', s[:]...)
}

func logKey(pool string, pos uint64) []byte {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], pos)
	return poolKey(pool, 'l', s[:]...)
}

type meta struct {
	CheckpointPosition uint64 `json:"checkpoint_position"`
	CheckpointUnixNano int64  `json:"checkpoint_unix_nano"`
}

// PoolLog is one pool's checkpoint and journal. It implements
// [producer.Journal]; pass it in producer.Config.Journal. It starts paused
// (journalling nothing) so [PoolLog.Restore] can replay without journalling
// the replay again.
type PoolLog struct {
	store *Store
	pool  string
	opt   Options

	mu         sync.Mutex
	cond       *sync.Cond // pending shrank, durable grew, or closing
	paused     bool
	pending    []Record
	position   uint64 // commands journalled (the last one's position)
	durable    uint64 // the last position committed
	checkpoint uint64 // the position the stored checkpoint includes
	blocks     uint64 // blocks named by the commands journalled since the last checkpoint export
	ckRunning  bool
	closing    bool
	stopped    bool // the writer has exited
	writeErr   error
	lastCommit time.Time

	mark    *os.File // the journal's high-water mark (watermark.go)
	markErr bool     // a mark write failed (logged once)
	// markedLost is the position the mark was raised to after the store
	// failed (abandon): commands up to it were admitted, not kept.
	markedLost uint64
	handle     producer.Handle
	ckDone     sync.WaitGroup // a checkpoint in flight
	wake       chan struct{}
	done       chan struct{}
	recovered  Recovered
}

// Pool returns the journal of the named pool.
func (s *Store) Pool(name string, opt Options) *PoolLog {
	opt = opt.withDefaults()
	opt.Logger = opt.Logger.With("pool", name) // once, for every line of the journal
	p := &PoolLog{store: s, pool: name, opt: opt, paused: true,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	s.mu.Lock()
	s.pools = append(s.pools, p)
	failed := s.failed
	s.mu.Unlock()
	if failed != nil {
		p.abandon(failed)
	}
	return p
}

// abandon stops the journal after the store failed: what is pending is
// dropped, later commands are counted but not kept, and the high-water mark
// is raised to the last command admitted, so the next start reports the
// commands that never reached the disk (Recovered.Lost) and resets the
// recovered ranks instead of claiming a complete recovery.
func (p *PoolLog) abandon(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writeErr == nil {
		p.writeErr = err
		p.opt.Logger.Error("persist: journal stopped; the pool's state is no longer kept", "err", err)
	}
	p.pending = nil
	p.markLost()
	p.cond.Broadcast()
}

// markLost raises the high-water mark to the last command admitted when it
// is beyond the durable one: the commands in between are lost. p.mu is held.
func (p *PoolLog) markLost() {
	if p.position > p.durable && p.position > p.markedLost {
		p.markedLost = p.position
		p.writeMark(p.position)
	}
}

// Recovered is what [PoolLog.Load] found.
type Recovered struct {
	Found     bool                // anything was stored
	State     producer.ExactState // the checkpoint
	Journal   []Record            // the commands after it, in order
	Position  uint64              // the last journalled position
	WrittenAt time.Time           // the last commit: how old the recovered state is
	Blocks    int                 // lineage entries in the checkpoint
	LoadTime  time.Duration       // reading and decoding
	// Lost counts the journalled commands the high-water mark promises
	// beyond Position: the database's newest write-ahead log was damaged
	// or deleted, and its tail is gone, or the last run's store stopped
	// taking writes (abandon) and these commands never reached it. Restore then resets every
	// recovered rank (ResetRanks of them), degraded.
	Lost       uint64
	ResetRanks int
	// Unverified says why the journal could not be checked against its
	// high-water mark although state was stored: the mark file is
	// "missing" (deleted, or never written) or "damaged". Whether the
	// newest write-ahead log lost commands is then unknown; the state is
	// kept as recovered and the loss is reported, not ruled out.
	Unverified string
}

// Load reads the pool's checkpoint and journal. Call it once, before
// Restore.
func (p *PoolLog) Load() (Recovered, error) {
	rec, err := p.load()
	if err != nil && pebble.IsCorruptionError(err) {
		if dmg := p.store.damaged(); dmg != nil {
			return rec, fmt.Errorf("pool %q: %w", p.pool, dmg) // names the file
		}
		return rec, fmt.Errorf("pool %q: %w: %w", p.pool, ErrDamaged, err)
	}
	return rec, err
}

func (p *PoolLog) load() (Recovered, error) {
	start := time.Now()
	var rec Recovered
	db := p.store.db
	var m meta
	if v, closer, err := db.Get(poolKey(p.pool, 'm')); err == nil {
		err = json.Unmarshal(v, &m)
		closer.Close()
		if err != nil {
			return rec, fmt.Errorf("%w: meta: %v", ErrCorrupt, err)
		}
		rec.Found = true
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return rec, err
	}
	if v, closer, err := db.Get(poolKey(p.pool, 't')); err == nil {
		if len(v) == 8 {
			rec.WrittenAt = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
		}
		closer.Close()
		rec.Found = true
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return rec, err
	}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: poolKey(p.pool, 'c'), UpperBound: poolKey(p.pool, 'd')})
	if err != nil {
		return rec, err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(p.pool)+2:]
		if len(k) != 12 {
			it.Close()
			return rec, fmt.Errorf("%w: member key", ErrCorrupt)
		}
		mb := ckf.Member{WorkerID: binary.BigEndian.Uint64(k), DPRank: binary.BigEndian.Uint32(k[8:])}
		st, err := decodeMember(mb, it.Value())
		if err != nil {
			it.Close()
			return rec, err
		}
		rec.Blocks += len(st.Lineage.Blocks)
		rec.State.Members = append(rec.State.Members, st)
	}
	if err := it.Close(); err != nil {
		return rec, err
	}
	rec.State.JournalPosition = m.CheckpointPosition
	rec.Position = m.CheckpointPosition
	// The journal's blocks count toward CheckpointEveryBlocks as this
	// run's do: the bound holds across restarts, not only within one.
	var blocks uint64
	it, err = db.NewIter(&pebble.IterOptions{LowerBound: logKey(p.pool, m.CheckpointPosition+1), UpperBound: poolKey(p.pool, 'm')})
	if err != nil {
		return rec, err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(p.pool)+2:]
		pos := binary.BigEndian.Uint64(k)
		if pos != rec.Position+1 {
			it.Close()
			return rec, fmt.Errorf("%w: journal position %d after %d", ErrCorrupt, pos, rec.Position)
		}
		r, err := decodeRecord(it.Value())
		if err != nil {
			it.Close()
			return rec, fmt.Errorf("journal position %d: %w", pos, err)
		}
		rec.Journal = append(rec.Journal, r)
		rec.Position = pos
		blocks += r.blocks()
	}
	if err := it.Close(); err != nil {
		return rec, err
	}
	mark, why, f, err := openMark(p.store.dir, p.pool)
	if err != nil {
		return rec, err
	}
	p.mark = f
	if mark > rec.Position {
		rec.Lost = mark - rec.Position
	}
	if why != "" && (rec.Found || rec.Position > 0) {
		rec.Unverified = why
		p.opt.Logger.Error("persist: the journal's high-water mark is "+why+": whether the newest write-ahead log lost commands cannot be checked; "+
			"the recovered state is kept, and the catalog's persistence says \"recovery\": \"unverified\"",
			"journal_position", rec.Position, "file", markPath(p.store.dir, p.pool))
	}
	p.mu.Lock()
	p.position, p.durable, p.checkpoint, p.blocks = rec.Position, rec.Position, m.CheckpointPosition, blocks
	p.mu.Unlock()
	rec.LoadTime = time.Since(start)
	return rec, nil
}

// Restore replays rec into h — the checkpoint as one rank replacement, then
// the journal in order — waits until the actor has applied it all, and
// starts journalling (and the writer). A replayed command the actor refuses
// is logged and skipped: the rest still applies.
func (p *PoolLog) Restore(ctx context.Context, h producer.Handle, rec Recovered) error {
	p.handle = h
	if len(rec.State.Members) > 0 {
		if err := h.ReplaceRanks(ctx, rec.State.Replacements()); err != nil {
			return fmt.Errorf("persist: restore checkpoint: %w", err)
		}
	}
	for i := range rec.Journal {
		r := &rec.Journal[i]
		var err error
		switch r.Kind {
		case KindAdmitted:
			err = h.AdmitEvent(ctx, r.SourceEpoch, r.Event)
		case KindReplaced:
			err = h.ReplaceRanks(ctx, r.Reps)
		case KindReset:
			err = h.ResetRank(ctx, r.SourceEpoch, r.Member, r.Degraded)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p.opt.Logger.Warn("persist: a journalled command was refused on replay", "kind", string(r.Kind), "err", err)
		}
	}
	if err := h.Flush(ctx); err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	// Flush is answered after every command above: the replay is applied.
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	go p.write()
	if rec.Lost > 0 {
		n, err := p.resetAfterLoss(ctx, h, rec)
		if err != nil {
			return err
		}
		rec.ResetRanks = n
	}
	p.mu.Lock()
	p.recovered = Recovered{Found: rec.Found, WrittenAt: rec.WrittenAt, Blocks: rec.Blocks, Position: rec.Position,
		LoadTime: rec.LoadTime, Lost: rec.Lost, ResetRanks: rec.ResetRanks, Unverified: rec.Unverified}
	p.mu.Unlock()
	return nil
}

// resetAfterLoss resets, degraded, every rank the replay recovered, at the
// epoch it recovered: the lost tail of the journal may have removed blocks
// (advertising them again would send routers to evicted caches) or reset
// the rank, so none of the recovered blocks can be trusted; the epochs can
// (a lost reset only raised them, and the sources announce higher ones).
// The resets are journalled, so a later restart does not bring the blocks
// back. It returns how many ranks it reset.
func (p *PoolLog) resetAfterLoss(ctx context.Context, h producer.Handle, rec Recovered) (int, error) {
	p.opt.Logger.Error("persist: the journal ends before its high-water mark: the newest write-ahead log was damaged or deleted, "+
		"or the data dir stopped taking writes in the last run; "+
		"every recovered rank is reset (degraded) so nothing stale is advertised",
		"lost_commands", rec.Lost, "journal_position", rec.Position, "high_water_mark", rec.Position+rec.Lost)
	st, err := h.ExportState(ctx)
	if err != nil {
		return 0, fmt.Errorf("persist: reset after a damaged journal: %w", err)
	}
	for _, m := range st.Members {
		if err := h.ResetRank(ctx, m.SourceEpoch, m.Lineage.Member, true); err != nil {
			return 0, fmt.Errorf("persist: reset after a damaged journal: %w", err)
		}
	}
	if err := h.Flush(ctx); err != nil && ctx.Err() != nil {
		return 0, ctx.Err()
	}
	// Once the resets are durable the journal is whole again: lower the
	// mark to it (a commit only raises it), so the next start does not
	// report the same loss.
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.durable < p.position && p.writeErr == nil && !p.stopped {
		p.cond.Wait()
	}
	if p.durable == p.position {
		p.writeMark(p.durable)
	}
	return len(st.Members), nil
}

// Admitted implements [producer.Journal].
func (p *PoolLog) Admitted(sourceEpoch uint64, ev *ckf.RouterEvent) {
	p.add(Record{Kind: KindAdmitted, SourceEpoch: sourceEpoch, Event: *ev})
}

// Replaced implements [producer.Journal].
func (p *PoolLog) Replaced(reps []producer.RankReplacement) {
	p.add(Record{Kind: KindReplaced, Reps: reps})
}

// Reset implements [producer.Journal].
func (p *PoolLog) Reset(sourceEpoch uint64, m ckf.Member, degraded bool) {
	p.add(Record{Kind: KindReset, SourceEpoch: sourceEpoch, Member: m, Degraded: degraded})
}

// Position implements [producer.Journal].
func (p *PoolLog) Position() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.position
}

func (p *PoolLog) add(r Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused || p.closing {
		return
	}
	for len(p.pending) >= p.opt.MaxPending && !p.closing && p.writeErr == nil {
		p.cond.Wait() // back-pressure: the disk is behind
	}
	if p.writeErr != nil {
		// Abandoned: the command is admitted but not kept. The first one
		// lost raises the mark; Close raises it to the last.
		p.position++
		if p.markedLost == 0 {
			p.markLost()
		}
		return
	}
	p.pending = append(p.pending, r)
	p.position++
	p.blocks += r.blocks()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// write commits the pending commands, one group commit at a time, until
// Close.
func (p *PoolLog) write() {
	defer func() {
		p.mu.Lock()
		p.stopped = true
		p.cond.Broadcast()
		p.mu.Unlock()
		close(p.done)
	}()
	for {
		p.mu.Lock()
		for len(p.pending) == 0 && !p.closing {
			p.mu.Unlock()
			<-p.wake
			p.mu.Lock()
		}
		batch, closing := p.pending, p.closing
		p.pending = nil
		first := p.position - uint64(len(batch)) + 1
		p.mu.Unlock()
		if len(batch) > 0 {
			err := p.commit(first, batch)
			if err != nil {
				// The database is shared and suspect: every pool stops
				// (abandon), this one included.
				p.store.fail(err)
			}
			p.mu.Lock()
			if err == nil {
				p.durable = first + uint64(len(batch)) - 1
				p.lastCommit = time.Now()
				p.writeMark(p.durable)
			}
			due := err == nil && !p.ckRunning && !p.closing &&
				(p.durable-p.checkpoint >= p.opt.CheckpointEvery || p.blocks >= p.opt.CheckpointEveryBlocks)
			if due {
				p.ckRunning = true
				p.blocks = 0
				p.ckDone.Add(1)
			}
			p.cond.Broadcast()
			p.mu.Unlock()
			if due {
				go p.takeCheckpoint()
			}
		}
		if closing {
			p.mu.Lock()
			empty := len(p.pending) == 0
			p.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

func (p *PoolLog) commit(first uint64, batch []Record) error {
	b := p.store.db.NewBatch()
	if err := p.journalBatch(b, first, batch); err != nil {
		_ = b.Close()
		return err
	}
	return p.store.commit(b) // closes b
}

// journalBatch puts the commands of batch, the first at position first, and
// the commit's time into b.
func (p *PoolLog) journalBatch(b *pebble.Batch, first uint64, batch []Record) error {
	var buf []byte
	for i := range batch {
		var err error
		if buf, err = appendRecord(buf[:0], &batch[i]); err != nil {
			return err
		}
		if err := b.Set(logKey(p.pool, first+uint64(i)), buf, nil); err != nil {
			return err
		}
	}
	var t [8]byte
	binary.BigEndian.PutUint64(t[:], uint64(time.Now().UnixNano()))
	return b.Set(poolKey(p.pool, 't'), t[:], nil)
}

// takeCheckpoint exports the actor's state, waits until the journal up to it
// is durable, then replaces the stored checkpoint and deletes the journal it
// covers, in one atomic commit.
func (p *PoolLog) takeCheckpoint() {
	defer func() {
		p.mu.Lock()
		p.ckRunning = false
		p.mu.Unlock()
		p.ckDone.Done()
	}()
	st, err := p.handle.ExportState(context.Background())
	if err != nil {
		return // the actor stopped; the journal still holds everything
	}
	if err := p.WriteCheckpoint(st); err != nil {
		p.opt.Logger.Error("persist: checkpoint failed; the journal keeps growing", "err", err)
	}
}

// WriteCheckpoint stores st (taken with [producer.Handle.ExportState] from
// the actor this journal records) as the pool's checkpoint once the journal
// up to st.JournalPosition is durable, and deletes that journal.
func (p *PoolLog) WriteCheckpoint(st producer.ExactState) error {
	p.mu.Lock()
	for p.durable < st.JournalPosition && p.writeErr == nil && !p.stopped {
		p.cond.Wait()
	}
	switch {
	case p.writeErr != nil:
		err := p.writeErr
		p.mu.Unlock()
		return err
	case p.durable < st.JournalPosition:
		p.mu.Unlock()
		return errors.New("persist: journal closed before the checkpoint's commands were durable")
	}
	p.mu.Unlock()
	b := p.store.db.NewBatch()
	if err := p.checkpointBatch(b, st); err != nil {
		_ = b.Close()
		return err
	}
	if err := p.store.commit(b); err != nil { // closes b
		return err
	}
	p.mu.Lock()
	p.checkpoint = max(p.checkpoint, st.JournalPosition)
	p.mu.Unlock()
	return nil
}

// checkpointBatch puts into b the replacement of the stored checkpoint by
// st and the deletion of the journal it covers.
func (p *PoolLog) checkpointBatch(b *pebble.Batch, st producer.ExactState) error {
	if err := b.DeleteRange(poolKey(p.pool, 'c'), poolKey(p.pool, 'd'), nil); err != nil {
		return err
	}
	var buf []byte
	for i := range st.Members {
		m := &st.Members[i]
		buf = appendMember(buf[:0], m)
		if err := b.Set(memberKey(p.pool, m.Lineage.Member), buf, nil); err != nil {
			return err
		}
	}
	if err := b.DeleteRange(logKey(p.pool, 0), logKey(p.pool, st.JournalPosition+1), nil); err != nil {
		return err
	}
	mv, _ := json.Marshal(meta{CheckpointPosition: st.JournalPosition, CheckpointUnixNano: time.Now().UnixNano()})
	return b.Set(poolKey(p.pool, 'm'), mv, nil)
}

// Close commits what is pending and stops the writer. Call it after the
// pool's actor has stopped (nothing is journalled after).
func (p *PoolLog) Close(ctx context.Context) error {
	p.mu.Lock()
	started := !p.paused
	p.closing = true
	p.cond.Broadcast()
	if !started && p.mark != nil {
		_ = p.mark.Close()
		p.mark = nil
	}
	p.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	// A checkpoint in flight ends quickly now (the actor has stopped, or
	// its journal is durable); the store must not close under it.
	p.ckDone.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writeErr != nil {
		p.markLost() // every command admitted since the failure
	}
	if p.mark != nil {
		_ = p.mark.Close()
		p.mark = nil
	}
	return p.writeErr
}

// WaitDurable waits until every command journalled before the call is
// committed. It returns nil also once the journal stopped on a store
// failure (Stats.WriteError): the pool then runs without persistence,
// nothing more becomes durable, and a caller holding acknowledgements until
// then would only stall its upstream. It returns ctx's error when ctx ends
// first, and an error when the journal was closed first.
func (p *PoolLog) WaitDurable(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	pos := p.position
	for p.durable < pos && p.writeErr == nil && !p.stopped && ctx.Err() == nil {
		p.cond.Wait()
	}
	switch {
	case p.durable >= pos || p.writeErr != nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return errors.New("persist: journal closed before the commands were durable")
}

// Stats is a point-in-time view of a pool's journal.
type Stats struct {
	Position   uint64    // commands journalled
	Durable    uint64    // commands committed to disk
	Checkpoint uint64    // the position the stored checkpoint includes
	LastCommit time.Time // zero before the first commit
	WriteError string    // set once a write failed; journalling stopped
	// Recovered describes the state loaded at start.
	Recovered       bool
	RecoveredBlocks int
	RecoveredAt     time.Time // when that state was last written
	RecoveredLoad   time.Duration
	// LostCommands is set when the journal ended before its high-water
	// mark (a damaged or deleted write-ahead log): that many journalled
	// commands were lost, and ResetRanks recovered ranks were reset.
	LostCommands uint64
	ResetRanks   int
	// Unverified: Recovered.Unverified.
	Unverified string
}

// Stats returns the journal's state.
func (p *PoolLog) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Position: p.position, Durable: p.durable, Checkpoint: p.checkpoint, LastCommit: p.lastCommit,
		Recovered: p.recovered.Found, RecoveredBlocks: p.recovered.Blocks, RecoveredAt: p.recovered.WrittenAt,
		RecoveredLoad: p.recovered.LoadTime, LostCommands: p.recovered.Lost, ResetRanks: p.recovered.ResetRanks,
		Unverified: p.recovered.Unverified}
	if p.writeErr != nil {
		st.WriteError = p.writeErr.Error()
	}
	return st
}

// storeLogger is Pebble's logger: informational chatter is dropped, errors
// go to the store's log, and a fatal error fails the store instead of
// exiting the process (Pebble's default Fatalf calls os.Exit: one full disk
// would take down every pool and stream of the relay).
type storeLogger struct{ s *Store }

func (storeLogger) Infof(string, ...any) {}

func (l storeLogger) Errorf(format string, args ...any) {
	l.s.opt.Logger.Error("pebble: " + fmt.Sprintf(format, args...))
}

func (l storeLogger) Fatalf(format string, args ...any) {
	l.s.breakDown(fmt.Errorf("%w: pebble: %s", ErrWriteFailed, fmt.Sprintf(format, args...)))
	// Pebble's code after a Fatalf assumes the process has exited: run on,
	// it goes on with a commit pipeline or a MANIFEST it calls broken. So
	// the goroutine that reported it stops here for good, as failFS stops
	// one whose write failed. It is Pebble's (the store calls Open, Commit
	// and Close on goroutines of their own, background work has its own);
	// the store is abandoned and never touched again, so what it holds is
	// released by the exit.
	select {}
}
