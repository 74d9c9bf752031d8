package zmq

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/sim/engine"
)

// BenchmarkDecodeConvert decodes one engine batch (64 Stored events × 4
// blocks of 16 tokens, in each event form) and converts it, hashing every
// block's tokens: the source's own CPU cost per batch, without sockets or the
// pool. It shows whether msgpack decoding could bound ZMQ ingest.
func BenchmarkDecodeConvert(b *testing.B) {
	for _, form := range []struct {
		name string
		f    engine.Form
	}{{"positional", engine.Positional}, {"named", engine.Named}} {
		b.Run("form="+form.name, func(b *testing.B) {
			const events, blocks, size = 64, 4, 16
			e, err := engine.Start(engine.Config{Endpoint: "inproc://bench-" + form.name, Form: form.f, BlockSize: size})
			require.NoError(b, err)
			defer e.Close()
			var evs []engine.Event
			tok := uint32(0)
			for i := range events {
				ev := engine.Event{Type: "BlockStored"}
				for j := range blocks {
					ev.BlockHashes = append(ev.BlockHashes, uint64(i*blocks+j+1)<<20)
					for range size {
						tok++
						ev.TokenIDs = append(ev.TokenIDs, tok)
					}
				}
				evs = append(evs, ev)
			}
			payload, err := e.EncodeBatch(evs...)
			require.NoError(b, err)
			d := NewDecoder(Limits{})
			cv := Converter{Worker: 1, BlockSize: size}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				bt, err := d.DecodeBatch(payload)
				if err != nil {
					require.Fail(b, fmt.Sprint(err))
				}
				for i := range bt.Events {
					if _, ok, _, _ := cv.Convert(&bt.Events[i], 0, 1); !ok {
						require.Fail(b, "not converted")
					}
				}
			}
			b.ReportMetric(float64(b.N*events*blocks)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
