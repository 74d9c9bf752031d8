// Package e2e ties the relay's parts together under test: random event
// histories go through the real producer actor (package producer), every delta,
// snapshot chunk, heartbeat and drain marker crosses a length-prefixed wire v1
// stream (package wire), and a consumer (package consumer) decodes and applies
// each frame into its lanes. It checks SPEC §8 end to end: a lane always
// equals its producer's table, and a query finds every chain the producer
// holds resident (SPEC §8.4: no false negatives).
//
// The package holds tests only. Its harness keeps, per pool (rig_test.go
// builds it; model_test.go, link_test.go and check_test.go hold the model's
// operations, the wire link and the checks):
//
//   - a reference model of every member's lineage (which external hash names
//     which canonical chain), its source epoch and the faults, stale drops,
//     unknown removals and capacity omissions the actor must report;
//   - a shadow ckf.Pool fed the same operations in the same order, whose
//     residency says which canonical hashes the producer claims to hold;
//   - a mirror of the producer's table rebuilt from the subscription itself
//     (snapshot plus every delta, before any encoding);
//   - the wire link, a bytes.Buffer between a wire.Writer and a wire.Reader,
//     with a queue of what the consumer must answer to each frame.
//
// At each checkpoint it asserts that the mirror equals the shadow (the actor
// applied exactly what the model says), that the consumer lane equals the
// mirror (wire and consumer lost or bent nothing), that a fresh Subscribe
// snapshot equals both, and that every chain the producer holds resident is
// found at its full depth on its lane (no false negatives). Every frame
// reaches the consumer through the router's session gate (client.Session),
// one session per lease; half the property runs add a hostile stream on a
// lane of its own that sends deltas, heartbeats, drain markers and snapshot
// chunks under the pools' current leases and identities (hostile_test.go):
// each must end the hostile session with client.ErrProtocol and leave the
// victim lane exactly as it was, and the property holds for the honest lanes. A drain marker
// after Shutdown must be acknowledged exactly; a deliberately dropped delta
// must deactivate the lane (gap, heartbeat or drain marker) and a new lease
// epoch with a fresh snapshot must recover it.
//
// Each property run executes inside a testing/synctest bubble (rapid.SyncTest):
// pumps wait for the actors to settle and the publication timer fires only in
// an explicit idle step, so a failure replays from the -rapid.seed it prints
// and shrinks. The default run takes about 2 s (5 s under -race); -short cuts
// the history length. See docs/RATIONALE.md "Why does the end-to-end property
// (internal/integration/e2e) keep a shadow pool and run in a synctest bubble?".
package e2e
