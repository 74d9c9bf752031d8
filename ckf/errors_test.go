package ckf

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFailurePointOf_Table(t *testing.T) {
	wrap := func(kind error) error { return &EventError{Kind: kind, Member: Member{1, 2}, BlockHash: 3} }
	cases := []struct {
		err  error
		want FailurePoint
	}{
		{nil, 0},
		{ErrCapacityExhausted, BoundedRelocationFailure},
		{ErrAllocationFailed, PrecommitAllocationFailure},
		{ErrOwnershipDegreeOverflow, SourceProtocolFailure},
		{ErrParentBlockNotFound, SourceProtocolFailure},
		{ErrBlockNotFound, SourceProtocolFailure},
		{ErrInvalidBlockSequence, SourceProtocolFailure},
		{ErrUnsupportedResidencyDomain, SourceProtocolFailure},
		{ErrMalformedEvent, SourceProtocolFailure},
		{ErrInvalidReplacement, SourceProtocolFailure},
		{errors.New("anything else"), SourceProtocolFailure},
		{ErrIndexerInvariantViolation, PrewriteInvariantMismatch},
		{wrap(ErrCapacityExhausted), BoundedRelocationFailure},
		{wrap(ErrIndexerInvariantViolation), PrewriteInvariantMismatch},
		{fmt.Errorf("ctx: %w", wrap(ErrAllocationFailed)), PrecommitAllocationFailure},
	}
	for _, tc := range cases {
		got := FailurePointOf(tc.err)
		assert.Equal(t, tc.want, got, "FailurePointOf(%v) = %v, want %v", tc.err, got, tc.want)
	}
}

// TestDispositionOf_Table mirrors the SPEC §5 table row for row.
func TestDispositionOf_Table(t *testing.T) {
	const none FailureDomain = 0 // "—"
	cases := []struct {
		point    FailurePoint
		name     string
		domain   FailureDomain
		commit   CommitState
		recovery FailureDomain
		action   RecoveryAction
	}{
		{BoundedRelocationFailure, "BoundedRelocationFailure", ProducerCore, KnownUnchanged, none, ContinueCapacityOmission},
		{PrecommitAllocationFailure, "PrecommitAllocationFailure", ProducerCore, KnownUnchanged, none, ReportResourceFailure},
		{SourceProtocolFailure, "SourceProtocolFailure", ProducerCore, KnownUnchanged, none, RejectSource},
		{PrewriteInvariantMismatch, "PrewriteInvariantMismatch", ProducerCore, KnownUnchanged, ProducerCore, FenceAndRebuildProducer},
		{ConsumerGapOrMalformedBeforeWrite, "ConsumerGapOrMalformedBeforeWrite", ConsumerLane, KnownUnchanged, ConsumerLane, DeactivateAndSnapshot},
		{ConsumerWorkerFailureMidApply, "ConsumerWorkerFailureMidApply", ConsumerLane, Uncertain, ConsumerLane, DeactivateAndSnapshot},
		{InactiveSnapshotInstallFailure, "InactiveSnapshotInstallFailure", ConsumerLane, KnownUnchanged, ConsumerLane, RetrySnapshot},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			{
				got := tc.point.String()
				assert.Equal(t, tc.name, got, "String() = %q, want %q", got, tc.name)
			}
			got, ok := DispositionOf(tc.point)
			want := Disposition{tc.domain, tc.commit, tc.recovery, tc.action}
			require.True(t, ok, "DispositionOf(%v) = %+v, %v; want %+v, true", tc.point, got, ok, want)
			require.Equal(t, want, got, "DispositionOf(%v) = %+v, %v; want %+v, true", tc.point, got, ok, want)
		})
	}
	for _, p := range []FailurePoint{0, InactiveSnapshotInstallFailure + 1, 255} {
		d, ok := DispositionOf(p)
		assert.False(t, ok || d != (Disposition{}), "DispositionOf(%d) = %+v, %v; want zero, false", p, d, ok)
		s := p.String()
		assert.True(t, strings.HasPrefix(s, "FailurePoint("), "FailurePoint(%d).String() = %q, want FailurePoint(n)", p, s)
	}
}

