package client

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// A relay listed as two replicas whose first answers every stream with 503
// (a standby, or a replica that is down): the lane moves to the second and
// installs its snapshot there, and stays there.
func TestRouter_MovesToTheReplicaThatServes(t *testing.T) {
	standbyHits := make(chan struct{}, 64)
	standby := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case standbyHits <- struct{}{}:
		default:
		}
		http.Error(w, `{"error":{"code":"standby"}}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(standby.Close)
	leader, sessions, _ := fakeRelay(t)
	lanes := newNative(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{standby.URL, leader}}}, ConsumerInstance: testConsumer,
		Targets:    []Target{{Pool: "p", Lane: 0}},
		MinBackoff: 1, MaxBackoff: 2, IdleTimeout: -1}, lanes)

	s := nextSession(t, sessions)
	<-standbyHits // the first attempt went to the first replica
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s.epoch), Sequence: 5, Words: words(1)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
	got, _, err := r.AppendLaneWords(nil, 0)
	require.NoError(t, err)
	assert.Equal(t, words(1), got)
	assert.Len(t, standbyHits, 0, "a serving replica keeps the lane: no attempt went back to the standby")
}

// Targets name their relay: two relays, one pool each, and each lane's
// stream goes to its own relay.
func TestRouter_TargetsFollowTheirOwnRelay(t *testing.T) {
	wrong := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not this relay", http.StatusNotFound)
	}))
	t.Cleanup(wrong.Close)
	right, sessions, _ := fakeRelay(t)
	r := startRouter(t, Config{Relays: []Relay{{Addrs: []string{wrong.URL}}, {Addrs: []string{right}}}, ConsumerInstance: testConsumer,
		Targets:    []Target{{Pool: "p", Lane: 0, Relay: 1}},
		MinBackoff: 1, MaxBackoff: 2, IdleTimeout: -1}, newNative(t))
	s := nextSession(t, sessions)
	snap := ckf.Snapshot{Identity: testID, Lease: lease(s.epoch), Sequence: 5, Words: words(2)}
	s.write(t, func(w *wire.Writer) error { return w.WriteSnapshot(&snap) })
	waitFor(t, func() bool { return r.Lane(0).Ready })
}

func TestNew_RejectsBadRelays(t *testing.T) {
	p := []Target{{Pool: "p"}}
	for name, cfg := range map[string]Config{
		"no address":       {Relays: []Relay{{}}, Targets: p},
		"duplicate":        {Relays: []Relay{{Addrs: []string{"http://a", "http://a"}}}, Targets: p},
		"not a URL":        {Relays: []Relay{{Addrs: []string{"127.0.0.1:7878"}}}, Targets: p},
		"target's relay":   {Relays: []Relay{{Addrs: []string{"http://a"}}}, Targets: []Target{{Pool: "p", Relay: 1}}},
		"relays over NATS": {NATS: &NATSConfig{}, Relays: []Relay{{Addrs: []string{"http://a"}}}, Targets: p},
	} {
		_, err := New(cfg, nil)
		assert.Error(t, err, name)
	}
}
