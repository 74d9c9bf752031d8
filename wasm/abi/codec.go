package abi

import (
	"errors"
	"fmt"
	"math"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wire"
)

// The manifest and assignment encodings are msgpack built from the parts of
// wire v1 frames (SPEC §9), with wire's own codec (wire.Append*, wire.Decoder),
// so an identity, pool id, format or lease is the same bytes here as in a
// frame and is read under the same rules, and a host that already encodes
// frames needs nothing new:
//
//	manifest   = [1, consumer_instance, domain, format, lanes, verification_window]
//	           | [2, consumer_instance, domain, nil | format, lanes, verification_window, lane_formats]
//	lanes      = array of exactly 16 × (nil | pool_id)
//	lane_formats = array of exactly 16 × (nil | format)
//	domain     = [sem_digest bin16, sem_source, scope_digest bin16, scope_source]
//	pool_id    = [sem_digest bin16, sem_source, scope_digest bin16, scope_source, dc_id]
//	format     = [format_version, seed, bucket_count, fingerprint_bits, slots_per_bucket]
//	assignment = [identity, lease]
//	identity   = [pool_id, producer_incarnation, layout_generation, format]
//	lease      = [consumer_instance, physical_lane, assignment_epoch]
//
// Integers may use any msgpack integer width with a value in range (wire's
// rule, docs/wire.md §2.1); sources are 0 (default_derived) or 1 (explicit).
// Decoders reject trailing bytes, wrong array lengths and out-of-range
// values with [ErrEncoding].

// ManifestVersion is the first element of an encoded manifest with one
// format for every lane; ManifestVersion2 of one with per-lane formats
// (docs/abi.md §6): its format is the manifest-wide pin or nil, and
// lane_formats pins lanes one by one (nil: the format comes from the lane's
// assignment). Both decode; [AppendManifest] writes version 1 whenever it
// can, so a version-1 manifest's bytes are unchanged.
const (
	ManifestVersion  = 1
	ManifestVersion2 = 2
)

// ErrEncoding is wrapped by every manifest or assignment decode failure,
// together with the wire.DecodeError that says where and why.
var ErrEncoding = errors.New("abi: malformed encoding")

// AppendManifest appends the msgpack encoding of m to dst: version 1 when
// m pins one format for every lane through Format alone, version 2
// otherwise.
func AppendManifest(dst []byte, m *consumer.Manifest) []byte {
	v2 := m.LaneFormats != [len(m.LaneFormats)]ckf.Format{} || m.Format == (ckf.Format{})
	n, version := 6, uint64(ManifestVersion)
	if v2 {
		n, version = 7, ManifestVersion2
	}
	b := wire.AppendArrayHeader(dst, n)
	b = wire.AppendUint(b, version)
	b = wire.AppendUint(b, m.ConsumerInstance)
	b = wire.AppendDomain(b, &m.Domain)
	b = appendFormatOrNil(b, &m.Format)
	b = wire.AppendArrayHeader(b, len(m.Lanes))
	for _, p := range m.Lanes {
		if p == nil {
			b = wire.AppendNil(b)
			continue
		}
		b = wire.AppendPoolID(b, p)
	}
	b = wire.AppendUint(b, uint64(max(m.VerificationWindow, 0)))
	if v2 {
		b = wire.AppendArrayHeader(b, len(m.LaneFormats))
		for i := range m.LaneFormats {
			b = appendFormatOrNil(b, &m.LaneFormats[i])
		}
	}
	return b
}

func appendFormatOrNil(b []byte, f *ckf.Format) []byte {
	if *f == (ckf.Format{}) {
		return wire.AppendNil(b)
	}
	return wire.AppendFormat(b, f)
}

// DecodeManifest decodes an encoding written by [AppendManifest], of either
// version. It does not validate the manifest's meaning (see
// consumer.Manifest.Validate).
func DecodeManifest(data []byte) (consumer.Manifest, error) {
	n, version := 6, uint64(ManifestVersion)
	if wire.NewDecoder(data).Array(7, "manifest") == nil {
		n, version = 7, ManifestVersion2
	}
	m, err := decodeManifest(wire.NewDecoder(data), n, version)
	if err != nil {
		return consumer.Manifest{}, fmt.Errorf("%w: manifest: %w", ErrEncoding, err)
	}
	return m, nil
}

func decodeManifest(d *wire.Decoder, n int, version uint64) (m consumer.Manifest, err error) {
	if err = d.Array(n, "manifest"); err != nil {
		return m, err
	}
	v, err := d.Uint(ManifestVersion2, "manifest.version")
	if err != nil {
		return m, err
	}
	if v != version {
		return m, fmt.Errorf("manifest version %d in a manifest of %d elements", v, n)
	}
	if m.ConsumerInstance, err = d.Uint(math.MaxUint64, "manifest.consumer_instance"); err != nil {
		return m, err
	}
	if m.Domain, err = d.Domain(); err != nil {
		return m, err
	}
	if version == ManifestVersion || !d.Nil() {
		if m.Format, err = d.Format(); err != nil {
			return m, err
		}
	}
	if err = d.Array(len(m.Lanes), "manifest.lanes"); err != nil {
		return m, err
	}
	for i := range m.Lanes {
		if d.Nil() {
			continue
		}
		p, err := d.PoolID()
		if err != nil {
			return m, err
		}
		m.Lanes[i] = &p
	}
	w, err := d.Uint(math.MaxInt32, "manifest.verification_window")
	if err != nil {
		return m, err
	}
	m.VerificationWindow = int(w)
	if version == ManifestVersion2 {
		if err = d.Array(len(m.LaneFormats), "manifest.lane_formats"); err != nil {
			return m, err
		}
		for i := range m.LaneFormats {
			if d.Nil() {
				continue
			}
			if m.LaneFormats[i], err = d.Format(); err != nil {
				return m, err
			}
		}
	}
	return m, d.End()
}

// AppendAssignment appends the msgpack encoding of (identity, lease) to dst.
// An identity whose digest sources are undefined is written as it is (the
// module rejects it).
func AppendAssignment(dst []byte, id *ckf.ProducerIdentity, lease *ckf.LaneLease) []byte {
	b := wire.AppendArrayHeader(dst, 2)
	b = wire.AppendArrayHeader(b, 4)
	b = wire.AppendPoolID(b, &id.Pool)
	b = wire.AppendUint(b, id.ProducerIncarnation)
	b = wire.AppendUint(b, id.LayoutGeneration)
	b = wire.AppendFormat(b, &id.Format)
	return wire.AppendLease(b, lease)
}

// DecodeAssignment decodes an encoding written by [AppendAssignment].
func DecodeAssignment(data []byte) (ckf.ProducerIdentity, ckf.LaneLease, error) {
	d := wire.NewDecoder(data)
	id, l, err := func() (id ckf.ProducerIdentity, l ckf.LaneLease, err error) {
		if err = d.Array(2, "assignment"); err != nil {
			return
		}
		if id, err = d.Identity(); err != nil {
			return
		}
		if l, err = d.Lease(); err != nil {
			return
		}
		return id, l, d.End()
	}()
	if err != nil {
		return ckf.ProducerIdentity{}, ckf.LaneLease{}, fmt.Errorf("%w: assignment: %w", ErrEncoding, err)
	}
	return id, l, nil
}
