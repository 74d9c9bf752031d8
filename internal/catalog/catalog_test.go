package catalog_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

func TestU64_IsADecimalString(t *testing.T) {
	for _, v := range []uint64{0, 1, 1 << 53, 1<<53 + 1, math.MaxUint64} {
		b, err := json.Marshal(catalog.U64(v))
		require.NoError(t, err)
		var s string
		require.NoError(t, json.Unmarshal(b, &s), "%s is not a JSON string", b)
		var back catalog.U64
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, v, uint64(back))
	}
	var u catalog.U64
	for _, bad := range []string{`12`, `"-1"`, `"18446744073709551616"`, `"0x10"`, `null`} {
		assert.Error(t, json.Unmarshal([]byte(bad), &u), bad)
	}
}

func TestI64_IsADecimalString(t *testing.T) {
	for _, v := range []int64{-1, 0, 1 << 53, 1<<53 + 1, math.MinInt64, math.MaxInt64} {
		b, err := json.Marshal(catalog.I64(v))
		require.NoError(t, err)
		var s string
		require.NoError(t, json.Unmarshal(b, &s), "%s is not a JSON string", b)
		var back catalog.I64
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, v, int64(back))
	}
	var i catalog.I64
	for _, bad := range []string{`12`, `"9223372036854775808"`, `"0x10"`, `null`} {
		assert.Error(t, json.Unmarshal([]byte(bad), &i), bad)
	}
}

func identity(seed, buckets uint64) ckf.ProducerIdentity {
	d := ckf.Domain{RoutingScope: ckf.ScopedDigest{Digest: [16]byte{1}, Source: ckf.DigestExplicit}}
	return ckf.ProducerIdentity{Pool: ckf.PoolID{Domain: d, DCID: 1}, ProducerIncarnation: math.MaxUint64 - 1,
		Format: ckf.NewFormat(seed, buckets)}
}

func pool(name string, id ckf.ProducerIdentity) catalog.Pool {
	return catalog.Pool{Name: name, RouterKey: catalog.RouterKey(id.Pool.Domain), Identity: catalog.FromIdentity(id),
		Query: catalog.QuerySemantics{BlockSize: 16, HashFormat: catalog.HashFormatStandard}}
}

func TestFromIdentity_KeepsEvery64BitValue(t *testing.T) {
	id := identity(math.MaxUint64, 1<<20)
	b, err := json.Marshal(catalog.FromIdentity(id))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"producer_incarnation":"18446744073709551614"`)
	assert.Contains(t, string(b), `"seed":"18446744073709551615"`)
	assert.Contains(t, string(b), `"bucket_count":"1048576"`)
	assert.Contains(t, string(b), `"routing_scope_source":"explicit"`)
}

// TestMismatches_NameWhatDiffersWithinARoutingScope: within one domain,
// pools of other formats share a router (each lane has its own format);
// another block size or hash format (one request cannot be asked of both)
// do not, and the mismatch names the field. Another cache_semantics is
// another domain (another model's pools, which a router selects apart):
// never compared.
func TestMismatches_NameWhatDiffersWithinARoutingScope(t *testing.T) {
	a := identity(7, 1024)
	b := identity(7, 1024)
	b.Pool.DCID, b.ProducerIncarnation = 2, 9 // pool id and incarnation may differ
	c := identity(8, 4096)                    // another format: fine
	d := identity(7, 1024)
	d.Pool.Domain.CacheSemantics.Digest[0] = 5 // another domain
	other := identity(9, 64)
	other.Pool.Domain.RoutingScope.Digest[0] = 2 // another scope: never compared
	assert.Equal(t, catalog.RouterKey(a.Pool.Domain), catalog.RouterKey(c.Pool.Domain), "the key ignores the format")
	assert.NotEqual(t, catalog.RouterKey(a.Pool.Domain), catalog.RouterKey(d.Pool.Domain))
	e := pool("e", identity(7, 1024))
	e.Query.BlockSize = 32
	f := pool("f", identity(7, 1024))
	f.Query.HashFormat = catalog.HashFormatEagle
	got := catalog.Mismatches([]catalog.Pool{pool("a", a), pool("b", b), pool("c", c), pool("d", d), e, f, pool("x", other)})
	assert.Equal(t, []catalog.Mismatch{
		{Pool: "e", First: "a", Fields: []string{"block_size"}},
		{Pool: "f", First: "a", Fields: []string{"hash_format"}},
	}, got)
}

func FuzzU64(f *testing.F) {
	for _, s := range []string{`"0"`, `"18446744073709551615"`, `"18446744073709551616"`, `12`, `"-1"`, `""`, `"1e3"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var u catalog.U64
		if err := u.UnmarshalJSON(b); err != nil {
			return
		}
		// Whatever reads back writes a string that reads back the same.
		out, err := u.MarshalJSON()
		require.NoError(t, err)
		var again catalog.U64
		require.NoError(t, again.UnmarshalJSON(out))
		require.Equal(t, u, again)
	})
}
