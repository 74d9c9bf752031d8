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
		"alias twice":   {Models: []ModelSpec{{ID: "x", Aliases: []string{"y", "y"}}}},
		"empty alias":   {Models: []ModelSpec{{ID: "x", Aliases: []string{""}}}},
		"padded id":     {Models: []ModelSpec{{ID: "x "}}},
		"padded ns":     {Namespace: " dynamo"},
	} {
		c := Config{Pools: []PoolSpec{{Name: "a", DCID: 1, KvRelay: k}}}.WithDefaults()
		assert.ErrorIs(t, c.Validate(), ErrInvalidConfig, name)
	}
}

// TestPools_SeveralModelsInOneDataCenter: pools of one data center share a
// dc_id in different indexer domains (pool-level cache_semantics and
// routing_scope override the relay's), as a Dynamo relay hosts one pool per
// model; the same domain twice in one data center is refused.
func TestPools_SeveralModelsInOneDataCenter(t *testing.T) {
	cfg := Config{CacheSemantics: "relay", Pools: []PoolSpec{
		{Name: "llama-1", DCID: 1, CacheSemantics: "llama"},
		{Name: "qwen-1", DCID: 1, CacheSemantics: "qwen"},
		{Name: "llama-2", DCID: 2, CacheSemantics: "llama"},
		{Name: "base-1", DCID: 1},
		{Name: "scoped-1", DCID: 1, RoutingScope: "tenant-a"},
	}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	d := func(i int) [16]byte { return cfg.PoolDomain(cfg.Pools[i]).CacheSemantics.Digest }
	assert.Equal(t, d(0), d(2), "one model's pools share its domain")
	assert.NotEqual(t, d(0), d(1))
	assert.Equal(t, cfg.Domain(), cfg.PoolDomain(cfg.Pools[3]), "no override: the relay's domain")
	assert.Equal(t, cfg.Domain().CacheSemantics, cfg.PoolDomain(cfg.Pools[4]).CacheSemantics)
	assert.NotEqual(t, cfg.Domain().RoutingScope, cfg.PoolDomain(cfg.Pools[4]).RoutingScope)

	p, err := ParsePoolFlag("qwen-2:dc=2,cache_semantics=qwen,routing_scope=tenant-a")
	require.NoError(t, err)
	assert.Equal(t, PoolSpec{Name: "qwen-2", DCID: 2, CacheSemantics: "qwen", RoutingScope: "tenant-a"}, p)

	for name, pools := range map[string][]PoolSpec{
		"same model twice in dc 1": {{Name: "a", DCID: 1, CacheSemantics: "llama"}, {Name: "b", DCID: 1, CacheSemantics: "llama"}},
		"relay domain twice":       {{Name: "a", DCID: 1}, {Name: "b", DCID: 1}},
		"override equal to relay":  {{Name: "a", DCID: 1}, {Name: "b", DCID: 1, CacheSemantics: "relay"}},
	} {
		c := Config{CacheSemantics: "relay", Pools: pools}.WithDefaults()
		assert.ErrorIs(t, c.Validate(), ErrInvalidConfig, name)
	}
}
