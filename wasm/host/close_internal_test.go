package host

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// TestRuntimeClose_DuringCall holds a query inside the module (a pause point
// before the export runs, the instance lock held), closes the runtime from
// another goroutine, waits until the runtime reports itself closed through
// its API, and only then lets the query run. Freeing the instance's linear
// memory under the running call faulted the process ("fatal error: fault");
// now Close waits for the call, the call answers, and every later call and
// NewInstance returns ErrClosed.
func TestRuntimeClose_DuringCall(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, NewConfig().WithCompilationCacheDir(filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")))
	require.NoError(t, err)
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}}
	man := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 1<<12), VerificationWindow: 2}
	man.Lanes[0] = &ckf.PoolID{Domain: d, DCID: 2}
	in, err := rt.NewInstance(ctx, man)
	require.NoError(t, err)

	inCall, release := make(chan struct{}), make(chan struct{})
	testHookCall = func(fn abi.Export) {
		if fn == abi.ExportQuery {
			testHookCall = nil // only the first query pauses
			close(inCall)
			<-release
		}
	}
	t.Cleanup(func() { testHookCall = nil })

	queryDone := make(chan error, 1)
	go func() {
		var res consumer.QueryResult
		queryDone <- in.QuerySequenceHashes(make([]uint64, 1<<16), &res)
	}()
	<-inCall
	closeDone := make(chan error, 1)
	go func() { closeDone <- rt.Close(ctx) }()
	// Wait through the API until Close has begun: from then on NewInstance
	// refuses. (Close cannot finish: the query holds the instance.)
	var refused error
	for refused == nil {
		_, refused = rt.NewInstance(ctx, man)
	}
	close(release)
	assert.ErrorIs(t, refused, ErrClosed, "NewInstance after Close began")
	assert.ErrorIs(t, <-queryDone, consumer.ErrUnavailable, "the query in flight when Close began finishes normally")
	require.NoError(t, <-closeDone)
	var res consumer.QueryResult
	assert.ErrorIs(t, in.QuerySequenceHashes([]uint64{1}, &res), ErrClosed)
	_, err = in.ApplyFrame([]byte{0x90})
	assert.True(t, errors.Is(err, ErrClosed), "apply after Close: %v", err)
}
