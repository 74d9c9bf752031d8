package consumer

import (
	"errors"
	"testing"

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
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				if _, err := New(m); err != nil {
					t.Fatalf("New: got %v, want nil", err)
				}
				return
			}
			var me *ManifestError
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrInvalidManifest) || !errors.As(err, &me) {
				t.Fatalf("got %v, want a *ManifestError matching %v and ErrInvalidManifest", err, tc.want)
			}
			if me.Lane != tc.lane {
				t.Fatalf("got lane %d, want %d", me.Lane, tc.lane)
			}
			if c, err := New(m); c != nil || err == nil {
				t.Fatalf("New: got (%v, %v), want (nil, error)", c, err)
			}
		})
	}
}

func TestManifest_ValidWindows(t *testing.T) {
	for w := 1; w <= MaxVerificationWindow; w++ {
		m := testManifest(1, testBuckets)
		m.VerificationWindow = w
		if err := m.Validate(); err != nil {
			t.Fatalf("window %d: got %v, want nil", w, err)
		}
	}
}
