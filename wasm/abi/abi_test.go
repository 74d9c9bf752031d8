package abi_test

import (
	"errors"
	"testing"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
	"github.com/ckfrelay/ckfrelay/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func manifest() consumer.Manifest {
	d := ckf.Domain{
		CacheSemantics: ckf.ScopedDigest{Digest: [16]byte{1, 2, 3}, Source: ckf.DigestExplicit},
		RoutingScope:   ckf.ScopedDigest{Digest: [16]byte{9}},
	}
	m := consumer.Manifest{ConsumerInstance: 1 << 40, Domain: d, Format: ckf.NewFormat(ckf.DefaultSeed, 1<<20), VerificationWindow: 3}
	m.Lanes[0] = &ckf.PoolID{Domain: d, DCID: 7}
	m.Lanes[15] = &ckf.PoolID{Domain: d, DCID: 1<<64 - 1}
	return m
}

func TestManifest_RoundTrip(t *testing.T) {
	m := manifest()
	got, err := abi.DecodeManifest(abi.AppendManifest(nil, &m))
	require.NoError(t, err)
	assert.False(t, got.ConsumerInstance != m.ConsumerInstance || got.Domain != m.Domain || got.Format != m.Format ||
		got.VerificationWindow != m.VerificationWindow, "got %+v, want %+v", got, m)
	for i := range m.Lanes {
		assert.False(t, (got.Lanes[i] == nil) != (m.Lanes[i] == nil) || (m.Lanes[i] != nil && *got.Lanes[i] != *m.Lanes[i]), "lane %d: got %v, want %v", i, got.Lanes[i], m.Lanes[i])
	}
}

func TestAssignment_RoundTrip(t *testing.T) {
	m := manifest()
	id := ckf.ProducerIdentity{Pool: *m.Lanes[15], ProducerIncarnation: 1<<64 - 1, LayoutGeneration: 300, Format: m.Format}
	l := ckf.LaneLease{ConsumerInstance: 5, PhysicalLane: 15, AssignmentEpoch: 1 << 33}
	gid, gl, err := abi.DecodeAssignment(abi.AppendAssignment(nil, &id, &l))
	assert.False(t, err != nil || gid != id || gl != l, "got %+v %+v %v, want %+v %+v", gid, gl, err, id, l)
}

// TestDecode_RejectsEveryTruncationAndTrailingByte: no prefix of a valid
// encoding decodes, nor the encoding plus one byte.
func TestDecode_RejectsEveryTruncationAndTrailingByte(t *testing.T) {
	m := manifest()
	enc := abi.AppendManifest(nil, &m)
	for n := range len(enc) {
		_, err := abi.DecodeManifest(enc[:n])
		require.ErrorIs(t, err, abi.ErrEncoding, "manifest prefix of %d bytes: got %v, want ErrEncoding", n, err)
	}
	_, err := abi.DecodeManifest(append(enc, 0))
	assert.ErrorIs(t, err, abi.ErrEncoding, "trailing byte: got %v, want ErrEncoding", err)
	id := ckf.ProducerIdentity{Pool: *m.Lanes[0], Format: m.Format}
	a := abi.AppendAssignment(nil, &id, &ckf.LaneLease{PhysicalLane: 3})
	for n := range len(a) {
		_, _, err := abi.DecodeAssignment(a[:n])
		require.ErrorIs(t, err, abi.ErrEncoding, "assignment prefix of %d bytes: got %v, want ErrEncoding", n, err)
	}
}

func TestDecode_RejectsOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"not an array", []byte{0xc0}},
		{"manifest version 2", []byte{0x96, 0x02}},
		{"manifest array of 2", append([]byte{0x92, 0x94, 0x95, 0xc4, 16}, make([]byte, 16)...)},
		{"negative int", []byte{0x96, 0xff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := abi.DecodeManifest(tc.b)
			assert.ErrorIs(t, err, abi.ErrEncoding, "got %v, want ErrEncoding", err)
		})
	}
	// A digest source other than 0/1 and a lane above 255.
	m := manifest()
	id := ckf.ProducerIdentity{Pool: *m.Lanes[0], Format: m.Format}
	a := abi.AppendAssignment(nil, &id, &ckf.LaneLease{})
	a[2+1+1+1+16] = 2 // [[[pool: bin16 digest, source
	_, _, err := abi.DecodeAssignment(a)
	assert.ErrorIs(t, err, abi.ErrEncoding, "digest source 2: got %v, want ErrEncoding", err)
}

