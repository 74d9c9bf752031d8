package ckf

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseScopedDigest: the catalog spelling (32 hex digits, the source's
// name) parses back to the digest; anything else is an error.
func TestParseScopedDigest(t *testing.T) {
	want := ScopedDigest{Digest: [16]byte{0: 0xab, 15: 1}, Source: DigestExplicit}
	got, err := ParseScopedDigest(hex.EncodeToString(want.Digest[:]), want.Source.String())
	require.NoError(t, err)
	require.Equal(t, want, got)
	got, err = ParseScopedDigest(hex.EncodeToString(want.Digest[:]), "default_derived")
	require.NoError(t, err)
	require.Equal(t, DigestDefaultDerived, got.Source)
	for _, tc := range [][2]string{
		{"ab", "explicit"}, {"zz000000000000000000000000000000", "explicit"},
		{hex.EncodeToString(want.Digest[:]) + "00", "explicit"}, {hex.EncodeToString(want.Digest[:]), "DigestSource(2)"},
	} {
		_, err := ParseScopedDigest(tc[0], tc[1])
		require.Error(t, err, "%q %q", tc[0], tc[1])
	}
}
