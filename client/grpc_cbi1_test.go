package client

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// TestGRPC_CBI1ErrorClassAsDynamo: a payload in another format whose flags
// are also unknown ends the stream as a format error, as Dynamo's consumer
// (whose decoder takes the subscribed format, publication/cbi1.rs @3e611dbc)
// reports it, not as a flags error.
func TestGRPC_CBI1ErrorClassAsDynamo(t *testing.T) {
	f, addr := startFakeKV(t)
	f.setCatalog(1, descriptor(testID))
	r, _ := startGRPCRouter(t, addr, nil)
	words := randomWords(rand.New(rand.NewPCG(3, 4)), testFormat.BucketCount)
	otherSeed := ckf.NewFormat(testFormat.Seed+1, testFormat.BucketCount)
	b, err := cbi1.EncodeDelta(otherSeed, testPool.DCID, 1, 2, []ckf.BucketImage{{Bucket: 1, Word: 9}})
	require.NoError(t, err)
	binary.LittleEndian.PutUint16(b[6:], 0x8000) // flags are not covered by the checksum

	s := f.next(t)
	f.sendSnapshot(t, s, testID, 1, words, 64)
	require.Eventually(t, func() bool { return r.Lane(0).Ready }, 5*time.Second, time.Millisecond)
	s.put(t, f.update(testID, kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, 1, 2, b))
	require.Eventually(t, func() bool { return r.Lane(0).Resubscribes > 0 }, 5*time.Second, time.Millisecond)
	last := r.Lane(0).LastError
	assert.Contains(t, last, ErrInvalidPublication.Error())
	assert.Contains(t, last, cbi1.ErrFormat.Error())
	assert.NotContains(t, last, cbi1.ErrFlags.Error())
}
