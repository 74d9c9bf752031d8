package zmq

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Golden tests written from the test vectors of Dynamo's own ZMQ
// normalizer (ai-dynamo/dynamo lib/kv-router/src/zmq_wire/: convert.rs
// normalize_tests and extra_keys.rs tests at the newest stored versions,
// tests.rs at 2807cebc and 17b173e9); each names the Dynamo test it
// follows. The expected keys are computed from the definition (refLocal),
// not through the converter.

// storeOf converts one BlockStored of blocks of size bs with the given
// tokens and per-block mm hashes, and returns its tokens_hashes.
func storeOf(t *testing.T, cv *Converter, bs int, toks []uint32, mm ...[]uint64) []uint64 {
	t.Helper()
	cv.BlockSize = bs
	n := len(toks) / bs
	ev := Event{Type: BlockStored, BlockSize: bs, TokenIDs: toks, MM: mm}
	for i := range n {
		ev.BlockHashes = append(ev.BlockHashes, uint64(101+i))
	}
	out, ok, _, why := cv.Convert(&ev, 0, 1)
	require.True(t, ok, "%s", why)
	var hs []uint64
	for _, b := range out.Blocks {
		hs = append(hs, b.TokensHash)
	}
	return hs
}

func pad(h uint64) uint32 { return ckf.PadValue(h) }

func TestDynamo_ImageOnlyNormalization(t *testing.T) {
	// image_only_normalization_preserves_worker_order_and_clamping
	assert.Equal(t, []uint32{10, pad(7), 42, pad(8), 20, pad(8)}, substitutePads([]uint32{10, 99, 42, 99, 20, 99}, 99, []uint64{7, 8}))

	const image = 151655
	cv := Converter{ImageTokenID: image, HasImageToken: true}
	// vllm_event_normalizes_to_frontend_pad_value_hash
	const mm = 9_533_257_059_414_191_570
	assert.Equal(t, []uint64{refLocal([]uint32{10, 20, pad(mm), pad(mm)}, nil, 1337)},
		storeOf(t, &cv, 4, []uint32{10, 20, image, image}, []uint64{mm}))
	// two_separated_images_preserve_frontend_hash_parity
	assert.Equal(t, []uint64{refLocal([]uint32{pad(41), pad(41), 7, pad(42), pad(42), 8}, nil, 1337)},
		storeOf(t, &cv, 6, []uint32{image, image, 7, image, image, 8}, []uint64{41, 42}))
	// sglang_event_unaffected_by_image_token_id: no mm hashes, the raw tokens.
	toks := []uint32{1, 2, pad(42), pad(42)}
	assert.Equal(t, []uint64{refLocal(toks, nil, 1337)}, storeOf(t, &cv, 4, toks))
	// Dynamo substitutes only when the block holds the image token
	// (create_stored_block_from_parts: token_ids.contains(image_token_id)):
	// a block with mm hashes but no placeholder keeps its native hash.
	assert.Equal(t, []uint64{refLocal([]uint32{1, 2, 3, 4}, []uint64{5}, 1337)},
		storeOf(t, &cv, 4, []uint32{1, 2, 3, 4}, []uint64{5}))
}

func TestDynamo_VideoNormalization(t *testing.T) {
	const image, video = 151655, 151656
	both := Converter{ImageTokenID: image, HasImageToken: true, VideoTokenID: video, HasVideoToken: true}

	// video_capable_model_preserves_unambiguous_image_normalization
	cv := Converter{ImageTokenID: 99, HasImageToken: true, VideoTokenID: 100, HasVideoToken: true}
	img := []uint32{10, 99, 20, 99, 30, 40}
	assert.Equal(t, []uint64{refLocal(substitutePads(img, 99, []uint64{41, 42}), nil, 1337)},
		storeOf(t, &cv, 6, img, []uint64{41, 42}))
	// video_capable_ambiguous_image_mapping_preserves_native_hash
	amb := []uint32{10, 99, 20, 99, 30, 99}
	assert.Equal(t, []uint64{refLocal(amb, []uint64{41, 42}, 1337)}, storeOf(t, &cv, 6, amb, []uint64{41, 42}))

	// incremental_batch_preserves_later_video_identity_on_boundary_block
	inc := []uint32{image, image, image, image, image, image, 7, 8}
	first := storeOf(t, &both, 4, inc, []uint64{41}, []uint64{41, 42})
	second := storeOf(t, &both, 4, inc, []uint64{41}, []uint64{41, 43})
	assert.Equal(t, first[0], second[0])
	assert.NotEqual(t, first[1], second[1])

	// vllm_video_event_normalizes_to_frontend_pad_value_hash (no image token)
	vonly := Converter{VideoTokenID: video, HasVideoToken: true}
	const mm = 9_533_257_059_414_191_570
	assert.Equal(t, []uint64{refLocal([]uint32{10, 20, pad(mm), pad(mm)}, nil, 1337)},
		storeOf(t, &vonly, 4, []uint32{10, 20, video, video}, []uint64{mm}))

	// timestamped_video_runs_share_one_hash_before_an_image
	got, ok := placeholderRuns([]uint32{video, video, 7, video, video, 8, image, image}, image, true, video, []uint64{41, 42})
	require.True(t, ok)
	assert.Equal(t, []uint32{pad(41), pad(41), 7, pad(41), pad(41), 8, pad(42), pad(42)}, got)
	// consecutive_video_objects_fail_closed_without_offsets
	_, ok = placeholderRuns([]uint32{video, 7, video}, 0, false, video, []uint64{41, 42})
	assert.False(t, ok)
	// exact_video_mapping_rejects_image_object_count_mismatch
	_, ok = placeholderRuns([]uint32{image, 7, image}, image, true, video, []uint64{41})
	assert.False(t, ok)
	_, ok = placeholderRuns([]uint32{image, image}, image, true, video, []uint64{41, 42})
	assert.False(t, ok)
	// large_mismatched_mapping_fails_closed_without_search
	var large []uint32
	for sep := range uint32(14) {
		large = append(large, image, sep)
	}
	large = append(large, video)
	objs := make([]uint64, 28)
	for i := range objs {
		objs[i] = uint64(i)
	}
	_, ok = placeholderRuns(large, image, true, video, objs)
	assert.False(t, ok)
	// An image token equal to the video token: no mapping.
	_, ok = placeholderRuns([]uint32{5, 5}, 5, true, 5, []uint64{1})
	assert.False(t, ok)

	// mixed_boundary_preserves_native_hash_when_mapping_is_not_exact
	mixed := []uint32{image, image, image, image, image, image, 7, 8, 9, 10, video, video}
	assert.Equal(t, []uint64{
		refLocal([]uint32{pad(41), pad(41), pad(41), pad(41)}, nil, 1337),
		refLocal(mixed[4:8], []uint64{41, 42}, 1337),
		refLocal([]uint32{9, 10, pad(42), pad(42)}, nil, 1337),
	}, storeOf(t, &both, 4, mixed, []uint64{41}, []uint64{41, 42}, []uint64{42}))
}

