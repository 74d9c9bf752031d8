// Package consumer installs the cuckoo-filter tables of up to 16 pools (one
// per data center, one "lane" each) from a producer's barrier snapshots and
// sequenced deltas, and answers "how many leading blocks of this request does
// each pool hold?" (SPEC §8).
//
// It covers:
//
//   - [Manifest] validation (SPEC §8.2): one domain, distinct pools and
//     dc_ids, a verification window in 1..=8, optional format pins (one for
//     every lane, or per lane); a lane's format is its assignment's.
//   - The per-lane state machine of SPEC §8.3: [Consumer.Assign],
//     [Consumer.InstallSnapshot] / [Consumer.ApplySnapshotChunk],
//     [Consumer.ApplyDelta], [Consumer.Drain], [Consumer.Retire]. Every frame
//     ends in one [Result]: an [Outcome] and, for faults, a [Fault] that maps
//     to ckf's failure point and disposition (SPEC §5). The checks run in the
//     spec's order, which decides whether a frame is ignored or faults.
//   - The transposed tables, one per format group (index = bucket*width +
//     slot; one 16-lane table, index = bucket*16 + lane, when every lane has
//     one format), and the prefix search of SPEC §8.4: [Consumer.Query] (local block hashes),
//     [Consumer.QuerySequenceHashes], [Consumer.QueryTokens] and
//     [Consumer.Contains], plus the linear reference search.
//
// # Invariants
//
//   - A lane is visible to queries exactly when it is ready; its words were
//     then built by one complete snapshot and the gapless deltas after it
//     under the lane's current lease.
//   - Every check of a frame runs before its first write: a frame that is
//     ignored or faults leaves the table untouched. A fault can only clear
//     readiness (and, for deactivation, revoke the lease).
//   - After any deactivation the host must [Consumer.Assign] a greater
//     assignment epoch and send a fresh snapshot; epochs only increase, even
//     across [Consumer.Retire].
//   - For a lane whose membership over the query is monotone (a hit prefix,
//     then only misses) the fast search returns exactly the linear scan's
//     depth; every query probes each position at most once.
//
// # Concurrency and platforms
//
// A [Consumer] is single-threaded: the caller serializes frames and queries.
// The package starts no goroutine, uses no cgo and no OS resource, and builds
// and tests for GOOS=wasip1 GOARCH=wasm, where it is the guest's core. Queries
// do not allocate once their scratch has grown to the request length.
//
// See docs/RATIONALE.md ("Why …?" sections on the consumer) for the design
// decisions: in-place staging of snapshot chunks, lease revocation on
// deactivation, per-query probe memoisation, heartbeat gap detection.
package consumer
