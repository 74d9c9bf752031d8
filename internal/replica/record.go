package replica

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// The record codec. Every message on a pool's subject starts with a header:
//
//	'K' 'R' version(1) type(1) flags(1) uvarint(term) uvarint(prev)
//
// prev is the stream sequence of the message before it on the same subject
// (0 for the first): a standby checks it on apply, so a missing message is
// detected instead of skipped. A term message's body is the leader's node id
// and address (uvarint length + bytes each). A batch message's body is a
// fragment of the batch encoding; flagMore says another fragment of the
// same batch follows (a rank replacement can exceed a NATS payload, and it
// must be applied as one rebuild). The assembled batch is
//
//	uvarint(position) uvarint(count) command*
//
// where position is the journal position before its first command. A
// command is its kind byte and varints; an event is packed field by field
// (hashes as 8 little-endian bytes), about a third of its JSON size.
//
// Design note: JSON-shaped events (package persist's choice for its local
// journal) would make every replicated block cost ~60 bytes and a parse;
// the leader's append is on the admission path, so this codec is binary.

// ErrCorrupt: a record does not decode.
var ErrCorrupt = errors.New("replica: corrupt record")

const (
	magic0, magic1 = 'K', 'R'
	version        = 1
	flagMore       = 1
	headerMax      = 4 + 1 + 2*binary.MaxVarintLen64
)

// Type says what a message is.
type Type byte

// Message types, as stored (the bytes must not change).
const (
	TypeBatch Type = 'B'
	TypeTerm  Type = 'T'
)

// Header is what every message carries.
type Header struct {
	Type Type
	More bool   // TypeBatch: another fragment of this batch follows
	Term uint64 // the lease revision of the leader that appended it
	Prev uint64 // stream sequence of the previous message on the subject; 0 first
}

// Message is one decoded message: its header and body (a term record's
// holder, or a batch fragment).
type Message struct {
	Header
	Body []byte
}

// Kind says what a journalled command was.
type Kind byte

// Command kinds, as stored (the bytes must not change).
const (
	KindAdmitted Kind = 'a'
	KindReplaced Kind = 'p'
	KindReset    Kind = 'r'
	KindCursor   Kind = 'c'
)

// Command is one command the leader's actor journalled ([producer.Journal]).
type Command struct {
	Kind        Kind
	SourceEpoch uint64                     // Admitted, Reset
	Event       ckf.RouterEvent            // Admitted
	Member      ckf.Member                 // Reset
	Degraded    bool                       // Reset
	Reps        []producer.RankReplacement // Replaced
	Cursor      producer.Cursor            // Cursor
}

// Batch is the commands one append carries, after journal position
// Position (the commands journalled before them).
type Batch struct {
	Position uint64
	Commands []Command
}

// TermRecord names the leader of a term.
type TermRecord struct {
	Node    string
	Address string
}

// MaxTermName bounds a term record's node id and address, in bytes: a
// replica refuses to write a longer one (a standby could not read it).
const MaxTermName = 1024

// AppendHeader appends h's encoding to b.
func AppendHeader(b []byte, h Header) []byte {
	var flags byte
	if h.More {
		flags |= flagMore
	}
	b = append(b, magic0, magic1, version, byte(h.Type), flags)
	b = binary.AppendUvarint(b, h.Term)
	return binary.AppendUvarint(b, h.Prev)
}

// DecodeMessage decodes one message; Body aliases b.
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	if len(b) < 5 || b[0] != magic0 || b[1] != magic1 {
		return m, fmt.Errorf("%w: not a record", ErrCorrupt)
	}
	if b[2] != version {
		return m, fmt.Errorf("%w: version %d", ErrCorrupt, b[2])
	}
	m.Type = Type(b[3])
	if m.Type != TypeBatch && m.Type != TypeTerm {
		return m, fmt.Errorf("%w: type %q", ErrCorrupt, b[3])
	}
	if b[4]&^flagMore != 0 || (m.Type == TypeTerm && b[4] != 0) {
		return m, fmt.Errorf("%w: flags %#x", ErrCorrupt, b[4])
	}
	m.More = b[4]&flagMore != 0
	d := decoder{b: b[5:]}
	m.Term = d.uvarint()
	m.Prev = d.uvarint()
	if d.err != nil {
		return m, d.err
	}
	m.Body = d.b
	return m, nil
}

