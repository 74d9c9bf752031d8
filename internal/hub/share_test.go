package hub

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One client address holds at most MaxSubscribersPerClient subscriptions;
// the other addresses keep the rest of the slots.
func TestHub_ClientShare(t *testing.T) {
	h := newReadyHub(t, Config{QueueDeltas: 1, MaxSubscribers: 4, MaxSubscribersPerClient: 2})
	a1, err := h.SubscribeFrom(lease(1, 0, 1), "10.0.0.1")
	require.NoError(t, err)
	_, err = h.SubscribeFrom(lease(2, 0, 1), "10.0.0.1")
	require.NoError(t, err)
	_, err = h.SubscribeFrom(lease(3, 0, 1), "10.0.0.1")
	require.ErrorIs(t, err, ErrClientShare)
	require.ErrorIs(t, err, ErrTooManySubscribers, "callers answering the pool limit answer the share too")

	// Superseding its own lane's stream takes that stream's share.
	a1b, err := h.SubscribeFrom(lease(1, 0, 2), "10.0.0.1")
	require.NoError(t, err)
	require.ErrorIs(t, a1.Err(), ErrSuperseded)

	// Another address subscribes; superseding that address's stream from
	// the full address is refused (it would add to its share).
	b, err := h.SubscribeFrom(lease(4, 0, 1), "10.0.0.2")
	require.NoError(t, err)
	_, err = h.SubscribeFrom(lease(4, 0, 2), "10.0.0.1")
	require.ErrorIs(t, err, ErrClientShare)
	require.NoError(t, b.Err())

	// An ended subscription frees its share; unattributed ones count for none.
	a1b.Cancel()
	_, err = h.SubscribeFrom(lease(3, 0, 1), "10.0.0.1")
	require.NoError(t, err)
	_, err = h.Subscribe(lease(5, 0, 1))
	require.NoError(t, err)
	h.mu.Lock()
	assert.Equal(t, map[string]int{"10.0.0.1": 2, "10.0.0.2": 1}, h.byClient)
	h.mu.Unlock()
}

func TestHub_ClientShareValidated(t *testing.T) {
	for _, per := range []int{-1, 5} {
		_, err := New(Config{QueueDeltas: 1, MaxSubscribers: 4, MaxSubscribersPerClient: per})
		assert.Error(t, err, "per client %d", per)
	}
}
