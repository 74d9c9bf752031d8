// Package natsjs names the JetStream resources through which a relay
// broadcasts one pool's frames (docs/wire.md §7), so the relay's publisher
// and the router's NATS transport agree on them in one place. It is public
// because it is part of the contract a router in any language (or an operator
// writing NATS permissions) reads.
//
// Per pool, under a prefix (default "ckfrelay"):
//   - stream "<prefix>_<pool>" on subject "<prefix>.<pool>.frames": every
//     delta, heartbeat, and at shutdown a drain marker and a close frame,
//     each one wire v1 frame body per message, each expecting the one before
//     it (Nats-Expected-Last-Subject-Sequence) so that only one publisher's
//     chain is stored, with Nats-Msg-Id [MsgID] so that a retry after a
//     timeout is a duplicate;
//   - on subject "<prefix>.<pool>.snapshot" of the same stream, the snapshot
//     pointer: a message without body whose headers name the newest snapshot
//     object (see [Pointer]), published expecting the frames subject's last
//     message, so that only the publisher whose chain is the subject's tail
//     can move it;
//   - object store bucket "<prefix>_<pool>_snapshot", one object per producer
//     incarnation ([SnapshotObjectName]): the incarnation's newest snapshot as
//     length-prefixed snapshot-chunk frames, with its sequence, the producer
//     incarnation and the stream sequence to read the stream from in the
//     object's metadata. Objects of older incarnations are deleted once a
//     newer incarnation's pointer is stored.
package natsjs

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix prefixes every subject, stream and bucket name.
const DefaultPrefix = "ckfrelay"

// SnapshotObject is the snapshot's object name of relays before the pointer
// ([Pointer]): a reader falls back to it when the stream holds no pointer.
const SnapshotObject = "snapshot"

// snapshotPrefix prefixes the per-incarnation object names.
const snapshotPrefix = "snapshot-"

// SnapshotObjectName is the object holding the newest snapshot of producer
// incarnation inc: "snapshot-" and the incarnation as 16 hexadecimal digits,
// so that names sort as incarnations do.
func SnapshotObjectName(inc uint64) string {
	return fmt.Sprintf("%s%016x", snapshotPrefix, inc)
}

// SnapshotObjectIncarnation parses a name of [SnapshotObjectName]; ok is
// false for any other name (the legacy [SnapshotObject] among them).
func SnapshotObjectIncarnation(name string) (inc uint64, ok bool) {
	hex, found := strings.CutPrefix(name, snapshotPrefix)
	if !found || len(hex) != 16 {
		return 0, false
	}
	inc, err := strconv.ParseUint(hex, 16, 64)
	return inc, err == nil
}

// Metadata keys of the snapshot object (must-not-change: routers read them).
const (
	// MetaSequence is the snapshot's sequence (decimal).
	MetaSequence = "ckf-sequence"
	// MetaIncarnation is the producer incarnation that wrote it (decimal).
	MetaIncarnation = "ckf-incarnation"
	// MetaStreamSequence is the JetStream stream sequence of the first
	// message published after the snapshot (decimal): a reader consumes from
	// it. Every delta after the snapshot is at or after it.
	MetaStreamSequence = "ckf-stream-seq"
	// MetaObject is the pointer's header naming the snapshot object.
	MetaObject = "ckf-object"
)

// Pointer is what the pointer message on [Layout.Pointer] says: which object
// holds the newest snapshot, its sequence and incarnation (equal to the
// object's metadata) and the stream sequence to read the frames from. Its
// headers carry the fields under MetaObject, MetaSequence, MetaIncarnation
// and MetaStreamSequence.
type Pointer struct {
	Object                                string
	Sequence, Incarnation, StreamSequence uint64
}

// Header returns the pointer message's headers.
func (p Pointer) Header() map[string][]string {
	return map[string][]string{
		MetaObject:         {p.Object},
		MetaSequence:       {strconv.FormatUint(p.Sequence, 10)},
		MetaIncarnation:    {strconv.FormatUint(p.Incarnation, 10)},
		MetaStreamSequence: {strconv.FormatUint(p.StreamSequence, 10)},
	}
}

// ParsePointer reads a pointer message's headers. The object must be the
// incarnation's [SnapshotObjectName]: a reader never fetches a name a
// message chose freely.
func ParsePointer(h map[string][]string) (Pointer, error) {
	get := func(k string) string {
		if v := h[k]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	var p Pointer
	var err error
	for _, f := range []struct {
		key string
		v   *uint64
	}{{MetaSequence, &p.Sequence}, {MetaIncarnation, &p.Incarnation}, {MetaStreamSequence, &p.StreamSequence}} {
		if *f.v, err = strconv.ParseUint(get(f.key), 10, 64); err != nil {
			return Pointer{}, fmt.Errorf("natsjs: snapshot pointer header %s: %w", f.key, err)
		}
	}
	p.Object = get(MetaObject)
	if p.Object != SnapshotObjectName(p.Incarnation) {
		return Pointer{}, fmt.Errorf("natsjs: snapshot pointer names object %q for incarnation %d", p.Object, p.Incarnation)
	}
	return p, nil
}

var token = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Layout names one pool's JetStream resources.
type Layout struct {
	Stream  string // JetStream stream name
	Subject string // the frames subject
	Pointer string // the snapshot pointer's subject (same stream)
	Bucket  string // object store bucket of the snapshots
}

// For returns the layout of pool under prefix ("" means [DefaultPrefix]).
// Both must be 1–64 characters of [A-Za-z0-9_-], valid in subject tokens,
// stream names and bucket names alike.
func For(prefix, pool string) (Layout, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !token.MatchString(prefix) {
		return Layout{}, fmt.Errorf("natsjs: prefix %q must match %s", prefix, token)
	}
	if !token.MatchString(pool) {
		return Layout{}, fmt.Errorf("natsjs: pool %q must match %s", pool, token)
	}
	return Layout{
		Stream:  prefix + "_" + pool,
		Subject: prefix + "." + pool + ".frames",
		Pointer: prefix + "." + pool + ".snapshot",
		Bucket:  prefix + "_" + pool + "_snapshot",
	}, nil
}

// MsgID is the Nats-Msg-Id of the n-th message a publisher published, a
// frame (or pointer) at sequence of a producer incarnation: JetStream drops a
// second message with the same id within its duplicate window, so a retry
// after a timeout is a duplicate; n tells apart the heartbeats, the pointer
// and the end frames at one sequence, and a new incarnation never collides
// with an old one (each has its own publisher).
func MsgID(incarnation, sequence, n uint64) string {
	return strconv.FormatUint(incarnation, 10) + "." + strconv.FormatUint(sequence, 10) + "." + strconv.FormatUint(n, 10)
}

// Retention returns how long the frames stream keeps messages when the
// snapshot is refreshed every interval: three intervals, so the newest
// snapshot (at most one interval old, plus the time to write it) and every
// delta after it are always retained, with an interval to spare for a
// refresh that failed once.
func Retention(interval time.Duration) time.Duration { return 3 * interval }

// DuplicateWindow returns the stream's deduplication window: two minutes
// (JetStream's default) or the retention, whichever is shorter (JetStream
// requires it to be at most the stream's max age).
func DuplicateWindow(retention time.Duration) time.Duration {
	return min(2*time.Minute, retention)
}
