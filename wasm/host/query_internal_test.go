package host

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// TestQueryExport_BuffersCheckedEveryCall calls the module's query export
// directly with buffers outside the guest's allocations, after valid
// queries have primed its inline check of the last query's buffers
// (wasm/guest exportQuery): every bad buffer must be refused with
// ErrBadArgument, with no trap, for every query kind, and a freed buffer
// must be refused too.
func TestQueryExport_BuffersCheckedEveryCall(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, NewConfig().WithCompilationCacheDir(filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")))
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close(ctx) })
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}}
	man := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 16), VerificationWindow: 2}
	man.Lanes[2] = &ckf.PoolID{Domain: d, DCID: 2}
	in, err := rt.NewInstance(ctx, man)
	require.NoError(t, err)
	t.Cleanup(func() { in.Close() })
	m := in.m

	p, _, err := m.input(64)
	require.NoError(t, err)
	query := func(kind int, ptr uint32, count uint32, out uint32) abi.Code {
		t.Helper()
		v, err := m.call(abi.ExportQuery, uint64(kind), uint64(ptr), uint64(count), 16, 0, uint64(out))
		require.NoError(t, err, "the query export trapped")
		return abi.Code(int32(v))
	}
	capacity := m.scratchCap
	for _, kind := range []int{abi.QuerySequenceHashes, abi.QueryLocalHashes, abi.QueryTokens} {
		width := uint32(8)
		if kind == abi.QueryTokens {
			width = 4
		}
		// No lane is ready: a valid query reports ErrUnavailable.
		require.Equal(t, abi.ErrUnavailable, query(kind, p, 4, m.out), "kind %d: valid query", kind)
		for _, tc := range []struct {
			name       string
			ptr, count uint32
			out        uint32
		}{
			{"input past its buffer", p + capacity - width, 2, m.out},
			{"input at its buffer's end", p + capacity, 1, m.out},
			{"null input", 0, 1, m.out},
			{"record past its buffer", p, 4, m.out + recordBytes - abi.QueryRecordSize + 1},
			{"null record", p, 4, 0},
			{"huge count", p, 1 << 31, m.out},
		} {
			assert.Equal(t, abi.ErrBadArgument, query(kind, tc.ptr, tc.count, tc.out), "kind %d: %s", kind, tc.name)
			require.Equal(t, abi.ErrUnavailable, query(kind, p, 4, m.out), "kind %d: valid query after %s", kind, tc.name)
		}
	}
	assert.Equal(t, abi.ErrBadArgument, query(9, p, 4, m.out), "unknown kind")

	_, err = m.call(abi.ExportFree, uint64(p))
	require.NoError(t, err)
	for _, kind := range []int{abi.QuerySequenceHashes, abi.QueryTokens} {
		assert.Equal(t, abi.ErrBadArgument, query(kind, p, 4, m.out), "kind %d: freed input buffer", kind)
	}
}

// TestQueryExport_TokenQueryLayout calls the query export with kind
// QueryTokensWith and inputs that break the token query layout: each is
// refused with ErrBadArgument and a message naming the layout, with no trap,
// and a valid request still answers after each.
func TestQueryExport_TokenQueryLayout(t *testing.T) {
	ctx := context.Background()
	rt, err := NewRuntime(ctx, NewConfig().WithCompilationCacheDir(filepath.Join(os.TempDir(), "ckfrelay-wazero-cache")))
	require.NoError(t, err)
	t.Cleanup(func() { rt.Close(ctx) })
	d := ckf.Domain{CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1}}}
	man := consumer.Manifest{ConsumerInstance: 1, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 16), VerificationWindow: 2}
	man.Lanes[2] = &ckf.PoolID{Domain: d, DCID: 2}
	in, err := rt.NewInstance(ctx, man)
	require.NoError(t, err)
	t.Cleanup(func() { in.Close() })
	m := in.m

	valid := abi.AppendTokenQuery(nil, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, ckf.HashOptions{Eagle: true, MM: [][]uint64{{3}}})
	query := func(b []byte, count int) abi.Code {
		t.Helper()
		p, v, err := m.input(len(b))
		require.NoError(t, err)
		copy(v, b)
		code, err := m.call(abi.ExportQuery, abi.QueryTokensWith, uint64(p), uint64(count), 4, ckf.BaseSalt, uint64(m.out))
		require.NoError(t, err, "the query export trapped")
		return abi.Code(int32(code))
	}
	require.Equal(t, abi.ErrUnavailable, query(valid, len(valid)), "valid request, no lane ready")
	flag := bytes.Clone(valid)
	flag[0] |= 4
	for _, tc := range []struct {
		name  string
		b     []byte
		count int
	}{
		{"count one short", valid, len(valid) - 1},
		{"count below the header", valid, 8},
		{"unknown flag", flag, len(flag)},
	} {
		assert.Equal(t, abi.ErrBadArgument, query(tc.b, tc.count), tc.name)
		assert.Contains(t, m.lastError(), "malformed token query", tc.name)
		require.Equal(t, abi.ErrUnavailable, query(valid, len(valid)), "valid request after %s", tc.name)
	}
}
