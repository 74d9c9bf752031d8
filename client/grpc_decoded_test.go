package client

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

// bytesLanes is a Lanes that takes encoded frames only (as the WebAssembly
// host does), counting them.
type bytesLanes struct {
	Lanes
	frames atomic.Int64
}

func (b *bytesLanes) ApplyFrame(raw []byte) (consumer.Result, error) {
	b.frames.Add(1)
	return b.Lanes.ApplyFrame(raw)
}

// decodedLanes is a DecodedApplier counting both paths.
type decodedLanes struct {
	*bytesLanes
	decoded atomic.Int64
}

func (d *decodedLanes) ApplyDecodedFrame(f *wire.Frame) (consumer.Result, error) {
	d.decoded.Add(1)
	return d.Lanes.(DecodedApplier).ApplyDecodedFrame(f)
}

// TestGRPC_InstallsDecodedFrames: a gRPC lane installs CBI1 snapshot chunks,
// deltas (an empty one and one with repeated buckets among them) and
// heartbeats without a wire v1 encoding when its Lanes is a DecodedApplier
// (Native), and through one encoding per frame when it takes bytes only
// (the WebAssembly host); the table is the relay's either way.
func TestGRPC_InstallsDecodedFrames(t *testing.T) {
	for _, typed := range []bool{true, false} {
		name := map[bool]string{true: "decoded", false: "bytes"}[typed]
		t.Run(name, func(t *testing.T) {
			bl := &bytesLanes{Lanes: newNative(t)}
			var ls Lanes = bl
			var dl *decodedLanes
			if typed {
				dl = &decodedLanes{bytesLanes: bl}
				ls = dl
			}
			f, addr := startFakeKV(t)
			f.setCatalog(1, descriptor(testID))
			r, err := New(Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{addr}}}, ConsumerInstance: testConsumer,
				Targets:    []Target{{Pool: "p", Lane: 0, DCID: testPool.DCID}},
				MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, ls)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = r.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			s := f.next(t)
			rng := rand.New(rand.NewPCG(7, 8))
			words := randomWords(rng, testFormat.BucketCount)
			f.sendSnapshot(t, s, testID, 5, words, 16)
			for seq := uint64(5); seq < 15; seq++ {
				f.sendDelta(t, s, testID, seq, words, rng)
				s.put(t, f.update(testID, kindHeartbeat, seq+1, seq+1, nil))
			}
			empty, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 15, 16, nil)
			require.NoError(t, err)
			s.put(t, f.update(testID, kindDelta, 15, 16, empty))
			dup := []ckf.BucketImage{{Bucket: 0, Word: 1}, {Bucket: 3, Word: 2}, {Bucket: 0, Word: 3}}
			words[0], words[3] = 3, 2
			b, err := cbi1.EncodeDelta(testFormat, testPool.DCID, 16, 17, dup)
			require.NoError(t, err)
			s.put(t, f.update(testID, kindDelta, 16, 17, b))
			require.Eventually(t, func() bool { w, seq := laneWords(t, r); return seq == 17 && assert.ObjectsAreEqual(words, w) },
				5*time.Second, time.Millisecond, "%+v", r.Lane(0))
			assert.Zero(t, r.Lane(0).Resubscribes)
			applied := int64(r.Lane(0).FramesApplied)
			require.Positive(t, applied)
			if typed {
				assert.Zero(t, bl.frames.Load(), "encoded frames applied to a DecodedApplier")
				assert.Equal(t, applied, dl.decoded.Load(), "decoded frames applied")
			} else {
				assert.Equal(t, applied, bl.frames.Load(), "encoded frames applied")
			}
		})
	}
}
