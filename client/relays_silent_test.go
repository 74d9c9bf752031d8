package client

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// A relay listed as two replicas whose first accepts the stream request and
// never answers (a stalled process: the kernel accepts for it): the
// session's idle timeout ends the attempt and the lane moves to the second
// replica, instead of retrying the silent one for as long as it is stalled.
func TestRouter_MovesPastASilentReplica(t *testing.T) {
	silentHits := make(chan struct{}, 64)
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case silentHits <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	}))
	t.Cleanup(silent.Close)
	leader, sessions, _ := fakeRelay(t)
	lanes := newNative(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{silent.URL, leader}}}, ConsumerInstance: testConsumer,
		Targets:    []Target{{Pool: "p", Lane: 0}},
		MinBackoff: 1, MaxBackoff: 2, IdleTimeout: 300 * time.Millisecond}, lanes)

	<-silentHits // the first attempt went to the silent replica
	s := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s.epoch), Sequence: 5, Words: words(1)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
	_, seq, err := r.AppendLaneWords(nil, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(5), seq)
}
