package producer

import (
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// FaultCategory groups faults by who must act (SPEC §7).
type FaultCategory uint8

// Fault categories.
const (
	// FaultResource: the producer could not reserve resources
	// (ReportResourceFailure); the source may retry.
	FaultResource FaultCategory = iota + 1
	// FaultSourceProtocol: the source broke the event protocol (RejectSource),
	// including an unannounced newer source epoch.
	FaultSourceProtocol
	// FaultProducerInvariant: exact state and filter disagree
	// (FenceAndRebuildProducer); the owner should fence this actor and
	// rebuild the pool.
	FaultProducerInvariant
)

func (c FaultCategory) String() string {
	switch c {
	case FaultResource:
		return "Resource"
	case FaultSourceProtocol:
		return "SourceProtocol"
	case FaultProducerInvariant:
		return "ProducerInvariant"
	}
	return fmt.Sprintf("FaultCategory(%d)", c)
}

// CategoryOf maps a producer-side recovery action to a fault category. ok is
// false for ContinueCapacityOmission (never a fault) and for consumer-lane
// actions, which no producer event can cause.
func CategoryOf(a ckf.RecoveryAction) (c FaultCategory, ok bool) {
	switch a {
	case ckf.ReportResourceFailure:
		return FaultResource, true
	case ckf.RejectSource:
		return FaultSourceProtocol, true
	case ckf.FenceAndRebuildProducer:
		return FaultProducerInvariant, true
	}
	return 0, false
}

// Fault is one lifecycle fault the actor reports on its fault channel. The
// event that caused it applied nothing beyond what Disposition.Commit says.
type Fault struct {
	Member      ckf.Member
	SourceEpoch uint64
	EventID     uint64
	Category    FaultCategory
	Disposition ckf.Disposition
	// Err is the event error, or [ErrUnannouncedSourceEpoch].
	Err error
}

func (f Fault) String() string {
	return fmt.Sprintf("%v fault from worker %d rank %d epoch %d event %d: %v (%v)",
		f.Category, f.Member.WorkerID, f.Member.DPRank, f.SourceEpoch, f.EventID, f.Err, f.Disposition.Action)
}
