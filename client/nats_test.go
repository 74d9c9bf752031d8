package client

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ckfrelay/ckfrelay/client/natsjs"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNATS_StalledSnapshotGivesUpWithinItsBudget: a snapshot whose chunks
// vanish while it is read (the relay replaced it) stalls the object read;
// the load must give up after its size budget, not the whole
// SnapshotTimeout, so the lane retries with the new snapshot.
func TestNATS_StalledSnapshotGivesUpWithinItsBudget(t *testing.T) {
	ns := natstest.Start(t, natstest.Options{})
	_, js := ns.JetStream(t)
	layout, err := natsjs.For("", "p")
	require.NoError(t, err)
	ctx := context.Background()
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: layout.Bucket})
	require.NoError(t, err)
	ptr := natsjs.Pointer{Object: natsjs.SnapshotObjectName(3), Incarnation: 3, Sequence: 1, StreamSequence: 1}
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: ptr.Object,
		Metadata: map[string]string{natsjs.MetaSequence: "1", natsjs.MetaStreamSequence: "1", natsjs.MetaIncarnation: "3"}}, strings.NewReader(strings.Repeat("x", 1000)))
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: layout.Stream, Subjects: []string{layout.Subject, layout.Pointer}})
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: layout.Pointer, Header: ptr.Header()})
	require.NoError(t, err)
	// Purge the object's chunks, as a replacing Put does, leaving its info.
	st, err := js.Stream(ctx, "OBJ_"+layout.Bucket)
	require.NoError(t, err)
	require.NoError(t, st.Purge(ctx, jetstream.WithPurgeSubject("$O."+layout.Bucket+".C."+info.NUID)))

	tr := newNATSTransport(NATSConfig{URL: ns.URL(), SnapshotTimeout: time.Minute})
	defer tr.close()
	t0 := time.Now()
	_, _, err = tr.loadSnapshot(ctx, mustJS(t, tr), layout)
	require.ErrorContains(t, err, "reading the snapshot", "the read of the object the pointer names stalled")
	assert.Less(t, time.Since(t0), 30*time.Second, "gave up after %v", time.Since(t0))
	assert.Equal(t, 2*time.Second+time.Second/10*4, snapshotReadBudget(4<<20))
}

func mustJS(t *testing.T, tr *natsTransport) jetstream.JetStream {
	t.Helper()
	js, err := tr.jetStream()
	require.NoError(t, err)
	return js
}

func TestNew_OneTransport(t *testing.T) {
	targets := []Target{{Pool: "p", Lane: 0}}
	_, err := New(Config{Relays: []Relay{{Addrs: []string{"http://x"}}}, NATS: &NATSConfig{URL: "nats://x"}, Targets: targets}, nil)
	assert.Error(t, err, "HTTP and NATS at once")
	_, err = New(Config{Targets: targets}, nil)
	assert.Error(t, err, "neither")
	r, err := New(Config{NATS: &NATSConfig{URL: "nats://x"}, Targets: targets}, nil)
	require.NoError(t, err)
	assert.NotNil(t, r.nats)
}