// AppendTerm appends a term record's body.
func AppendTerm(b []byte, t TermRecord) []byte {
	b = binary.AppendUvarint(b, uint64(len(t.Node)))
	b = append(b, t.Node...)
	b = binary.AppendUvarint(b, uint64(len(t.Address)))
	return append(b, t.Address...)
}

// DecodeTerm decodes a term record's body.
func DecodeTerm(b []byte) (TermRecord, error) {
	d := decoder{b: b}
	t := TermRecord{Node: d.str(), Address: d.str()}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: trailing bytes", ErrCorrupt)
	}
	return t, d.err
}

// AppendBatch appends the encoding of the batch (cmds after position).
func AppendBatch(b []byte, position uint64, cmds []Command) ([]byte, error) {
	b = binary.AppendUvarint(b, position)
	b = binary.AppendUvarint(b, uint64(len(cmds)))
	for i := range cmds {
		var err error
		if b, err = appendCommand(b, &cmds[i]); err != nil {
			return b, err
		}
	}
	return b, nil
}

// DecodeBatch decodes an assembled batch. Memory: counts are checked against
// the bytes left before anything is allocated for them, so the result is
// bounded by a small multiple of len(b) (a command encodes in ≥ 5 bytes and
// takes ~170 in memory; a block takes the same 16 bytes in both).
func DecodeBatch(b []byte) (Batch, error) {
	d := decoder{b: b}
	bt := Batch{Position: d.uvarint()}
	n := d.count(5)
	if d.err != nil {
		return bt, d.err
	}
	bt.Commands = make([]Command, 0, min(n, 4096))
	for range n {
		c, err := d.command()
		if err != nil {
			return bt, err
		}
		bt.Commands = append(bt.Commands, c)
	}
	if len(d.b) != 0 {
		return bt, fmt.Errorf("%w: trailing bytes", ErrCorrupt)
	}
	return bt, nil
}

func appendCommand(b []byte, c *Command) ([]byte, error) {
	b = append(b, byte(c.Kind))
	switch c.Kind {
	case KindAdmitted:
		b = binary.AppendUvarint(b, c.SourceEpoch)
		return appendEvent(b, &c.Event), nil
	case KindReset:
		b = binary.AppendUvarint(b, c.SourceEpoch)
		b = binary.AppendUvarint(b, c.Member.WorkerID)
		b = binary.AppendUvarint(b, uint64(c.Member.DPRank))
		if c.Degraded {
			return append(b, 1), nil
		}
		return append(b, 0), nil
	case KindCursor:
		// The sequence as 8 fixed bytes: a command encodes in ≥ 5 bytes
		// (DecodeBatch's memory bound counts on it).
		b = binary.AppendUvarint(b, uint64(len(c.Cursor.Source)))
		b = append(b, c.Cursor.Source...)
		return binary.LittleEndian.AppendUint64(b, c.Cursor.Seq), nil
	case KindReplaced:
		b = binary.AppendUvarint(b, uint64(len(c.Reps)))
		for i := range c.Reps {
			r := &c.Reps[i]
			b = binary.AppendUvarint(b, r.SourceEpoch)
			b = binary.AppendUvarint(b, r.Member.WorkerID)
			b = binary.AppendUvarint(b, uint64(r.Member.DPRank))
			b = binary.AppendUvarint(b, uint64(len(r.Events)))
			for j := range r.Events {
				b = appendEvent(b, &r.Events[j])
			}
		}
		return b, nil
	}
	return b, fmt.Errorf("replica: unknown command kind %q", c.Kind)
}

const (
	evHasParent = 1 << iota
	evHasStart
)