func FuzzDecodeManifest(f *testing.F) {
	m := manifest()
	f.Add(abi.AppendManifest(nil, &m))
	m2 := manifest()
	m2.Format, m2.LaneFormats[15] = ckf.Format{}, ckf.NewFormat(3, 64)
	f.Add(abi.AppendManifest(nil, &m2)) // version 2
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := abi.DecodeManifest(b)
		if err != nil {
			require.ErrorIs(t, err, abi.ErrEncoding)
			return
		}
		// Whatever decodes re-encodes to something that decodes the same
		// (a version-2 manifest with one format and no lane pins comes back
		// as version 1, the same manifest).
		again, err := abi.DecodeManifest(abi.AppendManifest(nil, &got))
		require.NoError(t, err, "re-decode")
		require.Equal(t, got, again, "re-decode")
	})
}

// TestCodes_Pinned pins the numbers docs/abi.md publishes: the outcome and
// fault values of the consumer package and the ABI's own codes.
func TestCodes_Pinned(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int
	}{
		{"Applied", int(consumer.Applied), 1},
		{"SnapshotInstalled", int(consumer.SnapshotInstalled), 2},
		{"SnapshotChunkAccepted", int(consumer.SnapshotChunkAccepted), 3},
		{"IgnoredForeignLease", int(consumer.IgnoredForeignLease), 4},
		{"IgnoredStaleOrDuplicate", int(consumer.IgnoredStaleOrDuplicate), 5},
		{"AwaitingSnapshot", int(consumer.AwaitingSnapshot), 6},
		{"DrainAcknowledged", int(consumer.DrainAcknowledged), 7},
		{"Deactivated", int(consumer.Deactivated), 8},
		{"RetrySnapshot", int(consumer.RetrySnapshot), 9},
		{"HeartbeatObserved", int(consumer.HeartbeatObserved), 10},
		{"StreamClosed", int(consumer.StreamClosed), 11},
		{"IgnoredUnknownKind", int(consumer.IgnoredUnknownKind), 12},
		{"WrongIdentity", int(consumer.WrongIdentity), 1},
		{"BaseSequenceMismatch", int(consumer.BaseSequenceMismatch), 4},
		{"HeartbeatSequenceMismatch", int(consumer.HeartbeatSequenceMismatch), 15},
		{"ErrStaleAssignmentEpoch", int(abi.ErrStaleAssignmentEpoch), -24},
		{"ErrUnavailable", int(abi.ErrUnavailable), -30},
		{"ErrFrameMalformed", int(abi.ErrFrameMalformed), -45},
		{"ResultSize", abi.ResultSize, 32},
		{"QueryRecordSize", abi.QueryRecordSize, 80},
		{"LaneStatusSize", abi.LaneStatusSize, 168},
		{"StatsSize", abi.StatsSize, 48},
	} {
		assert.Equal(t, tc.want, tc.got, "%s = %d, want %d (published in docs/abi.md)", tc.name, tc.got, tc.want)
	}
}

func TestCodeOf_MatchesSentinels(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want abi.Code
	}{
		{nil, abi.OK},
		{&consumer.LaneError{Op: "assign", Lane: 1, Err: consumer.ErrStaleAssignmentEpoch}, abi.ErrStaleAssignmentEpoch},
		{&consumer.ManifestError{Lane: -1, Err: consumer.ErrNoLanes}, abi.ErrInvalidManifest},
		{&wire.DecodeError{Kind: wire.ErrTruncated}, abi.ErrFrameTruncated},
		{consumer.ErrUnavailable, abi.ErrUnavailable},
		{errors.New("other"), abi.ErrInternal},
	} {
		got := abi.CodeOf(tc.err)
		assert.Equal(t, tc.want, got, "CodeOf(%v) = %v, want %v", tc.err, got, tc.want)
		s := got.Sentinel()
		assert.False(t, tc.want < 0 && tc.want != abi.ErrInternal && !errors.Is(tc.err, s), "%v.Sentinel() = %v, which %v does not match", got, s, tc.err)
	}
}

