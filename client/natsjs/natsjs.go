// Package natsjs names the JetStream resources through which a relay
// broadcasts one pool's frames (docs/wire.md §7), so the relay's publisher
// and the router's NATS transport agree on them in one place. It is public
// because it is part of the contract a router in any language (or an operator
// writing NATS permissions) reads.
//
// Per pool, under a prefix (default "ckfrelay"):
//   - stream "<prefix>_<pool>" on subject "<prefix>.<pool>.frames": every
//     delta (Nats-Msg-Id "<incarnation>.<sequence>", so a re-publish after a
//     reconnect is deduplicated), heartbeats, and at shutdown a drain marker
//     and a close frame, each one wire v1 frame body per message;
//   - object store bucket "<prefix>_<pool>_snapshot", object "snapshot": the
//     newest snapshot as length-prefixed snapshot-chunk frames, with its
//     sequence, the producer incarnation and the stream sequence to read the
//     stream from in the object's metadata.
package natsjs

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// DefaultPrefix prefixes every subject, stream and bucket name.
const DefaultPrefix = "ckfrelay"

// SnapshotObject is the snapshot's object name inside its bucket.
const SnapshotObject = "snapshot"

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
)

var token = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Layout names one pool's JetStream resources.
type Layout struct {
	Stream  string // JetStream stream name
	Subject string // the frames subject
	Bucket  string // object store bucket of the snapshot
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
		Bucket:  prefix + "_" + pool + "_snapshot",
	}, nil
}

// MsgID is the Nats-Msg-Id of the delta at sequence from a producer
// incarnation: JetStream drops a second message with the same id within its
// duplicate window, and a new incarnation never collides with an old one.
func MsgID(incarnation, sequence uint64) string {
	return strconv.FormatUint(incarnation, 10) + "." + strconv.FormatUint(sequence, 10)
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