// appendEvent packs one event: ids and counts as varints, hashes as 8
// little-endian bytes (they are uniformly distributed: a varint would grow
// them).
func appendEvent(b []byte, e *ckf.RouterEvent) []byte {
	var flags byte
	if e.HasParent {
		flags |= evHasParent
	}
	if e.HasStartPosition {
		flags |= evHasStart
	}
	b = binary.AppendUvarint(b, e.WorkerID)
	b = binary.AppendUvarint(b, uint64(e.DPRank))
	b = binary.AppendUvarint(b, e.EventID)
	b = append(b, byte(e.Kind), byte(e.StorageTier), flags)
	if e.HasParent {
		b = binary.LittleEndian.AppendUint64(b, e.ParentHash)
	}
	if e.HasStartPosition {
		b = binary.AppendUvarint(b, uint64(e.StartPosition))
	}
	b = binary.AppendUvarint(b, uint64(len(e.Blocks)))
	for _, s := range e.Blocks {
		b = binary.LittleEndian.AppendUint64(b, s.BlockHash)
		b = binary.LittleEndian.AppendUint64(b, s.TokensHash)
	}
	b = binary.AppendUvarint(b, uint64(len(e.BlockHashes)))
	for _, h := range e.BlockHashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// decoder reads what the append functions wrote; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("%d does not fit 32 bits", v)
	}
	return uint32(v)
}

// count reads an element count and checks that the rest of the input can
// hold that many elements of at least minSize bytes each, before anything
// is allocated for them.
func (d *decoder) count(minSize int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/minSize) {
		d.fail("%d elements in %d bytes", n, len(d.b))
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

func (d *decoder) byte1() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err == nil && (n > MaxTermName || n > uint64(len(d.b))) {
		d.fail("string of %d bytes", n)
	}
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) command() (Command, error) {
	c := Command{Kind: Kind(d.byte1())}
	switch c.Kind {
	case KindAdmitted:
		c.SourceEpoch = d.uvarint()
		c.Event = d.event()
	case KindReset:
		c.SourceEpoch = d.uvarint()
		c.Member.WorkerID = d.uvarint()
		c.Member.DPRank = d.u32()
		switch d.byte1() {
		case 0:
		case 1:
			c.Degraded = true
		default:
			d.fail("degraded flag")
		}
	case KindCursor:
		c.Cursor = producer.Cursor{Source: d.str(), Seq: d.u64()}
	case KindReplaced:
		n := d.count(4)
		if d.err == nil && n == 0 {
			d.fail("replacement of no rank")
		}
		if d.err == nil {
			c.Reps = make([]producer.RankReplacement, 0, n)
		}
		for range n {
			r := producer.RankReplacement{SourceEpoch: d.uvarint()}
			r.Member.WorkerID = d.uvarint()
			r.Member.DPRank = d.u32()
			k := d.count(8)
			if d.err != nil {
				break
			}
			r.Events = make([]ckf.RouterEvent, 0, k)
			for range k {
				r.Events = append(r.Events, d.event())
			}
			c.Reps = append(c.Reps, r)
		}
	default:
		if d.err == nil {
			d.fail("command kind %q", c.Kind)
		}
	}
	return c, d.err
}

func (d *decoder) event() ckf.RouterEvent {
	var e ckf.RouterEvent
	e.WorkerID = d.uvarint()
	e.DPRank = d.u32()
	e.EventID = d.uvarint()
	e.Kind = ckf.EventKind(d.byte1())
	e.StorageTier = ckf.StorageTier(d.byte1())
	// The leader journals only events its pool applied: a known kind and
	// tier.
	if e.Kind < ckf.EventStored || e.Kind > ckf.EventCleared || e.StorageTier > ckf.TierExternal {
		d.fail("event kind %d tier %d", e.Kind, e.StorageTier)
	}
	flags := d.byte1()
	if flags&^(evHasParent|evHasStart) != 0 {
		d.fail("event flags %#x", flags)
	}
	if flags&evHasParent != 0 {
		e.HasParent = true
		e.ParentHash = d.u64()
	}
	if flags&evHasStart != 0 {
		e.HasStartPosition = true
		e.StartPosition = d.u32()
	}
	if n := d.count(16); n > 0 {
		e.Blocks = make([]ckf.StoredBlock, n)
		for i := range e.Blocks {
			e.Blocks[i] = ckf.StoredBlock{BlockHash: d.u64(), TokensHash: d.u64()}
		}
	}
	if n := d.count(8); n > 0 {
		e.BlockHashes = make([]uint64, n)
		for i := range e.BlockHashes {
			e.BlockHashes[i] = d.u64()
		}
	}
	return e
}
