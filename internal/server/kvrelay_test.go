package server

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKvPoolSpec_DefaultsAndValidation: the gRPC catalog's pool metadata
// defaults (the pool's block size from agreeing sources, else 16 in the
// gRPC catalog) and its refusals.
func TestKvPoolSpec_DefaultsAndValidation(t *testing.T) {
	cfg := Config{Pools: []PoolSpec{
		{Name: "a", DCID: 1},
		{Name: "b", DCID: 2, Sources: []SourceSpec{{Engine: "vllm", BlockSize: 32}, {Engine: "sglang", BlockSize: 32}}},
		{Name: "c", DCID: 3, Sources: []SourceSpec{{Engine: "vllm", BlockSize: 32}, {Engine: "sglang", BlockSize: 64}}},
		{Name: "d", DCID: 4, KvRelay: KvPoolSpec{Models: []ModelSpec{{ID: "m"}}}},
	}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	a := cfg.Pools[0].KvRelay
	assert.Equal(t, uint32(16), cfg.Pools[0].QueryBlockSize())
	assert.Equal(t, "dynamo_standard_v1", cfg.Pools[0].HashFormat)
	assert.Equal(t, []string{"legacy"}, a.Roles)
	assert.Equal(t, "dynamo", a.Namespace)
	assert.Equal(t, 32, cfg.Pools[1].BlockSize, "the sources agree")
	assert.Equal(t, uint32(32), cfg.Pools[1].QueryBlockSize())
	assert.Equal(t, 0, cfg.Pools[2].BlockSize, "the sources disagree")
	assert.Equal(t, uint32(16), cfg.Pools[2].QueryBlockSize())
	assert.Equal(t, "m", cfg.Pools[3].KvRelay.Models[0].BaseModel)
	assert.Equal(t, 256, cfg.GRPC.MaxStreams)

	for name, k := range map[string]KvPoolSpec{
		"role":          {Roles: []string{"worker"}},
		"duplicate":     {Roles: []string{"decode", "decode"}},
		"empty id":      {Models: []ModelSpec{{}}},
		"duplicate ids": {Models: []ModelSpec{{ID: "x"}, {ID: "x"}}},
	} {
		c := Config{Pools: []PoolSpec{{Name: "a", DCID: 1, KvRelay: k}}}.WithDefaults()
		assert.ErrorIs(t, c.Validate(), ErrInvalidConfig, name)
	}
}