func TestRecords_RoundTrip(t *testing.T) {
	m := manifest()
	s := consumer.LaneStatus{Configured: true, Pool: *m.Lanes[15], Assigned: true, HasEpoch: true, Ready: true,
		Lease:     ckf.LaneLease{ConsumerInstance: 9, PhysicalLane: 15, AssignmentEpoch: 4},
		Identity:  ckf.ProducerIdentity{Pool: *m.Lanes[15], ProducerIncarnation: 2, LayoutGeneration: 3, Format: m.Format},
		Format:    m.Format,
		LastEpoch: 4, InstalledSequence: 77, SnapshotInProgress: true, ChunksStaged: 2, ChunkCount: 5,
		LastOutcome: consumer.Applied, LastFault: consumer.ChunkOverlap,
		Stats: consumer.LaneStats{Assignments: 1, FramesApplied: 2, FramesIgnored: 3, Deactivations: 4, SnapshotRetries: 5,
			SnapshotsInstalled: 6, DeltasApplied: 7, ImagesApplied: 8, DrainsAcknowledged: 9, LastHeartbeatMicros: -10}}
	b := make([]byte, abi.LaneStatusSize)
	abi.PutLaneStatus(b, &s)
	got := abi.ReadLaneStatus(b, &m, 15)
	assert.Equal(t, s, got, "lane status: got %+v, want %+v", got, s)
	// A lane of another format than the manifest's: the record carries it.
	s.Format = ckf.NewFormat(77, 1<<20)
	s.Identity.Format = s.Format
	abi.PutLaneStatus(b, &s)
	got = abi.ReadLaneStatus(b, &m, 15)
	assert.Equal(t, s, got, "lane status, own format: got %+v, want %+v", got, s)
	st := consumer.Stats{BucketCount: 1 << 20, TableBytes: 3 << 20, Groups: 4, ReadyMask: 0xf00f, Queries: 5, Probes: 6}
	sb := make([]byte, abi.StatsSize)
	abi.PutStats(sb, &st)
	assert.Equal(t, st, abi.ReadStats(sb), "stats")
	q := consumer.QueryResult{Mask: 0x8001, Blocks: 9, Probes: 4}
	q.Depths[0], q.Depths[15] = 9, 3
	qb := make([]byte, abi.QueryRecordSize)
	abi.PutQueryRecord(qb, &q)
	var gq consumer.QueryResult
	abi.ReadQueryRecord(qb, &gq)
	assert.Equal(t, q, gq, "query: got %+v, want %+v", gq, q)
	r := abi.Result{Code: abi.Code(consumer.Deactivated), Result: consumer.Result{Outcome: consumer.Deactivated,
		Fault: consumer.BaseSequenceMismatch, Lane: -1, Sequence: 1<<64 - 1}, Kind: 2, ErrorOff: 17}
	rb := make([]byte, abi.ResultSize)
	abi.PutResult(rb, &r)
	{
		got := abi.ReadResult(rb)
		assert.Equal(t, r, got, "result: got %+v, want %+v", got, r)
	}
}

func FuzzDecodeAssignment(f *testing.F) {
	m := manifest()
	id := ckf.ProducerIdentity{Pool: *m.Lanes[15], ProducerIncarnation: 9, Format: m.Format}
	f.Add(abi.AppendAssignment(nil, &id, &ckf.LaneLease{ConsumerInstance: 1, PhysicalLane: 15, AssignmentEpoch: 1 << 40}))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, l, err := abi.DecodeAssignment(b)
		if err != nil {
			require.ErrorIs(t, err, abi.ErrEncoding, "error %v does not wrap ErrEncoding", err)
			return
		}
		gid, gl, err := abi.DecodeAssignment(abi.AppendAssignment(nil, &id, &l))
		require.NoError(t, err, "re-decode: %+v %+v", gid, gl)
		require.Equal(t, id, gid, "re-decode: %+v %+v %v", gid, gl, err)
		require.Equal(t, l, gl, "re-decode: %+v %+v %v", gid, gl, err)
	})
}

// TestManifest_Version2 round-trips manifests with per-lane formats (version
// 2) and checks a one-format manifest still encodes as version 1, byte for
// byte what it was (its first two bytes: fixarray 6, version 1).
func TestManifest_Version2(t *testing.T) {
	m := manifest()
	v1 := abi.AppendManifest(nil, &m)
	require.Equal(t, []byte{0x96, 0x01}, v1[:2], "one format: version 1")
	for _, tc := range []struct {
		name string
		edit func(m *consumer.Manifest)
	}{
		{"no pin at all", func(m *consumer.Manifest) { m.Format = ckf.Format{} }},
		{"one lane pinned", func(m *consumer.Manifest) { m.Format = ckf.Format{}; m.LaneFormats[15] = ckf.NewFormat(5, 1<<17) }},
		{"a default and one other lane", func(m *consumer.Manifest) { m.LaneFormats[15] = ckf.NewFormat(5, 64) }},
	} {
		mm := manifest()
		tc.edit(&mm)
		b := abi.AppendManifest(nil, &mm)
		require.Equal(t, []byte{0x97, 0x02}, b[:2], "%s: version 2", tc.name)
		got, err := abi.DecodeManifest(b)
		require.NoError(t, err, tc.name)
		assert.Equal(t, mm, got, tc.name)
		_, err = abi.DecodeManifest(b[:len(b)-1])
		require.ErrorIs(t, err, abi.ErrEncoding, "%s: truncated", tc.name)
	}
	bad := append([]byte(nil), v1...)
	bad[1] = 2 // version 2 in a manifest of 6 elements
	_, err := abi.DecodeManifest(bad)
	require.ErrorIs(t, err, abi.ErrEncoding, "version 2 with version 1's shape")
}
