package consumer

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// DefaultVerificationWindow is the SPEC §2.1 default window of the prefix search.
const DefaultVerificationWindow = 2

// MaxVerificationWindow is the largest accepted verification window.
const MaxVerificationWindow = 8

// Manifest configures a [Consumer] (SPEC §8.2): which pool each of the 16
// lanes serves, the formats it may pin, and the verification window of the
// prefix search. The zero value is invalid (no lane, window 0).
//
// A lane's format comes from its assignment (the producer identity carries
// it). A manifest may pin formats: Format pins every lane (the version-1
// manifest, one format for all), LaneFormats[i] pins lane i; an assignment
// of another format is then ErrFormatMismatch. With neither, a lane takes
// any valid format and may change it across resubscribes.
type Manifest struct {
	// ConsumerInstance must equal the ConsumerInstance of every lease.
	ConsumerInstance uint64
	// Domain is the routing domain every configured pool must belong to.
	Domain ckf.Domain
	// Format, when set, pins every lane without a LaneFormats entry to one
	// (seed, bucket count) layout; zero pins none.
	Format ckf.Format
	// LaneFormats[i], when set, pins lane i to a format (it must be a
	// configured lane's); zero leaves the lane to Format, or to its
	// assignment.
	LaneFormats [ckf.MaxLanes]ckf.Format
	// Lanes[i] is the pool lane i serves; nil leaves the lane unconfigured.
	Lanes [ckf.MaxLanes]*ckf.PoolID
	// VerificationWindow is W of SPEC §8.4, 1..=8.
	VerificationWindow int
}

// Validate returns the first failure, checking lane by lane (in index order)
// for a duplicate pool, a duplicate dc_id and a pool in another domain, then
// that at least one lane is configured, then the window, then the format.
// Duplicates are checked before the domain so that each kind of mistake is
// reported by its own name (see docs/RATIONALE.md). Every error is a
// [*ManifestError].
func (m *Manifest) Validate() error {
	configured := 0
	for i, p := range m.Lanes {
		if p == nil {
			continue
		}
		configured++
		for j := range i {
			q := m.Lanes[j]
			if q == nil {
				continue
			}
			if *q == *p {
				return &ManifestError{Lane: i, Err: ErrDuplicatePool, Detail: fmt.Sprintf("same pool as lane %d", j)}
			}
			if q.DCID == p.DCID {
				return &ManifestError{Lane: i, Err: ErrDuplicateDCID, Detail: fmt.Sprintf("dc_id %d also on lane %d", p.DCID, j)}
			}
		}
		if p.Domain != m.Domain {
			return &ManifestError{Lane: i, Err: ErrForeignDomain}
		}
	}
	if configured == 0 {
		return &ManifestError{Lane: -1, Err: ErrNoLanes}
	}
	if m.VerificationWindow < 1 || m.VerificationWindow > MaxVerificationWindow {
		return &ManifestError{Lane: -1, Err: ErrInvalidWindow, Detail: fmt.Sprintf("got %d", m.VerificationWindow)}
	}
	if m.Format != (ckf.Format{}) {
		if err := m.Format.Validate(); err != nil {
			return &ManifestError{Lane: -1, Err: err}
		}
	}
	for i, f := range m.LaneFormats {
		if f == (ckf.Format{}) {
			continue
		}
		if m.Lanes[i] == nil {
			return &ManifestError{Lane: i, Err: ckf.ErrInvalidFormat, Detail: "a format pinned to an unconfigured lane"}
		}
		if err := f.Validate(); err != nil {
			return &ManifestError{Lane: i, Err: err}
		}
	}
	return nil
}

// LaneFormat returns the format lane i is pinned to: LaneFormats[i], else
// Format; zero when the lane takes its format from its assignment.
func (m *Manifest) LaneFormat(i int) ckf.Format {
	if f := m.LaneFormats[i]; f != (ckf.Format{}) {
		return f
	}
	return m.Format
}

// UniformFormat reports the one format every configured lane is pinned to,
// if there is one: the version-1 manifest, whose consumer allocates the
// 16-lane table up front and answers exactly as before format groups.
func (m *Manifest) UniformFormat() (ckf.Format, bool) {
	var f ckf.Format
	for i, p := range m.Lanes {
		if p == nil {
			continue
		}
		lf := m.LaneFormat(i)
		if lf == (ckf.Format{}) || (f != (ckf.Format{}) && lf != f) {
			return ckf.Format{}, false
		}
		f = lf
	}
	return f, f != (ckf.Format{})
}
