// Package ckf implements the ckfrelay cuckoo-filter format and the exact
// producer state of one pool (SPEC §2–§5).
//
// The package has two layers:
//
//   - The format layer: [Config], [Format], addressing ([Addresser]), packed
//     4×16-bit buckets ([Bucket]), the SplitMix64 generator ([RNG]), the
//     bounded-kick cuckoo [Filter], and the token/sequence hashing of SPEC §3.
//     It is bit-compatible with NVIDIA Dynamo's DC KV relay: the same
//     (seed, bucket count, max kicks) and the same stream of inserts and
//     removes produce the same bucket words. This layer has no goroutines and
//     no cgo and builds for GOOS=wasip1 GOARCH=wasm; the consumer reuses it.
//
//   - The exact layer: [Pool] keeps, per pool, which member (worker_id,
//     dp_rank) owns which canonical block, refcounted, and projects that record
//     into the filter. It tracks the buckets each event dirtied and drains them
//     into [Batch]es of absolute bucket images for publication.
//
// Shared identity types ([PoolID], [ProducerIdentity], [LaneLease],
// [DrainMarker]) live here because the producer, the wire codecs and the
// consumer all exchange them.
//
// # Invariants
//
//   - A filter slot is non-zero exactly when a resident canonical hash placed
//     it there; the number of occupied slots equals the number of resident
//     canonical hashes in the pool.
//   - Every resident canonical hash is found by [Filter.Contains] (no false
//     negatives).
//   - A pool never deletes by fingerprint alone: only the last owner's removal
//     of a resident canonical hash clears a slot.
//   - A consumer table built from a barrier snapshot plus every batch drained
//     after it equals the pool's current words.
//
// # Concurrency
//
// Nothing in this package is safe for concurrent mutation. A [Pool] is owned
// by one goroutine (the producer's actor); immutable values ([Format],
// [Addresser], identities) may be shared freely.
//
// See docs/RATIONALE.md for the design decisions behind these choices.
package ckf
