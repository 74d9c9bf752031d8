package ckf

import "testing"

func TestAddresser_GoldenVectors(t *testing.T) {
	ad := NewAddresser(0x123456789ABCDEF0, 1024)
	cases := []struct {
		key  uint64
		fp   uint16
		a, b uint64
	}{
		{0, 7750, 587, 372},
		{1, 64153, 348, 36},
		{0x0123456789ABCDEF, 45802, 865, 909},
		{0xFFFFFFFFFFFFFFFF, 31767, 112, 217},
	}
	for _, c := range cases {
		got := ad.Address(c.key)
		want := Address{Fingerprint: c.fp, A: c.a, B: c.b}
		if got != want {
			t.Errorf("Address(%#x) = %+v, want %+v", c.key, got, want)
		}
	}
}
