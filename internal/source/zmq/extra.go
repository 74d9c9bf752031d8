package zmq

import (
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// NamespacePrefix tags a cache namespace that Dynamo passes to vLLM as a
// cache_salt, which vLLM then reports in the first block's extra_keys
// (Dynamo lib/kv-router/src/zmq_wire/extra_keys.rs, DYNAMO_CACHE_SALT_PREFIX).
const NamespacePrefix = "dynamo-cache-salt:"

// extraKeys reads extra_keys: nil, or one entry per block, each nil or an
// array of items (a string; an [identifier, offset] tuple; anything else,
// ignored).
func (d *Decoder) extraKeys() error {
	if d.takeNil() {
		return nil
	}
	n, err := d.arrayLen()
	if err != nil || n < 0 {
		return malformed(ReasonField, err, "extra_keys is not nil or an array")
	}
	if n > d.limits.MaxBlocks {
		return malformed(ReasonLimit, nil, "%d extra_keys entries > limit %d", n, d.limits.MaxBlocks)
	}
	d.hasExtra = true
	for range n {
		if d.takeNil() {
			d.extra = append(d.extra, nil)
			continue
		}
		m, err := d.arrayLen()
		if err != nil || m < 0 {
			return malformed(ReasonField, err, "an extra_keys entry is not nil or an array")
		}
		var items []extraKey
		for range m {
			it, err := d.extraItem()
			if err != nil {
				return err
			}
			items = append(items, it)
		}
		d.extra = append(d.extra, items)
	}
	return nil
}

func (d *Decoder) extraItem() (extraKey, error) {
	c, err := d.peekCode()
	if err != nil {
		return extraKey{}, malformed(ReasonField, err, "extra_keys truncated")
	}
	switch {
	case msgpcode.IsString(c):
		b, err := d.stringBytes()
		if err != nil {
			return extraKey{}, malformed(ReasonField, err, "extra_keys string")
		}
		return extraKey{kind: extraString, s: string(b)}, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		// An (identifier, start_offset) tuple (vLLM ≥ 0.19) is a string and an
		// integer; any other array is ignored.
		m, _ := d.arrayLen()
		if m == 2 {
			if c2, err := d.peekCode(); err == nil && msgpcode.IsString(c2) {
				b, err := d.stringBytes()
				if err != nil {
					return extraKey{}, malformed(ReasonField, err, "extra_keys identifier")
				}
				id := string(b)
				if c3, err := d.peekCode(); err == nil && isInt(c3) {
					if err := d.skip(1); err != nil {
						return extraKey{}, err
					}
					return extraKey{kind: extraTuple, s: id}, nil
				}
				return extraKey{}, d.skip(1)
			}
		}
		for range m {
			if err := d.skip(1); err != nil {
				return extraKey{}, err
			}
		}
		return extraKey{}, nil
	}
	return extraKey{}, d.skip(1)
}

// blockMMInfos reads Dynamo's explicit block_mm_infos: nil, or one entry per
// block, each nil or {"mm_objects": [{"mm_hash": u64, "offsets": …}, …]}
// (structs also accepted as arrays, mm_objects / mm_hash first).
func (d *Decoder) blockMMInfos() error {
	if d.takeNil() {
		return nil
	}
	n, err := d.arrayLen()
	if err != nil || n < 0 {
		return malformed(ReasonField, err, "block_mm_infos is not nil or an array")
	}
	if n > d.limits.MaxBlocks {
		return malformed(ReasonLimit, nil, "%d block_mm_infos entries > limit %d", n, d.limits.MaxBlocks)
	}
	d.hasInfos = true
	infos := make([][]uint64, 0, min(n, d.rd.Len()))
	for range n {
		if d.takeNil() {
			infos = append(infos, nil)
			continue
		}
		var hs []uint64
		err := d.structField("mm_objects", "a block_mm_infos entry", func() error {
			m, err := d.arrayLen()
			if err != nil || m < 0 {
				return malformed(ReasonField, err, "mm_objects is not an array")
			}
			if m > d.limits.MaxBlocks {
				return malformed(ReasonLimit, nil, "%d mm_objects > limit %d", m, d.limits.MaxBlocks)
			}
			for range m {
				got := false
				err := d.structField("mm_hash", "an mm_object", func() error {
					h, err := d.hash()
					if err != nil {
						return malformed(ReasonField, err, "mm_hash")
					}
					hs, got = append(hs, h), true
					return nil
				})
				if err != nil {
					return err
				}
				if !got {
					return malformed(ReasonRequired, nil, "mm_object without mm_hash")
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		infos = append(infos, hs)
	}
	d.mmInfos = infos
	return nil
}

// structField reads a struct encoded as a map (calling read for key) or as
// an array (calling read for its first element); everything else is skipped.
func (d *Decoder) structField(key, what string, read func() error) error {
	if d.isMap() {
		n, err := d.dec.DecodeMapLen()
		if err != nil {
			return malformed(ReasonField, err, "%s", what)
		}
		for range n {
			k, err := d.stringBytes()
			if err != nil {
				return malformed(ReasonField, err, "%s key is not a string", what)
			}
			if string(k) == key {
				if err := read(); err != nil {
					return err
				}
				continue
			}
			if err := d.skip(1); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := d.arrayLen()
	if err != nil || n < 1 {
		return malformed(ReasonField, err, "%s is neither a map nor a non-empty array", what)
	}
	if err := read(); err != nil {
		return err
	}
	for range n - 1 {
		if err := d.skip(1); err != nil {
			return err
		}
	}
	return nil
}

// extraNamespace finds the tagged cache namespace among the first block's
// extra_keys; the first string equal to lora (when set) is passed over.
func extraNamespace(first []extraKey, lora string) string {
	unmatched := lora != ""
	for _, it := range first {
		if it.kind != extraString {
			continue
		}
		if unmatched && it.s == lora {
			unmatched = false
			continue
		}
		if ns, ok := strings.CutPrefix(it.s, NamespacePrefix); ok && ns != "" {
			return ns
		}
	}
	return ""
}

// extraMM derives each block's multimodal hashes from extra_keys, as the
// newest Dynamo does (lib/kv-router/src/zmq_wire/extra_keys.rs, the stored
// version with mark_mm_hash_for_extra_key): a bare string or the identifier
// of an [identifier, offset] tuple counts only in Dynamo's marker form
// ([MarkerMMHash]); vLLM's own 64-hex digests and opaque identifiers are
// not multimodal keys (a frontend that did not approve exact multimodal
// routing for the request must not have its blocks rekeyed). nil when no
// block has any.
func extraMM(extra [][]extraKey) [][]uint64 {
	var out [][]uint64
	for i, items := range extra {
		var hs []uint64
		for _, it := range items {
			if it.kind != extraString && it.kind != extraTuple {
				continue
			}
			if h, ok := MarkerMMHash(it.s); ok {
				hs = append(hs, h)
			}
		}
		if hs == nil {
			continue
		}
		if out == nil {
			out = make([][]uint64, len(extra))
		}
		out[i] = hs
	}
	return out
}

// MarkerMMHash parses Dynamo's marker form of a frontend-approved
// multimodal routing hash in vLLM's extra_keys: 64 characters, the hash as
// 16 hex digits followed by 48 '0's (Dynamo extra_keys.rs
// parse_mm_hash_from_extra_key, mark_mm_hash_for_extra_key). Anything else,
// a native vLLM digest included, is not one.
func MarkerMMHash(s string) (uint64, bool) {
	if len(s) != 64 || strings.Trim(s[16:], "0") != "" {
		return 0, false
	}
	for i := range 16 {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return 0, false
		}
	}
	h, err := strconv.ParseUint(s[:16], 16, 64)
	return h, err == nil
}
