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
	assert.IsType(t, "", id["layout_generation"])
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
