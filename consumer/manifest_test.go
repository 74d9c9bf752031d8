package consumer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

func TestManifest_Validate(t *testing.T) {
	foreign := testPool(300)
	foreign.Domain.RoutingScope.Source = ckf.DigestExplicit // equality includes the source
	dup := testPool(100)
	sameDC := testPool(100)
	sameDC.Domain.CacheSemantics.Digest[0] ^= 0xFF
	tests := []struct {
		name string
		edit func(m *Manifest)
		want error
		lane int
	}{
		{"valid", func(m *Manifest) {}, nil, 0},
		{"valid sparse lanes", func(m *Manifest) { p := testPool(300); m.Lanes[0], m.Lanes[15] = nil, &p }, nil, 0},
		{"pool in another domain", func(m *Manifest) { m.Lanes[2] = &foreign }, ErrForeignDomain, 2},
		{"duplicate pool", func(m *Manifest) { m.Lanes[5] = &dup }, ErrDuplicatePool, 5},
		{"duplicate dc_id", func(m *Manifest) { m.Lanes[4] = &sameDC }, ErrDuplicateDCID, 4},
		{"no lane", func(m *Manifest) { m.Lanes = [16]*ckf.PoolID{} }, ErrNoLanes, -1},
		{"window 0", func(m *Manifest) { m.VerificationWindow = 0 }, ErrInvalidWindow, -1},
		{"window 9", func(m *Manifest) { m.VerificationWindow = 9 }, ErrInvalidWindow, -1},
		{"window -1", func(m *Manifest) { m.VerificationWindow = -1 }, ErrInvalidWindow, -1},
		{"bucket count not a power of two", func(m *Manifest) { m.Format.BucketCount = 48 }, ckf.ErrInvalidFormat, -1},
		{"format version", func(m *Manifest) { m.Format.Version = 2 }, ckf.ErrInvalidFormat, -1},
		{"zero manifest", func(m *Manifest) { *m = Manifest{} }, ErrNoLanes, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := testManifest(3, testBuckets)
			tc.edit(&m)
			err := m.Validate()
			if tc.want == nil {
				require.NoError(t, err)
				_, err = New(m)
				require.NoError(t, err, "New")
				return
			}
			var me *ManifestError
			require.ErrorIs(t, err, tc.want)
			require.ErrorIs(t, err, ErrInvalidManifest)
			require.ErrorAs(t, err, &me)
			require.Equal(t, tc.lane, me.Lane, "lane")
			c, err := New(m)
			require.Error(t, err, "New")
			require.Nil(t, c, "New")
		})
	}
}

func TestManifest_ValidWindows(t *testing.T) {
	for w := 1; w <= MaxVerificationWindow; w++ {
		m := testManifest(1, testBuckets)
		m.VerificationWindow = w
		require.NoError(t, m.Validate(), "window %d", w)
	}
}
