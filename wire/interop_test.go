package wire_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/wire"
)

// TestFrame_IndependentDecoder decodes every frame kind the encoder writes
// with a msgpack implementation that shares no code with wire: it must read
// exactly one array of the element count docs/wire.md §2 lists and then find
// the input empty. An encoder and decoder that agree with each other can
// both be wrong (the delta header once said 6 while carrying 7 values); an
// outside decoder cannot be fooled that way.
func TestFrame_IndependentDecoder(t *testing.T) {
	wantElems := map[wire.Kind]int{
		wire.KindSnapshotChunk: 9,
		wire.KindDelta:         7,
		wire.KindDrainMarker:   4,
		wire.KindHeartbeat:     6,
		wire.KindClose:         4,
	}
	frames := sampleFrames()
	seen := map[wire.Kind]bool{}
	for _, f := range frames {
		seen[f.Kind] = true
	}
	require.Len(t, seen, len(wantElems), "a frame kind has no sample")
	for name, f := range frames {
		t.Run(name, func(t *testing.T) {
			b, err := wire.AppendFrame(nil, &f)
			require.NoError(t, err)
			r := bytes.NewReader(b)
			dec := msgpack.NewDecoder(r)
			var v []any
			require.NoError(t, dec.Decode(&v))
			require.Zero(t, r.Len(), "trailing bytes after one msgpack value")
			require.Len(t, v, wantElems[f.Kind])
			require.EqualValues(t, wire.Version, v[0])
			require.EqualValues(t, f.Kind, v[1])
		})
	}
}
