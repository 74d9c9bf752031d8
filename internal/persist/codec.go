package persist

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// ErrCorrupt: a stored record or checkpoint entry does not decode.
var ErrCorrupt = errors.New("persist: corrupt record")

// RecordKind says what a journalled command was.
type RecordKind byte

// Record kinds, as stored (the bytes must not change).
const (
	KindAdmitted RecordKind = 'a'
	KindReplaced RecordKind = 'p'
	KindReset    RecordKind = 'r'
)

// Record is one journalled command.
type Record struct {
	Kind        RecordKind
	SourceEpoch uint64                     // Admitted, Reset
	Event       ckf.RouterEvent            // Admitted
	Member      ckf.Member                 // Reset
	Degraded    bool                       // Reset
	Reps        []producer.RankReplacement // Replaced
}

// blocks returns how many blocks r names: what replaying it costs.
func (r *Record) blocks() uint64 {
	switch r.Kind {
	case KindAdmitted:
		return uint64(r.Event.BlockCount())
	case KindReplaced:
		var n uint64
		for i := range r.Reps {
			for j := range r.Reps[i].Events {
				n += uint64(r.Reps[i].Events[j].BlockCount())
			}
		}
		return max(n, 1)
	}
	return 1
}

// appendRecord encodes r: its kind, then varints, and events in the JSON
// shape of package wire (one codec for events in the whole project).
func appendRecord(b []byte, r *Record) ([]byte, error) {
	b = append(b, byte(r.Kind))
	var err error
	switch r.Kind {
	case KindAdmitted:
		b = binary.AppendUvarint(b, r.SourceEpoch)
		return wire.AppendRouterEventJSON(b, &r.Event)
	case KindReset:
		b = binary.AppendUvarint(b, r.SourceEpoch)
		b = binary.AppendUvarint(b, r.Member.WorkerID)
		b = binary.AppendUvarint(b, uint64(r.Member.DPRank))
		if r.Degraded {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case KindReplaced:
		b = binary.AppendUvarint(b, uint64(len(r.Reps)))
		for i := range r.Reps {
			rep := &r.Reps[i]
			b = binary.AppendUvarint(b, rep.SourceEpoch)
			b = binary.AppendUvarint(b, rep.Member.WorkerID)
			b = binary.AppendUvarint(b, uint64(rep.Member.DPRank))
			b = binary.AppendUvarint(b, uint64(len(rep.Events)))
			for j := range rep.Events {
				at := len(b)
				b = append(b, 0, 0, 0, 0)
				if b, err = wire.AppendRouterEventJSON(b, &rep.Events[j]); err != nil {
					return b, err
				}
				binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
			}
		}
		return b, nil
	}
	return b, fmt.Errorf("persist: unknown record kind %q", r.Kind)
}

// decoder reads the fields appendRecord wrote.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: bad varint", ErrCorrupt)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) rank() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.err = fmt.Errorf("%w: dp_rank %d", ErrCorrupt, v)
	}
	return uint32(v)
}

func decodeRecord(b []byte) (Record, error) {
	if len(b) == 0 {
		return Record{}, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	r := Record{Kind: RecordKind(b[0])}
	d := &decoder{b: b[1:]}
	switch r.Kind {
	case KindAdmitted:
		r.SourceEpoch = d.uvarint()
		if d.err != nil {
			return r, d.err
		}
		ev, err := wire.DecodeRouterEventJSON(d.b)
		if err != nil {
			return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		r.Event = ev
		return r, nil
	case KindReset:
		r.SourceEpoch = d.uvarint()
		r.Member.WorkerID = d.uvarint()
		r.Member.DPRank = d.rank()
		if d.err == nil && len(d.b) != 1 {
			d.err = fmt.Errorf("%w: reset tail", ErrCorrupt)
		}
		if d.err != nil {
			return r, d.err
		}
		r.Degraded = d.b[0] == 1
		return r, nil
	case KindReplaced:
		n := d.uvarint()
		if d.err == nil && n > uint64(len(d.b)) {
			d.err = fmt.Errorf("%w: %d replacements in %d bytes", ErrCorrupt, n, len(d.b))
		}
		for range n {
			if d.err != nil {
				break
			}
			rep := producer.RankReplacement{SourceEpoch: d.uvarint()}
			rep.Member.WorkerID = d.uvarint()
			rep.Member.DPRank = d.rank()
			k := d.uvarint()
			if d.err == nil && k > uint64(len(d.b)) {
				d.err = fmt.Errorf("%w: %d events in %d bytes", ErrCorrupt, k, len(d.b))
			}
			for range k {
				if d.err != nil {
					break
				}
				if len(d.b) < 4 {
					d.err = fmt.Errorf("%w: truncated event", ErrCorrupt)
					break
				}
				size := binary.LittleEndian.Uint32(d.b)
				if uint64(size) > uint64(len(d.b)-4) {
					d.err = fmt.Errorf("%w: truncated event", ErrCorrupt)
					break
				}
				ev, err := wire.DecodeRouterEventJSON(d.b[4 : 4+size])
				if err != nil {
					d.err = fmt.Errorf("%w: %v", ErrCorrupt, err)
					break
				}
				rep.Events = append(rep.Events, ev)
				d.b = d.b[4+size:]
			}
			r.Reps = append(r.Reps, rep)
		}
		if d.err == nil && len(d.b) != 0 {
			d.err = fmt.Errorf("%w: trailing bytes", ErrCorrupt)
		}
		return r, d.err
	}
	return r, fmt.Errorf("%w: unknown record kind %q", ErrCorrupt, r.Kind)
}

// appendMember encodes one checkpointed member's epoch and lineage: the
// epoch as a varint, then 16 bytes (external, canonical; little endian) a
// block.
func appendMember(b []byte, m *producer.MemberState) []byte {
	b = binary.AppendUvarint(b, m.SourceEpoch)
	for _, e := range m.Lineage.Blocks {
		b = binary.LittleEndian.AppendUint64(b, e.External)
		b = binary.LittleEndian.AppendUint64(b, e.Canonical)
	}
	return b
}

func decodeMember(m ckf.Member, b []byte) (producer.MemberState, error) {
	d := &decoder{b: b}
	st := producer.MemberState{SourceEpoch: d.uvarint(), Lineage: ckf.MemberLineage{Member: m}}
	if d.err != nil {
		return st, d.err
	}
	if len(d.b)%16 != 0 {
		return st, fmt.Errorf("%w: member lineage of %d bytes", ErrCorrupt, len(d.b))
	}
	st.Lineage.Blocks = make([]ckf.LineageEntry, len(d.b)/16)
	for i := range st.Lineage.Blocks {
		st.Lineage.Blocks[i] = ckf.LineageEntry{External: binary.LittleEndian.Uint64(d.b[16*i:]),
			Canonical: binary.LittleEndian.Uint64(d.b[16*i+8:])}
	}
	return st, nil
}
