package tail

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/wire"
)

// printFrames prints frames from r until EOF, a close frame, or limit frames.
func printFrames(r io.Reader, w io.Writer, limit int) error {
	fr := wire.NewReader(r, 0)
	enc := json.NewEncoder(w)
	var f wire.Frame
	for n := 0; limit == 0 || n < limit; n++ {
		if err := fr.ReadFrame(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := enc.Encode(frameJSON(&f)); err != nil {
			return err
		}
		if f.Kind == wire.KindClose {
			return nil
		}
	}
	return nil
}

func hexWords(words []uint64) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = fmt.Sprintf("%016x", w)
	}
	return out
}

func identityMap(id ckf.ProducerIdentity) map[string]any {
	d := id.Pool.Domain
	return map[string]any{
		"cache_semantics": hex.EncodeToString(d.CacheSemantics.Digest[:]), "routing_scope": hex.EncodeToString(d.RoutingScope.Digest[:]),
		"dc_id": catalog.U64(id.Pool.DCID), "producer_incarnation": catalog.U64(id.ProducerIncarnation),
		"layout_generation": catalog.U64(id.LayoutGeneration), "seed": catalog.U64(id.Format.Seed),
		"bucket_count": catalog.U64(id.Format.BucketCount),
	}
}

func leaseMap(l ckf.LaneLease) map[string]any {
	return map[string]any{"consumer": catalog.U64(l.ConsumerInstance), "lane": l.PhysicalLane, "epoch": catalog.U64(l.AssignmentEpoch)}
}

// frameJSON is the JSON-lines view of one frame; words and images in hex,
// every other 64-bit value as a decimal string as in the catalog (a JSON number
// loses precision above 2^53 in most readers).
func frameJSON(f *wire.Frame) map[string]any {
	switch f.Kind {
	case wire.KindSnapshotChunk:
		s := &f.Snapshot
		return map[string]any{"kind": "snapshot_chunk", "identity": identityMap(s.Identity), "lease": leaseMap(s.Lease),
			"sequence": catalog.U64(s.Sequence), "chunk_index": s.ChunkIndex, "chunk_count": s.ChunkCount,
			"bucket_offset": catalog.U64(s.BucketOffset), "words": hexWords(s.Words)}
	case wire.KindDelta:
		d := &f.Delta
		images := make([]map[string]any, len(d.Images))
		for i, im := range d.Images {
			images[i] = map[string]any{"bucket": im.Bucket, "word": fmt.Sprintf("%016x", im.Word)}
		}
		return map[string]any{"kind": "delta", "identity": identityMap(d.Identity), "lease": leaseMap(d.Lease),
			"base_sequence": catalog.U64(d.BaseSequence), "sequence": catalog.U64(d.Sequence), "images": images}
	case wire.KindDrainMarker:
		return map[string]any{"kind": "drain_marker", "lease": leaseMap(f.Drain.Lease), "expected_sequence": catalog.U64(f.Drain.ExpectedSequence)}
	case wire.KindHeartbeat:
		h := &f.Heartbeat
		return map[string]any{"kind": "heartbeat", "lease": leaseMap(h.Lease), "last_sequence": catalog.U64(h.LastSequence), "unix_micros": catalog.I64(h.UnixMicros)}
	case wire.KindClose:
		return map[string]any{"kind": "close", "reason": string(f.Close.Reason), "message": f.Close.Message}
	}
	return map[string]any{"kind": f.Kind.String()}
}