// TestDynamo_MarkerForm: extra_keys.rs only_frontend_padded_mm_hashes_are_parsed.
func TestDynamo_MarkerForm(t *testing.T) {
	mark := func(h uint64) string { // mark_mm_hash_for_extra_key
		const hexd = "0123456789abcdef"
		var b strings.Builder
		for i := 15; i >= 0; i-- {
			b.WriteByte(hexd[h>>(4*i)&15])
		}
		return b.String() + strings.Repeat("0", 48)
	}
	for _, c := range []struct {
		in string
		h  uint64
		ok bool
	}{
		{mark(0x0123_4567_89ab_cdef), 0x0123_4567_89ab_cdef, true},
		{"0123456789abcdef000000000000000000000000000000000000000000000000", 0x0123_4567_89ab_cdef, true},
		{"0123456789ABCDEF000000000000000000000000000000000000000000000000", 0x0123_4567_89ab_cdef, true},
		{"0123456789abcdef00112233445566778899aabbccddeefffedcba9876543210", 0, false},
		{"0123456789abcdeg000000000000000000000000000000000000000000000000", 0, false},
		{"0123456789abcdef00000000000000000000000000000000000000000000000", 0, false},
		{"123", 0, false},
		{"not_a_hash", 0, false},
	} {
		h, ok := MarkerMMHash(c.in)
		assert.Equal(t, c.ok, ok, c.in)
		assert.Equal(t, c.h, h, c.in)
	}
}

// TestDynamo_GroupMetadata follows tests.rs (2807cebc):
// test_normalizer_does_not_learn_metadata_from_remove_events and
// test_normalizer_metadata_is_dp_rank_scoped.
func TestDynamo_GroupMetadata(t *testing.T) {
	cv := Converter{BlockSize: 2}
	rm := func(kind string, dp uint32) DropReason {
		_, _, _, why := cv.Convert(&Event{Type: BlockRemoved, BlockHashes: []uint64{11}, HasGroup: true, GroupIdx: 3, Kind: kind}, dp, 1)
		return why
	}
	assert.Equal(t, DropNone, rm("full_attention", 0))
	assert.Equal(t, DropUnlearned, rm("", 0), "a removal teaches no kind")
	_, ok, _, _ := cv.Convert(&Event{Type: BlockStored, BlockHashes: []uint64{11}, TokenIDs: []uint32{10, 11}, BlockSize: 2,
		HasGroup: true, GroupIdx: 3, Kind: "full_attention"}, 0, 2)
	require.True(t, ok)
	assert.Equal(t, DropNone, rm("", 0))
	assert.Equal(t, DropUnlearned, rm("", 1), "kinds are learned per dp rank")
}

// TestConvert_DroppedClearCountsOne: a dropped event without blocks (an
// AllBlocksCleared of another ownership) counts 1, as the reasons count it.
func TestConvert_DroppedClearCountsOne(t *testing.T) {
	var cv Converter
	_, ok, n, why := cv.Convert(&Event{Type: AllBlocksCleared, Ownership: "kvcr", HasOwnership: true}, 0, 1)
	assert.False(t, ok)
	assert.Equal(t, DropOwnership, why)
	assert.Equal(t, 1, n)
}
