package producer

import (
	"sync/atomic"
	"time"
)

// Diagnostics are the actor's optional counters ([Config.Diagnostics]).
// Durations are in nanoseconds.
type Diagnostics struct {
	// MailboxWaitNanos sums how long callers waited to enqueue (payload
	// permits plus mailbox space); MailboxMaxWaitNanos is the longest wait.
	MailboxWaitNanos    uint64
	MailboxMaxWaitNanos uint64
	// Publications counts deltas the sink accepted.
	Publications uint64
	// UnchangedPublications counts publication points that produced no delta
	// (nothing net-changed, or no subscriber).
	UnchangedPublications uint64
	// DegradedResets counts ResetRank calls marked degraded.
	DegradedResets uint64
	// Rebuilds counts ReplaceRanks rebuilds; RebuildNanos sums their time and
	// RebuildMaxNanos is the longest.
	Rebuilds        uint64
	RebuildNanos    uint64
	RebuildMaxNanos uint64
	// MailboxTakes counts the actor's wake-ups that took queued commands;
	// MailboxTaken counts the commands they took (taken / takes is the
	// batch a wake-up runs).
	MailboxTakes uint64
	MailboxTaken uint64
}

// diagnostics holds the live counters. A nil *diagnostics is the disabled
// state: every caller checks for nil first, so a disabled actor pays one
// predictable branch and never reads the clock.
type diagnostics struct {
	mailboxWait, mailboxMaxWait atomic.Uint64
	publications, unchanged     atomic.Uint64
	degradedResets              atomic.Uint64
	rebuilds, rebuildNanos      atomic.Uint64
	rebuildMax                  atomic.Uint64
	takes, taken                atomic.Uint64
}

func storeMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

func sinceNanos(t time.Time) uint64 { return uint64(max(0, time.Since(t))) }

func (d *diagnostics) mailboxWaited(start time.Time) {
	n := sinceNanos(start)
	d.mailboxWait.Add(n)
	storeMax(&d.mailboxMaxWait, n)
}

func (d *diagnostics) rebuilt(start time.Time) {
	n := sinceNanos(start)
	d.rebuilds.Add(1)
	d.rebuildNanos.Add(n)
	storeMax(&d.rebuildMax, n)
}

func (d *diagnostics) snapshot() Diagnostics {
	return Diagnostics{
		MailboxWaitNanos:      d.mailboxWait.Load(),
		MailboxMaxWaitNanos:   d.mailboxMaxWait.Load(),
		Publications:          d.publications.Load(),
		UnchangedPublications: d.unchanged.Load(),
		DegradedResets:        d.degradedResets.Load(),
		Rebuilds:              d.rebuilds.Load(),
		RebuildNanos:          d.rebuildNanos.Load(),
		RebuildMaxNanos:       d.rebuildMax.Load(),
		MailboxTakes:          d.takes.Load(),
		MailboxTaken:          d.taken.Load(),
	}
}