// TestDispositionOf_CapacityOmissionNeverFaults pins the SPEC §5 rule that a
// capacity omission continues and never retires a consumer lane.
func TestDispositionOf_CapacityOmissionNeverFaults(t *testing.T) {
	d, _ := DispositionOf(FailurePointOf(&EventError{Kind: ErrCapacityExhausted}))
	require.Equal(t, ContinueCapacityOmission, d.Action, "capacity disposition = %+v, want ProducerCore/ContinueCapacityOmission with no recovery domain", d)
	require.Equal(t, ProducerCore, d.Domain, "capacity disposition = %+v, want ProducerCore/ContinueCapacityOmission with no recovery domain", d)
	require.Equal(t, FailureDomain(0), d.RecoveryDomain, "capacity disposition = %+v, want ProducerCore/ContinueCapacityOmission with no recovery domain", d)
}

func TestEventError_IsAs(t *testing.T) {
	sentinels := []error{
		ErrParentBlockNotFound, ErrBlockNotFound, ErrInvalidBlockSequence, ErrCapacityExhausted,
		ErrAllocationFailed, ErrOwnershipDegreeOverflow, ErrIndexerInvariantViolation,
		ErrUnsupportedResidencyDomain, ErrMalformedEvent, ErrInvalidReplacement,
	}
	for _, kind := range sentinels {
		err := fmt.Errorf("outer: %w", &EventError{Kind: kind, Member: Member{WorkerID: 7, DPRank: 1}, BlockHash: 0xAB, Detail: "why"})
		assert.ErrorIs(t, err, kind, "errors.Is(%v, %v) = false, want true", err, kind)
		for _, other := range sentinels {
			assert.False(t, other != kind && errors.Is(err, other), "errors.Is(%v, %v) = true, want false", err, other)
		}
		var ee *EventError
		require.ErrorAs(t, err, &ee, "errors.As(%v, *EventError) = false", err)
		assert.False(t, ee.Member != (Member{7, 1}) || ee.BlockHash != 0xAB, "EventError = %+v, want member {7 1} block 0xab", ee)
		msg := err.Error()
		for _, want := range []string{kind.Error(), "worker 7", "rank 1", "0xab", "why"} {
			assert.Contains(t, msg, want, "Error() = %q, want it to contain %q", msg, want)
		}
	}
}

func TestEnums_String(t *testing.T) {
	cases := []struct{ got, want string }{
		{ProducerCore.String(), "ProducerCore"},
		{ConsumerLane.String(), "ConsumerLane"},
		{FailureDomain(9).String(), "FailureDomain(9)"},
		{KnownUnchanged.String(), "KnownUnchanged"},
		{Uncertain.String(), "Uncertain"},
		{CommitState(0).String(), "CommitState(0)"},
		{RetrySnapshot.String(), "RetrySnapshot"},
		{RecoveryAction(0).String(), "RecoveryAction(0)"},
		{TierDevice.String(), "device"},
		{TierExternal.String(), "external"},
		{StorageTier(4).String(), "StorageTier(4)"},
		{EventStored.String(), "stored"},
		{EventKind(0).String(), "EventKind(0)"},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, tc.got, "String() = %q, want %q", tc.got, tc.want)
	}
	for _, name := range []string{"device", "host_pinned", "disk", "external"} {
		tier, ok := ParseStorageTier(name)
		assert.False(t, !ok || tier.String() != name, "ParseStorageTier(%q) = %v, %v; want round trip", name, tier, ok)
	}
	_, ok := ParseStorageTier("gpu")
	assert.False(t, ok, `ParseStorageTier("gpu") ok = true, want false`)
}
