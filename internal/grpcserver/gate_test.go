package grpcserver

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/tap"
)

// The gate's own rules on a fake clock, apart from any connection's reader:
// at max_pending_streams the stream pending longest (the first the gate
// saw) is cut, an admitted stream is never cut, and a pending one is cut at
// its first-request deadline, not a moment before. The tests over real
// connections (hostile_test.go) order their peers' HEADERS with a PING,
// because the relay reads each connection on its own goroutine.
func TestGate_BoundAndDeadlineOnAFakeClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const deadline = time.Second
		g := newGate("", deadline, 0, 2)
		open := func() context.Context {
			ctx, err := g.tap(t.Context(), &tap.Info{FullMethodName: methodCatalog})
			require.NoError(t, err)
			return ctx
		}
		first, second := open(), open()
		time.Sleep(deadline / 2)
		third := open() // past the bound: the longest-pending goes
		synctest.Wait()
		require.ErrorIs(t, first.Err(), context.Canceled, "the longest-pending stream is cut")
		require.NoError(t, second.Err())
		require.NoError(t, third.Err())
		assert.False(t, g.admit(first), "a cut stream is not admitted")
		assert.Equal(t, 2, g.pendingLen())

		require.True(t, g.admit(third), "a pending stream whose request arrived is admitted")
		time.Sleep(deadline/2 - time.Nanosecond)
		synctest.Wait()
		require.NoError(t, second.Err(), "not cut before its first-request deadline")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		require.ErrorIs(t, second.Err(), context.Canceled, "cut at its first-request deadline")

		time.Sleep(10 * deadline)
		synctest.Wait()
		require.NoError(t, third.Err(), "an admitted stream is never cut")
		assert.Equal(t, uint64(2), g.cut.Load(), "one cut by the bound, one by the deadline")
		assert.Zero(t, g.pendingLen())
	})
}
