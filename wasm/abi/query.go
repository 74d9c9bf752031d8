package abi

import (
	"errors"
	"fmt"
	"math"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// Token query layout (kind [QueryTokensWith]): the query export's input is
// count bytes holding one request, all integers little-endian:
//
//	0   u32 flags        bit 0: Eagle windows (TokenQueryEagle); other bits 0
//	4   u32 n_tokens
//	8   u32 n_lists      per-block multimodal lists that follow (list i is block i's)
//	12  u32 n_mm         multimodal hashes in all lists together
//	16  n_tokens × u32   token ids
//	..  n_lists × u32    list lengths, summing to n_mm
//	..  zero padding to a multiple of 8 bytes from the start
//	..  n_mm × u64       the lists' hashes, list after list
//
// count must be exactly the size this implies. A block beyond n_lists, or
// with an empty list, has no multimodal content; lists beyond the request's
// complete blocks are ignored (as natively: [ckf.HashOptions]). The cache
// namespace is not here: it is part of the salt argument ([ckf.Salt], the
// salt export).

// TokenQueryEagle is the flags bit asking for Eagle windows: block i hashes
// tokens[i·bs : (i+1)·bs + 1] (Dynamo's DYNAMO_EAGLE_V1 hash format).
const TokenQueryEagle = 1

const tokenQueryHeader = 16

// ErrTokenQuery is wrapped by every [ParseTokenQuery] failure.
var ErrTokenQuery = errors.New("abi: malformed token query")

// TokenQuerySize returns the encoded size of a token query, or -1 when a
// count does not fit the layout's u32 fields or the size overflows int.
func TokenQuerySize(nTokens int, o ckf.HashOptions) int {
	nMM := 0
	for _, l := range o.MM {
		nMM += len(l)
	}
	if uint64(nTokens) > math.MaxUint32 || uint64(len(o.MM)) > math.MaxUint32 || uint64(nMM) > math.MaxUint32 {
		return -1
	}
	n := consumer.TokenQueryBytes(nTokens, o)
	if n > math.MaxInt {
		return -1
	}
	return int(n)
}

// PutTokenQuery writes a token query into b, which must hold
// TokenQuerySize(len(tokens), o) bytes.
func PutTokenQuery(b []byte, tokens []uint32, o ckf.HashOptions) {
	var flags uint32
	if o.Eagle {
		flags |= TokenQueryEagle
	}
	nMM := 0
	for _, l := range o.MM {
		nMM += len(l)
	}
	le.PutUint32(b[0:], flags)
	le.PutUint32(b[4:], uint32(len(tokens)))
	le.PutUint32(b[8:], uint32(len(o.MM)))
	le.PutUint32(b[12:], uint32(nMM))
	at := tokenQueryHeader
	for _, t := range tokens {
		le.PutUint32(b[at:], t)
		at += 4
	}
	for _, l := range o.MM {
		le.PutUint32(b[at:], uint32(len(l)))
		at += 4
	}
	for ; at%8 != 0; at++ {
		b[at] = 0
	}
	for _, l := range o.MM {
		for _, h := range l {
			le.PutUint64(b[at:], h)
			at += 8
		}
	}
}

// AppendTokenQuery appends the encoding of a token query to dst.
func AppendTokenQuery(dst []byte, tokens []uint32, o ckf.HashOptions) []byte {
	n := TokenQuerySize(len(tokens), o)
	if n < 0 {
		panic("abi: token query too large for its u32 fields")
	}
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	PutTokenQuery(dst[start:], tokens, o)
	return dst
}

// TokenQuery is a parsed token query: the sections of the input, still
// encoded (little-endian), so a caller on a little-endian target can view
// them in place.
type TokenQuery struct {
	Eagle   bool
	Tokens  []byte // n_tokens × u32
	Lengths []byte // n_lists × u32
	MM      []byte // n_mm × u64, at an offset that is a multiple of 8
}

// ParseTokenQuery checks b against the token query layout and returns its
// sections. Unknown flag bits, a size other than the layout's, non-zero
// padding, and list lengths that do not sum to n_mm are [ErrTokenQuery].
func ParseTokenQuery(b []byte) (TokenQuery, error) {
	if len(b) < tokenQueryHeader {
		return TokenQuery{}, fmt.Errorf("%w: %d bytes, shorter than its 16-byte header", ErrTokenQuery, len(b))
	}
	flags := le.Uint32(b[0:])
	if flags&^TokenQueryEagle != 0 {
		return TokenQuery{}, fmt.Errorf("%w: unknown flags %#x", ErrTokenQuery, flags&^TokenQueryEagle)
	}
	nTok, nLists, nMM := uint64(le.Uint32(b[4:])), uint64(le.Uint32(b[8:])), uint64(le.Uint32(b[12:]))
	lenAt := tokenQueryHeader + 4*nTok
	padAt := lenAt + 4*nLists
	mmAt := (padAt + 7) &^ 7
	if want := mmAt + 8*nMM; want != uint64(len(b)) {
		return TokenQuery{}, fmt.Errorf("%w: %d bytes, the header (%d tokens, %d lists, %d hashes) implies %d",
			ErrTokenQuery, len(b), nTok, nLists, nMM, want)
	}
	for _, p := range b[padAt:mmAt] {
		if p != 0 {
			return TokenQuery{}, fmt.Errorf("%w: non-zero padding", ErrTokenQuery)
		}
	}
	var sum uint64
	for i := lenAt; i < padAt; i += 4 {
		sum += uint64(le.Uint32(b[i:]))
	}
	if sum != nMM {
		return TokenQuery{}, fmt.Errorf("%w: list lengths sum to %d, n_mm is %d", ErrTokenQuery, sum, nMM)
	}
	return TokenQuery{Eagle: flags&TokenQueryEagle != 0, Tokens: b[tokenQueryHeader:lenAt], Lengths: b[lenAt:padAt], MM: b[mmAt:]}, nil
}

// Lists splits mm (the decoded MM section) into per-block lists by
// q.Lengths, appending them to dst (reused, so a caller with a scratch slice
// does not allocate). The lists alias mm.
func (q *TokenQuery) Lists(dst [][]uint64, mm []uint64) [][]uint64 {
	at := 0
	for i := 0; i+4 <= len(q.Lengths); i += 4 {
		n := int(le.Uint32(q.Lengths[i:]))
		dst = append(dst, mm[at:at+n:at+n])
		at += n
	}
	return dst
}

// DecodeTokenQuery parses b and decodes it into tokens and hash options
// (fresh slices): the reference decoder for hosts and tests.
func DecodeTokenQuery(b []byte) ([]uint32, ckf.HashOptions, error) {
	q, err := ParseTokenQuery(b)
	if err != nil {
		return nil, ckf.HashOptions{}, err
	}
	tokens := make([]uint32, len(q.Tokens)/4)
	for i := range tokens {
		tokens[i] = le.Uint32(q.Tokens[4*i:])
	}
	mm := make([]uint64, len(q.MM)/8)
	for i := range mm {
		mm[i] = le.Uint64(q.MM[8*i:])
	}
	o := ckf.HashOptions{Eagle: q.Eagle}
	if len(q.Lengths) > 0 {
		o.MM = q.Lists(nil, mm)
	}
	return tokens, o, nil
}
