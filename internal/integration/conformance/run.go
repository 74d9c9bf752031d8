package conformance

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// Factory builds a fresh consumer for a manifest: client.NewNative, or an
// instance of a wazero runtime.
type Factory func(m consumer.Manifest) (client.Lanes, error)

// Run executes every step of s on a consumer from newConsumer and returns
// one message per step whose result differs from the file ("step 3 (apply:
// gap): got … want …"); nil means the implementation conforms.
func Run(s *Scenario, newConsumer Factory) ([]string, error) {
	m, err := abi.DecodeManifest(s.Manifest)
	if err != nil {
		return nil, fmt.Errorf("conformance: %s: manifest: %w", s.Name, err)
	}
	c, err := newConsumer(m)
	if err != nil {
		return nil, fmt.Errorf("conformance: %s: new consumer: %w", s.Name, err)
	}
	if cl, ok := c.(interface{ Close() error }); ok {
		defer cl.Close()
	}
	var diffs []string
	for i := range s.Steps {
		st := &s.Steps[i]
		got, err := Exec(c, st)
		if err != nil {
			return diffs, fmt.Errorf("conformance: %s step %d: %w", s.Name, i, err)
		}
		if !reflect.DeepEqual(got, normalize(st.Op, st.Want)) {
			diffs = append(diffs, fmt.Sprintf("%s step %d (%s: %s): got %+v, want %+v", s.Name, i, st.Op, st.Note, got, st.Want))
		}
	}
	return diffs, nil
}

// normalize keeps only the fields an op reports, so a Want read from JSON
// (omitted fields zero) compares equal to an Exec result.
func normalize(op Op, w Want) Want {
	switch op {
	case OpApply:
		return Want{Code: w.Code, Outcome: w.Outcome, Fault: w.Fault, ResLane: w.ResLane, Sequence: w.Sequence}
	case OpQuery:
		d := w.Depths
		if d == nil {
			d = make([]uint32, ckf.MaxLanes)
		}
		return Want{Code: w.Code, Mask: w.Mask, Depths: d, Blocks: w.Blocks}
	case OpStatus:
		return Want{Code: w.Code, Ready: w.Ready, Assigned: w.Assigned, Installed: w.Installed,
			LastEpoch: w.LastEpoch, Staging: w.Staging, LastOut: w.LastOut, LastFault: w.LastFault,
			Seed: w.Seed, BucketCount: w.BucketCount}
	case OpWords:
		return Want{Code: w.Code, SHA256: w.SHA256}
	}
	return Want{Code: w.Code}
}

// Exec runs one step and returns its result in Want's shape. An error means
// the step itself is unusable (bad bytes in the file), not a mismatch.
func Exec(c client.Lanes, st *Step) (Want, error) {
	switch st.Op {
	case OpAssign:
		id, lease, err := abi.DecodeAssignment(st.Assignment)
		if err != nil {
			return Want{}, err
		}
		return Want{Code: int32(abi.CodeOf(c.Assign(id, lease)))}, nil
	case OpRetire:
		return Want{Code: int32(abi.CodeOf(c.Retire(st.Lane)))}, nil
	case OpApply:
		r, err := c.ApplyFrame(st.Frame)
		if err != nil {
			return Want{Code: int32(abi.CodeOf(err)), ResLane: -1}, nil
		}
		return normalize(OpApply, Want{Code: int32(r.Outcome), Outcome: uint8(r.Outcome), Fault: uint8(r.Fault),
			ResLane: r.Lane, Sequence: U64(r.Sequence)}), nil
	case OpQuery:
		var res consumer.QueryResult
		hashes := make([]uint64, len(st.Hashes))
		for i, h := range st.Hashes {
			hashes[i] = uint64(h)
		}
		var err error
		switch st.Kind {
		case abi.QueryLocalHashes:
			err = c.Query(hashes, &res)
		case abi.QuerySequenceHashes:
			err = c.QuerySequenceHashes(hashes, &res)
		case abi.QueryTokens:
			err = c.QueryTokens(st.Tokens, st.intBlockSize(), uint64(st.Salt), &res)
		case abi.QueryTokensWith:
			err = c.QueryTokensWith(st.Tokens, st.intBlockSize(), uint64(st.Salt), st.HashOptions(), &res)
		default:
			return Want{}, fmt.Errorf("unknown query kind %d", st.Kind)
		}
		code := int32(res.Mask)
		if err != nil {
			code = int32(abi.CodeOf(err))
		}
		return Want{Code: code, Mask: res.Mask, Depths: res.Depths[:], Blocks: res.Blocks}, nil
	case OpContains:
		mask, err := c.Contains(uint64(st.Hash))
		if err != nil {
			return Want{Code: int32(abi.CodeOf(err))}, nil
		}
		return Want{Code: int32(mask)}, nil
	case OpStatus:
		s, err := c.LaneStatus(st.Lane)
		if err != nil {
			return Want{Code: int32(abi.CodeOf(err))}, nil
		}
		return Want{Ready: s.Ready, Assigned: s.Assigned, Installed: U64(s.InstalledSequence),
			LastEpoch: U64(s.LastEpoch), Staging: s.SnapshotInProgress, LastOut: uint8(s.LastOutcome),
			LastFault: uint8(s.LastFault), Seed: U64(s.Format.Seed), BucketCount: U64(s.Format.BucketCount)}, nil
	case OpWords:
		w, err := c.AppendLaneWords(nil, st.Lane)
		if err != nil {
			return Want{Code: int32(abi.CodeOf(err))}, nil
		}
		return Want{SHA256: WordsDigest(w)}, nil
	}
	return Want{}, fmt.Errorf("unknown op %q", st.Op)
}

// HashOptions returns the step's MM and Eagle as ckf.HashOptions.
func (st *Step) HashOptions() ckf.HashOptions {
	o := ckf.HashOptions{Eagle: st.Eagle}
	for _, l := range st.MM {
		mm := make([]uint64, len(l))
		for i, h := range l {
			mm[i] = uint64(h)
		}
		o.MM = append(o.MM, mm)
	}
	return o
}

// WordsDigest is the hex SHA-256 of words as u64 little-endian.
func WordsDigest(words []uint64) string {
	h := sha256.New()
	var b [8]byte
	for _, w := range words {
		binary.LittleEndian.PutUint64(b[:], w)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// intBlockSize is the step's block size as the Go API takes it. Where int
// is 32 bits a size beyond it is clamped, which answers the same (any size
// above the token count leaves no complete block; any below 1 is invalid).
func (st *Step) intBlockSize() int {
	return int(max(min(st.BlockSize, math.MaxInt), math.MinInt))
}
