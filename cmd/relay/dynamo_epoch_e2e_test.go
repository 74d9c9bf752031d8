//go:build unix

package main

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/server"
	"github.com/ckfrelay/ckfrelay/internal/source/dynamonats"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// dynamoRelay runs the relay binary with one pool fed by a core-NATS Dynamo
// source, and returns it with a publisher for the subject.
func dynamoRelay(t *testing.T, ns *natstest.Server, dataDir string, timeout time.Duration) (*relay, func(publisher, seq uint64, evs ...ckf.RouterEvent)) {
	t.Helper()
	const subject = "namespace.dynamo.component.backend.kv-events"
	cfg := server.Config{Listen: "127.0.0.1:0", DataDir: dataDir,
		Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 1 << 16, PublishEveryNEvents: 1,
			Sources: []server.SourceSpec{{Engine: "dynamo", URL: ns.URL(), Subject: subject, SourceTimeout: server.Duration(timeout)}}}}}
	rl := startRelay(t, "--config", writeConfig(t, cfg))
	require.Eventually(t, func() bool { st, _ := sourceOf(t, rl.base, "p"); return st.State == "live" }, 10*time.Second, 5*time.Millisecond)
	nc, err := nats.Connect(ns.URL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return rl, func(publisher, seq uint64, evs ...ckf.RouterEvent) {
		t.Helper()
		b, err := dynamonats.Encode(dynamonats.Envelope{Topic: "kv-events", PublisherID: publisher, Sequence: seq, PublishedAt: 1}, evs)
		require.NoError(t, err)
		require.NoError(t, nc.Publish(subject, b))
		require.NoError(t, nc.Flush())
	}
}

func waitBlocks(t *testing.T, rl *relay, want int, msg string) {
	t.Helper()
	var got int
	require.Eventually(t, func() bool { _, got = sourceOf(t, rl.base, "p"); return got == want }, 10*time.Second, 5*time.Millisecond,
		"%s: want %d blocks", msg, want)
}

// TestE2E_DynamoMemberAfterDataDirRestart: the relay binary restarted on its
// data dir recovers worker 1's three blocks; the engine removed them while
// the relay was away (that message is lost with it) and stores block 10.
// The first contact announces a new epoch: the removed blocks are no longer
// advertised and block 10 is, with no event refused, the source live.
func TestE2E_DynamoMemberAfterDataDirRestart(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	dir := t.TempDir()
	rl, pub := dynamoRelay(t, ns, dir, 0)
	pub(7, 0, dynStored(1, 1, 3))
	waitBlocks(t, rl, 3, "stored")
	require.Eventually(t, func() bool {
		ps := catalogPersistence(t, rl.base, "p")
		return ps.JournalPosition > 0 && ps.DurablePosition == ps.JournalPosition
	}, 10*time.Second, 5*time.Millisecond)
	rl.kill()
	pub(7, 1, ckf.RouterEvent{WorkerID: 1, EventID: 2, Kind: ckf.EventRemoved, BlockHashes: []uint64{1 << 20, 1<<20 | 1, 1<<20 | 2}})

	rl2, pub := dynamoRelay(t, ns, dir, 0)
	waitBlocks(t, rl2, 3, "recovered")
	pub(7, 2, dynStored(1, 10, 1))
	waitBlocks(t, rl2, 1, "only block 10 is advertised")
	st, _ := sourceOf(t, rl2.base, "p")
	assert.Equal(t, "live", st.State)
	assert.EqualValues(t, 1, st.Resets, "first contact announced the member's epoch")
	assert.Empty(t, getCatalog(t, rl2.base)["p"].Stats.LastFault, "no event refused")
}

// TestE2E_DynamoMemberBackAfterSourceTimeout: a member reset for silence
// past source_timeout is admitted again when it speaks.
func TestE2E_DynamoMemberBackAfterSourceTimeout(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	rl, pub := dynamoRelay(t, ns, "", 300*time.Millisecond)
	pub(7, 0, dynStored(1, 1, 2))
	waitBlocks(t, rl, 2, "stored")
	waitBlocks(t, rl, 0, "reset after source_timeout")
	pub(7, 1, dynStored(1, 2, 1))
	waitBlocks(t, rl, 1, "the returning member's block is advertised")
	st, _ := sourceOf(t, rl.base, "p")
	assert.Equal(t, "live", st.State)
	assert.Empty(t, getCatalog(t, rl.base)["p"].Stats.LastFault, "no event refused")
}
