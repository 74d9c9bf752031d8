package zmq

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// encodeEvent builds one engine event in the positional form (vLLM's field
// order, nil where a field is unset, up to the last set one) or the map form
// (tagged under "type", unset fields omitted).
func encodeEvent(form, tag string, f map[string]any) any {
	if form == "map" {
		m := map[string]any{"type": tag}
		for k, v := range f {
			m[k] = v
		}
		return m
	}
	order := storedOrder
	switch tag {
	case "BlockRemoved":
		order = removedOrder
	case "AllBlocksCleared":
		order = clearedOrder
	}
	last := -1
	for i, k := range order {
		if _, ok := f[k]; ok {
			last = i
		}
	}
	a := []any{tag}
	for _, k := range order[:last+1] {
		a = append(a, f[k])
	}
	return a
}

// refLocal is the local block hash computed from its definition, not
// through ckf: XXH3-64(LE u32 tokens ‖ sorted LE u64 mm, seed).
func refLocal(tokens []uint32, mm []uint64, seed uint64) uint64 {
	var b []byte
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	s := slices.Clone(mm)
	slices.Sort(s)
	for _, h := range s {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return xxh3.HashSeed(b, seed)
}

func refSeed(lora, ns string) uint64 {
	s := uint64(1337)
	if lora != "" {
		s += xxh3.HashStringSeed(lora, 0)
	}
	if ns != "" {
		s += xxh3.HashStringSeed(ns, 1)
	}
	return s
}

func TestDecodeBatch_BatchForms(t *testing.T) {
	ev := []any{"BlockRemoved", []any{7}}
	cases := []struct {
		name  string
		batch any
		want  Batch
	}{
		{"array", []any{1.5, []any{ev}, 2}, Batch{Timestamp: 1.5, HasDPRank: true, DPRank: 2}},
		{"map", map[string]any{"ts": 1.5, "events": []any{ev}, "data_parallel_rank": 2}, Batch{Timestamp: 1.5, HasDPRank: true, DPRank: 2}},
		{"map, dp_rank alias, nil rank", map[string]any{"events": []any{ev}, "ts": 1.5, "dp_rank": nil}, Batch{Timestamp: 1.5}},
		{"map with a publisher id and an unknown key", map[string]any{"ts": 1.5, "events": []any{ev}, "publisher_id": []byte{9}, "later": []any{1}},
			Batch{Timestamp: 1.5, PublisherID: []byte{9}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewDecoder(Limits{}).DecodeBatch(mp(t, tc.batch))
			require.NoError(t, err)
			tc.want.Events = []Event{{Type: BlockRemoved, BlockHashes: []uint64{7}}}
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []any{
		map[string]any{"ts": 1.0},
		map[string]any{"events": []any{}},
		map[string]any{"ts": "x", "events": []any{}},
		map[string]any{"ts": 1.0, "events": []any{}, "data_parallel_rank": -1},
	} {
		_, err := NewDecoder(Limits{}).DecodeBatch(mp(t, bad))
		var de *DecodeError
		require.ErrorAs(t, err, &de, "%v", bad)
		assert.Equal(t, ReasonBatch, de.Reason)
	}
}

// step is one event of a rule scenario and what the converter must make of
// it: dropped for why, or admitted with these tokens_hashes.
type step struct {
	tag    string
	f      map[string]any
	why    DropReason
	hashes []uint64 // admitted Stored: every block's tokens_hash
	tier   ckf.StorageTier
}

func TestConvert_Rules(t *testing.T) {
	const bs = 4
	t1, t2 := []uint32{1, 2, 3, 4}, []uint32{5, 6, 7, 8}
	both := append(slices.Clone(t1), t2...)
	st := func(hashes []any, parent any, toks []uint32, more map[string]any) map[string]any {
		f := map[string]any{"block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks, "block_size": bs}
		for k, v := range more {
			f[k] = v
		}
		return f
	}
	plain := []uint64{refLocal(t1, nil, 1337)}
	// Dynamo's marker form of a frontend-approved routing hash, and a
	// native vLLM digest with the same first 16 hex digits (extra_keys.rs
	// only_frontend_padded_mm_hashes_are_parsed).
	marker := "a1b2c3d4e5f60718" + strings.Repeat("0", 48)
	native := "a1b2c3d4e5f60718" + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"[:48]
	markerHash := uint64(0xa1b2c3d4e5f60718)
	bigrams := []any{[]any{1, 2}, []any{2, 3}, []any{3, 4}, []any{4, 5}, []any{5, 6}, []any{6, 7}, []any{7, 8}, []any{8, 9}}
	scenarios := []struct {
		name  string
		forms []string // default both
		steps []step
	}{
		{"group kinds: main kinds pass, others and unknown dropped", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"group_idx": 0, "kv_cache_spec_kind": "full_attention"}), hashes: plain},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"group_idx": 1, "kv_cache_spec_kind": "mla_attention"}), hashes: plain},
			{tag: "BlockStored", f: st([]any{3}, nil, t1, map[string]any{"group_idx": 2, "kv_cache_spec_kind": "sink_full_attention"}), hashes: plain},
			{tag: "BlockStored", f: st([]any{4}, nil, t1, map[string]any{"group_idx": 3, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 128}), why: DropKind},
			{tag: "BlockStored", f: st([]any{5}, nil, t1, map[string]any{"group_idx": 4, "kv_cache_spec_kind": "mamba"}), why: DropKind},
			{tag: "BlockStored", f: st([]any{6}, nil, t1, map[string]any{"group_idx": 5, "kv_cache_spec_kind": "quantum_attention"}), why: DropUnknownKind},
			// Without a kind: the group's learned kind decides.
			{tag: "BlockStored", f: st([]any{7}, nil, t1, map[string]any{"group_idx": 3}), why: DropGroup},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{4}, "group_idx": 3}, why: DropGroup},
			{tag: "BlockStored", f: st([]any{8}, nil, t1, map[string]any{"group_idx": 1}), hashes: plain},
			{tag: "BlockStored", f: st([]any{9}, nil, t1, map[string]any{"group_idx": 5}), why: DropUnknownKind},
			// Missing group or group 0 passes; an unlearned non-zero group is dropped.
			{tag: "BlockStored", f: st([]any{10}, nil, t1, nil), hashes: plain},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{10}, "group_idx": 0}},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{10}, "group_idx": 9}, why: DropUnlearned},
			{tag: "BlockStored", f: st([]any{11}, nil, t1, map[string]any{"group_idx": 9}), why: DropUnlearned},
		}},
		{"media and locality", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"medium": ""}), hashes: plain, tier: ckf.TierDevice},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"medium": "GPU", "locality": "LOCAL"}), hashes: plain, tier: ckf.TierDevice},
			{tag: "BlockStored", f: st([]any{3}, nil, t1, map[string]any{"medium": "CPU_TIER1"}), hashes: plain, tier: ckf.TierHostPinned},
			{tag: "BlockStored", f: st([]any{4}, nil, t1, map[string]any{"medium": "STORAGE"}), hashes: plain, tier: ckf.TierDisk},
			{tag: "BlockStored", f: st([]any{5}, nil, t1, map[string]any{"medium": "SHARED"}), hashes: plain, tier: ckf.TierExternal},
			{tag: "BlockStored", f: st([]any{6}, nil, t1, map[string]any{"medium": "OBJ"}), why: DropMedium},
			{tag: "BlockStored", f: st([]any{7}, nil, t1, map[string]any{"medium": "FS"}), why: DropMedium},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}, "medium": "OBJ"}, why: DropMedium},
			{tag: "BlockStored", f: st([]any{8}, nil, t1, map[string]any{"locality": "REMOTE"}), why: DropRemote},
			{tag: "BlockStored", f: st([]any{9}, nil, t1, map[string]any{"locality": "ELSEWHERE"}), why: DropRemote},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}, "locality": "REMOTE"}, why: DropRemote},
		}},
		{"namespace from vLLM's tagged extra_keys, propagated down the chain", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"lora_name": "dynamo-cache-salt:x",
				"extra_keys": []any{[]any{"dynamo-cache-salt:x", "dynamo-cache-salt:tenant-a"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("dynamo-cache-salt:x", "tenant-a"))}},
			{tag: "BlockStored", f: st([]any{2}, 1, t2, nil), hashes: []uint64{refLocal(t2, nil, refSeed("", "tenant-a"))}},
			{tag: "BlockStored", f: st([]any{3}, 2, t1, nil), hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-a"))}},
			// An untagged string is no namespace.
			{tag: "BlockStored", f: st([]any{4}, nil, t1, map[string]any{"extra_keys": []any{[]any{"tenant-b"}}}), hashes: plain},
			// Block 3 seen under a second namespace: ambiguous, its children dropped.
			{tag: "BlockStored", f: st([]any{3}, nil, t1, map[string]any{"extra_keys": []any{[]any{"dynamo-cache-salt:tenant-b"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-b"))}},
			{tag: "BlockStored", f: st([]any{5}, 3, t2, nil), why: DropAmbiguous},
			// Removal prunes a namespaced block (its child is unsalted again),
			// but not an ambiguous one.
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{2, 3}}},
			{tag: "BlockStored", f: st([]any{6}, 2, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
			{tag: "BlockStored", f: st([]any{7}, 3, t2, nil), why: DropAmbiguous},
			{tag: "AllBlocksCleared", f: map[string]any{}},
			{tag: "BlockStored", f: st([]any{8}, 3, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
			{tag: "BlockStored", f: st([]any{9}, 1, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
		}},
		{"namespace from SGLang's map cache_salt", []string{"map"}, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"cache_salt": "tenant-a"}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-a"))}},
			{tag: "BlockStored", f: st([]any{2}, 1, t2, map[string]any{"cache_salt": ""}), hashes: []uint64{refLocal(t2, nil, refSeed("", "tenant-a"))}},
		}},
		// Only Dynamo's marker form is a multimodal key, bare or as a tuple's
		// identifier; native 64-hex digests and opaque identifiers are not
		// (extra_keys.rs, the stored version with mark_mm_hash_for_extra_key).
		{"multimodal from extra_keys: the marker form only", nil, []step{
			{tag: "BlockStored", f: st([]any{1, 2}, nil, both, map[string]any{"lora_name": "ad",
				"extra_keys": []any{[]any{marker, "ad", "not-hex", native}, []any{[]any{"opaque-image", 3}, []any{marker, -1}, []any{native, 0}}}}),
				hashes: []uint64{refLocal(t1, []uint64{markerHash}, refSeed("ad", "")),
					refLocal(t2, []uint64{markerHash}, refSeed("ad", ""))}},
			{tag: "BlockStored", f: st([]any{3, 4}, nil, both, map[string]any{"extra_keys": []any{nil, []any{[]any{"img", 0}, native}}}),
				hashes: []uint64{refLocal(t1, nil, 1337), refLocal(t2, nil, 1337)}},
			// A LoRA name in the marker form is a multimodal key too: the
			// newest extra_keys.rs no longer passes over lora_name.
			{tag: "BlockStored", f: st([]any{5}, nil, t1, map[string]any{"lora_name": marker, "extra_keys": []any{[]any{marker}}}),
				hashes: []uint64{refLocal(t1, []uint64{markerHash}, refSeed(marker, ""))}},
		}},
		// The gates run in Dynamo's order (zmq_wire/mod.rs
		// preprocess_residency_with_reason): an event dropped for its
		// ownership, locality or medium teaches no group kind and no
		// namespace; disk and external tiers bypass both.
		{"ownership: kvcr and unknown values dropped first", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"ownership": "kvcr", "group_idx": 3, "kv_cache_spec_kind": "mamba"}), why: DropOwnership},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"ownership": "future_owner"}), why: DropUnknownOwnership},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"ownership": ""}), why: DropUnknownOwnership},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}, "ownership": "kvcr"}, why: DropOwnership},
			{tag: "AllBlocksCleared", f: map[string]any{"ownership": "kvcr"}, why: DropOwnership},
			// Group 3 was never learned: the kvcr store taught nothing.
			{tag: "BlockStored", f: st([]any{3}, nil, t1, map[string]any{"group_idx": 3}), why: DropUnlearned},
			{tag: "AllBlocksCleared", f: map[string]any{}},
		}},
		{"gate order: dropped events teach neither kinds nor namespaces", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"locality": "REMOTE", "group_idx": 3, "kv_cache_spec_kind": "sliding_window"}), why: DropRemote},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"medium": "OBJ", "group_idx": 4, "kv_cache_spec_kind": "full_attention"}), why: DropMedium},
			{tag: "BlockStored", f: st([]any{5}, nil, t1, map[string]any{"group_idx": 3}), why: DropUnlearned},
			{tag: "BlockStored", f: st([]any{6}, nil, t1, map[string]any{"group_idx": 4}), why: DropUnlearned},
			{tag: "BlockStored", f: st([]any{7}, nil, t1, map[string]any{"medium": "OBJ", "extra_keys": []any{[]any{"dynamo-cache-salt:tenant-a"}}}), why: DropMedium},
			{tag: "BlockStored", f: st([]any{8}, 7, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
		}},
		{"disk and external tiers bypass the group filter and the namespace chain", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"medium": "STORAGE", "group_idx": 9}), hashes: plain, tier: ckf.TierDisk},
			{tag: "BlockStored", f: st([]any{2}, nil, t1, map[string]any{"medium": "SHARED", "group_idx": 9, "kv_cache_spec_kind": "mamba"}), hashes: plain, tier: ckf.TierExternal},
			// ... and teach nothing: group 9 is still unlearned on the device.
			{tag: "BlockStored", f: st([]any{3}, nil, t1, map[string]any{"group_idx": 9}), why: DropUnlearned},
			{tag: "BlockStored", f: st([]any{4}, nil, t1, map[string]any{"medium": "STORAGE", "extra_keys": []any{[]any{"dynamo-cache-salt:tenant-a"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-a"))}, tier: ckf.TierDisk},
			{tag: "BlockStored", f: st([]any{5}, 4, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
			// A salted device block keeps its namespace through a disk removal.
			{tag: "BlockStored", f: st([]any{6}, nil, t1, map[string]any{"extra_keys": []any{[]any{"dynamo-cache-salt:tenant-b"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-b"))}},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{6}, "medium": "STORAGE"}, tier: ckf.TierDisk},
			{tag: "BlockStored", f: st([]any{7}, 6, t2, nil), hashes: []uint64{refLocal(t2, nil, refSeed("", "tenant-b"))}},
		}},
		// Dynamo's cache_namespace_tiers (zmq_wire/mod.rs, the stored version
		// with TierBlocksCleared): a block held on the device and the host
		// keeps its namespace until the last of them removes it.
		{"namespace kept while another tier holds the block", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"extra_keys": []any{[]any{"dynamo-cache-salt:tenant-a"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-a"))}},
			{tag: "BlockStored", f: st([]any{1}, nil, t1, map[string]any{"medium": "CPU", "extra_keys": []any{[]any{"dynamo-cache-salt:tenant-a"}}}),
				hashes: []uint64{refLocal(t1, nil, refSeed("", "tenant-a"))}, tier: ckf.TierHostPinned},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}}},
			{tag: "BlockStored", f: st([]any{2}, 1, t2, nil), hashes: []uint64{refLocal(t2, nil, refSeed("", "tenant-a"))}},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}, "medium": "CPU"}, tier: ckf.TierHostPinned},
			{tag: "BlockStored", f: st([]any{3}, 1, t2, nil), hashes: []uint64{refLocal(t2, nil, 1337)}},
		}},
		{"multimodal from explicit block_mm_infos", []string{"map"}, []step{
			{tag: "BlockStored", f: st([]any{1, 2}, nil, both, map[string]any{"extra_keys": []any{[]any{marker}},
				"block_mm_infos": []any{nil, map[string]any{"mm_objects": []any{map[string]any{"mm_hash": uint64(9), "offsets": []any{}},
					map[string]any{"mm_hash": uint64(3)}}}}}),
				hashes: []uint64{refLocal(t1, nil, 1337), refLocal(t2, []uint64{3, 9}, 1337)}},
		}},
		{"Eagle pool: bigram token ids in block_size+1 windows, flat ones dropped", []string{"positional+eagle", "map+eagle"}, []step{
			{tag: "BlockStored", f: st([]any{1, 2}, nil, nil, map[string]any{"token_ids": bigrams}),
				hashes: []uint64{refLocal([]uint32{1, 2, 3, 4, 5}, nil, 1337), refLocal([]uint32{5, 6, 7, 8, 9}, nil, 1337)}},
			{tag: "BlockStored", f: st([]any{3}, nil, []uint32{1, 2, 3, 4, 5}, nil), why: DropHashFormat},
			{tag: "BlockRemoved", f: map[string]any{"block_hashes": []any{1}}},
		}},
		{"standard pool: bigram (Eagle) token ids dropped", nil, []step{
			{tag: "BlockStored", f: st([]any{1, 2}, nil, nil, map[string]any{"token_ids": bigrams}), why: DropHashFormat},
			{tag: "BlockStored", f: st([]any{3}, nil, t1, nil), hashes: plain},
		}},
		{"TensorRT-LLM string token ids are dropped with their reason", nil, []step{
			{tag: "BlockStored", f: st([]any{1}, nil, nil, map[string]any{"token_ids": []any{1, "mm:ab", 3, 4}}), why: DropStringTokens},
			{tag: "BlockStored", f: st([]any{2}, nil, nil, map[string]any{"token_ids": []any{"a", "b", "c", "d"}}), why: DropStringTokens},
		}},
	}
	for _, sc := range scenarios {
		forms := sc.forms
		if forms == nil {
			forms = []string{"positional", "map"}
		}
		for _, form := range forms {
			t.Run(sc.name+"/"+form, func(t *testing.T) {
				d := NewDecoder(Limits{})
				// A form suffixed "+eagle" runs on a dynamo_eagle_v1 pool.
				form, eagle := strings.CutSuffix(form, "+eagle")
				cv := Converter{Worker: 1, BlockSize: bs, Eagle: eagle}
				for i, s := range sc.steps {
					b, err := d.DecodeBatch(mp(t, []any{1.0, []any{encodeEvent(form, s.tag, s.f)}, 0}))
					require.NoError(t, err, "step %d", i)
					out, ok, _, why := cv.Convert(&b.Events[0], 0, uint64(i))
					require.Equal(t, s.why, why, "step %d", i)
					if s.why != DropNone {
						require.False(t, ok, "step %d", i)
						continue
					}
					require.True(t, ok, "step %d", i)
					assert.Equal(t, s.tier, out.StorageTier, "step %d", i)
					if s.hashes != nil {
						var got []uint64
						for _, bl := range out.Blocks {
							got = append(got, bl.TokensHash)
						}
						require.Equal(t, s.hashes, got, "step %d", i)
					}
				}
			})
		}
	}
}

func TestConvert_ImageTokenSubstitution(t *testing.T) {
	// Dynamo's vllm_event_normalizes_to_frontend_pad_value_hash: two real
	// tokens then an image run hash like the frontend's pad values, without
	// the mm hash appended.
	const image, mm = 151655, uint64(9_533_257_059_414_191_570)
	d := NewDecoder(Limits{})
	b, err := d.DecodeBatch(mp(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{0xabcd},
		"token_ids": []any{10, 20, image, image}, "block_size": 4,
		"block_mm_infos": []any{map[string]any{"mm_objects": []any{map[string]any{"mm_hash": mm}}}}}}}))
	require.NoError(t, err)
	cv := Converter{BlockSize: 4, ImageTokenID: image, HasImageToken: true}
	out, ok, _, _ := cv.Convert(&b.Events[0], 0, 1)
	require.True(t, ok)
	pad := uint32(1_000_000 + mm&(1<<30-1))
	assert.Equal(t, refLocal([]uint32{10, 20, pad, pad}, nil, 1337), out.Blocks[0].TokensHash)
}

func TestConvert_NamespaceTableBounded(t *testing.T) {
	d := NewDecoder(Limits{})
	cv := Converter{BlockSize: 1, MaxNamespaceBlocks: 3}
	for i, want := range []DropReason{DropNone, DropNone, DropNone, DropNSLimit} {
		b, err := d.DecodeBatch(mp(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{i + 1},
			"token_ids": []any{i}, "block_size": 1, "cache_salt": "t"}}}))
		require.NoError(t, err)
		_, _, _, why := cv.Convert(&b.Events[0], 0, 1)
		require.Equal(t, want, why, "store %d", i)
	}
	b, err := d.DecodeBatch(mp(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2}}}}))
	require.NoError(t, err)
	_, _, _, _ = cv.Convert(&b.Events[0], 0, 2)
	assert.Equal(t, 1, cv.NamespaceBlocks())
	cv.ForgetRank(0)
	assert.Zero(t, cv.NamespaceBlocks())
}
