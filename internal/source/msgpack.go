package source

import (
	"errors"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrNestedTooDeep: a value passed over by SkipMsgpack nests arrays or maps
// deeper than its bound.
var ErrNestedTooDeep = errors.New("source: msgpack value nested too deep")

// SkipMsgpack passes over one msgpack value at dec, any type, whose arrays
// and maps nest at most maxDepth deep (ErrNestedTooDeep past it). The
// sources' decoders skip the keys they do not know with it: the library's
// own Skip recurses once per level without a bound, so a peer's message of
// a few MiB of 0x91 bytes would grow the decoding goroutine's stack past
// Go's 1 GB limit — a fatal error, not a panic, that no recover catches.
// Other errors are the decoder's (a truncated value).
func SkipMsgpack(dec *msgpack.Decoder, maxDepth int) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	items := 0
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		items, err = dec.DecodeArrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		items, err = dec.DecodeMapLen()
		items *= 2
	default:
		return dec.Skip() // a scalar, a string, bin or ext: no nesting
	}
	if err != nil {
		return err
	}
	if items > 0 && maxDepth <= 0 {
		return ErrNestedTooDeep
	}
	for range items {
		if err := SkipMsgpack(dec, maxDepth-1); err != nil {
			return err
		}
	}
	return nil
}
