package server

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

// TestCatalog_64BitValuesAreStrings reads GET /v1/pools as a JavaScript
// parser would (numbers as float64): every 64-bit value must be a string,
// or a seed above 2^53 comes back rounded.
func TestCatalog_64BitValuesAreStrings(t *testing.T) {
	cfg := testConfig()
	seed := uint64(1<<53 + 1) // not representable as a float64
	cfg.Pools[1].Seed = &seed
	s, ts := startTestServer(t, cfg)
	resp, err := http.Get(ts.URL + "/v1/pools")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	var loose struct {
		Pools []map[string]any `json:"pools"`
	}
	require.NoError(t, json.Unmarshal(body, &loose))
	require.Len(t, loose.Pools, 2)
	p := loose.Pools[1]
	id := p["identity"].(map[string]any)
	format := id["format"].(map[string]any)
	assert.Equal(t, "9007199254740993", format["seed"])
	assert.IsType(t, "", format["bucket_count"])
	assert.IsType(t, "", id["producer_incarnation"])
	// Dynamo refuses layout_generation 0 (wire/identity.rs @7216a153): a pool
	// publishes its incarnation's first layout, generation 1.
	assert.Equal(t, "1", id["layout_generation"])
	assert.Equal(t, "2", p["dc_id"])
	assert.IsType(t, "", p["hub"].(map[string]any)["sequence"])
	assert.IsType(t, "", p["stats"].(map[string]any)["sequence"])

	var cat catalog.Catalog
	require.NoError(t, json.Unmarshal(body, &cat))
	assert.Equal(t, seed, uint64(cat.Pools[1].Identity.Format.Seed))
	// Another seed: the two pools of this relay's one routing scope cannot
	// share a router, and the key and the start-up check both say so.
	assert.NotEqual(t, cat.Pools[0].RouterKey, cat.Pools[1].RouterKey)
	assert.Equal(t, []catalog.Mismatch{{Pool: "dc-b", First: "dc-a", Fields: []string{"seed"}}}, s.RouterMismatches())
}

func TestCatalog_RouterKeyEqualForCompatiblePools(t *testing.T) {
	s, ts := startTestServer(t, testConfig())
	cat, err := catalog.Get(t.Context(), nil, ts.URL, "")
	require.NoError(t, err)
	require.Len(t, cat.Pools, 2)
	assert.Equal(t, cat.Pools[0].RouterKey, cat.Pools[1].RouterKey)
	assert.Len(t, cat.Pools[0].RouterKey, 32)
	assert.Empty(t, s.RouterMismatches())
}

// TestCatalog_QuerySemantics: each pool's declared block size and hash
// format (Dynamo's KvQuerySemantics) are in its catalog entry, the format
// defaulting to dynamo_standard_v1, and a router reads Eagle from it.
func TestCatalog_QuerySemantics(t *testing.T) {
	cfg := testConfig()
	cfg.Pools[1].BlockSize, cfg.Pools[1].HashFormat = 16, HashFormatEagle
	_, ts := startTestServer(t, cfg)
	cat, err := catalog.Get(t.Context(), nil, ts.URL, "")
	require.NoError(t, err)
	require.Len(t, cat.Pools, 2)
	assert.Equal(t, catalog.QuerySemantics{BlockSize: 0, HashFormat: "dynamo_standard_v1"}, cat.Pools[0].Query)
	assert.Equal(t, catalog.QuerySemantics{BlockSize: 16, HashFormat: "dynamo_eagle_v1"}, cat.Pools[1].Query)
	for i, want := range []bool{false, true} {
		eagle, err := cat.Pools[i].Query.Eagle()
		require.NoError(t, err)
		assert.Equal(t, want, eagle, "pool %d", i)
	}
	_, err = catalog.QuerySemantics{HashFormat: "dynamo_standard_v2"}.Eagle()
	assert.ErrorIs(t, err, catalog.ErrUnknownHashFormat, "an unknown format is refused, not read as standard")
}

// TestConfig_PoolQuerySemantics: hash_format is a closed set; a source's
// block_size defaults to the pool's and may not contradict it; both keys
// are --pool flag keys.
func TestConfig_PoolQuerySemantics(t *testing.T) {
	zmqSrc := func(bs int) SourceSpec {
		return SourceSpec{Engine: "vllm", Endpoint: "tcp://127.0.0.1:5557", BlockSize: bs}
	}
	for _, tc := range []struct {
		name   string
		format string
		pool   int
		src    []SourceSpec
		ok     bool
	}{
		{"default format", "", 0, nil, true},
		{"standard", HashFormatStandard, 16, []SourceSpec{zmqSrc(0), zmqSrc(16)}, true},
		{"eagle", HashFormatEagle, 0, []SourceSpec{zmqSrc(32)}, true},
		{"unknown format", "eagle_v1", 0, nil, false},
		{"Dynamo's proto enum spelling is not the config's", "DYNAMO_EAGLE_V1", 0, nil, false},
		{"source block size contradicts the pool's", HashFormatStandard, 16, []SourceSpec{zmqSrc(32)}, false},
		{"negative block size", HashFormatStandard, -1, nil, false},
	} {
		cfg := testConfig()
		cfg.Pools[0].HashFormat, cfg.Pools[0].BlockSize, cfg.Pools[0].Sources = tc.format, tc.pool, tc.src
		err := cfg.WithDefaults().Validate()
		if tc.ok {
			assert.NoError(t, err, tc.name)
		} else {
			assert.ErrorIs(t, err, ErrInvalidConfig, tc.name)
		}
	}
	p, err := ParsePoolFlag("dc-e:dc=5,block_size=16,hash_format=dynamo_eagle_v1")
	require.NoError(t, err)
	assert.Equal(t, 16, p.BlockSize)
	assert.True(t, p.Eagle())
}
