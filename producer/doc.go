// Package producer publishes one pool's exact KV-block state as a sequenced
// stream of cuckoo-filter bucket images (SPEC §6–§7).
//
// It has three layers, each built on the one before:
//
//   - [Publisher] owns a pool's stream: the producer identity, the current
//     consumer lease, the checked last sequence and the fence reason. It turns
//     the unsequenced [ckf.Batch]es a [ckf.Pool] drains into [ckf.Delta]s for
//     a [Sink], and cuts barrier [ckf.Snapshot]s whose first continuation is
//     exactly N → N+1. Sequences count batches, not events.
//   - The actor ([Start], [Handle]) is one goroutine that owns a pool and its
//     publisher. Callers admit events through a bounded mailbox with payload
//     permits weighted by block count; admission returns once queued. The
//     actor enforces per-member source epochs, publishes at the pool's cadence
//     or after [Config.PublicationDelay] for a sparse tail, reports faults
//     (mapped through [ckf.FailurePointOf] and [ckf.DispositionOf]) on a
//     bounded channel, and serves one [Subscription] at a time. Shutdown
//     drains and publishes; Fence discards the uncertain tail.
//   - [RecoveryTarget] batches rank replacements (quiet window, initial
//     recovery wave, [RebuildPermit]) so a cold start is one rebuild.
//
// # Invariants
//
//   - A subscription's deltas are gapless: each has base = previous sequence
//     and sequence = base+1, starting at the snapshot's sequence, and the
//     snapshot plus every delta equals the pool's words. A subscriber that
//     cannot keep up is closed with [ErrLagged]; a delta is never skipped.
//   - A failed enqueue never advances the sequence; the publisher fences
//     until a new lease is installed from a barrier snapshot.
//   - Nothing admitted is dropped silently: it is applied, or (after a fence)
//     refused with an error to a waiting caller, or (a superseded source
//     epoch) counted in [ActorStats.StaleEventsDropped].
//   - A capacity omission is never a fault.
//
// # Concurrency
//
// [Handle] and [RecoveryTarget] are safe for concurrent use; a Handle is a
// small value to copy. [Publisher] is owned by one goroutine. Tests drive
// time with testing/synctest, so the publication timer, quiet window and
// initial deadline fire exactly when a test says, without an injected clock.
//
// See docs/RATIONALE.md ("Why does the producer actor …?") for the design
// decisions.
package producer
