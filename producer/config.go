package producer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Defaults of SPEC §7.
const (
	DefaultMailboxCapacity         = 256
	DefaultPayloadPermits          = 65_536
	DefaultPublicationDelay        = time.Millisecond
	DefaultFaultCapacity           = 16
	DefaultSubscriberBuffer        = 64
	DefaultRecoveryQuietWindow     = 5 * time.Millisecond
	DefaultInitialRecoveryDeadline = 30 * time.Second
	DefaultMaxIdleSourceEpochs     = 16_384
)

// Config tunes one pool's actor and recovery target. The zero value is not
// valid; start from [DefaultConfig].
type Config struct {
	// MailboxCapacity bounds the commands queued for the actor, > 0. A full
	// mailbox back-pressures callers; nothing is dropped. The actor takes
	// the whole queue at a wake-up, so up to twice as many commands can be
	// admitted and not yet run (the payload permits bound their blocks).
	MailboxCapacity int
	// PayloadPermits bounds the blocks admitted but not yet applied, > 0. An
	// event weighs its block count (min 1, capped at PayloadPermits).
	PayloadPermits int64
	// PublicationDelay is how long a dirty tail below the cadence may wait
	// before the timer publishes it, > 0.
	PublicationDelay time.Duration
	// FaultCapacity bounds the fault channel, > 0. A full channel blocks the
	// actor until the owner reads or fences.
	FaultCapacity int
	// SubscriberBuffer bounds the deltas buffered for a subscriber, > 0,
	// counting those the actor holds for its next hand-over (it hands the
	// deltas of batch admissions over in groups of up to a quarter of it,
	// at most 256). A subscriber that overflows it is closed with
	// [ErrLagged].
	SubscriberBuffer int
	// RecoveryQuietWindow coalesces rank replacements arriving within it
	// into one rebuild, > 0.
	RecoveryQuietWindow time.Duration
	// InitialRecoveryDeadline bounds how long the initial recovery wave waits
	// for every expected rank, > 0.
	InitialRecoveryDeadline time.Duration
	// MaxIdleSourceEpochs bounds the source-epoch records kept for members
	// that hold nothing, > 0. Beyond it the least recently idle record is
	// pruned; that member's next event sets its epoch afresh (SPEC §7).
	MaxIdleSourceEpochs int
	// Diagnostics enables the pull-only counters of [Handle.Diagnostics].
	// When false the hot path does not read the clock or touch atomics.
	Diagnostics bool
	// Logger receives rate-limited warnings; nil means slog.Default().
	Logger *slog.Logger
	// Journal, when set, receives every command that changed the exact
	// state, in order (see [Journal]); nil journals nothing.
	Journal Journal
}

// DefaultConfig returns the defaults of SPEC §7.
func DefaultConfig() Config {
	return Config{
		MailboxCapacity:         DefaultMailboxCapacity,
		PayloadPermits:          DefaultPayloadPermits,
		PublicationDelay:        DefaultPublicationDelay,
		FaultCapacity:           DefaultFaultCapacity,
		SubscriberBuffer:        DefaultSubscriberBuffer,
		RecoveryQuietWindow:     DefaultRecoveryQuietWindow,
		InitialRecoveryDeadline: DefaultInitialRecoveryDeadline,
		MaxIdleSourceEpochs:     DefaultMaxIdleSourceEpochs,
	}
}

// Validate checks the fields in declaration order and returns the first
// failure, wrapped around [ErrInvalidConfig].
func (c Config) Validate() error {
	switch {
	case c.MailboxCapacity <= 0:
		return configError("mailbox_capacity %d must be > 0", c.MailboxCapacity)
	case c.PayloadPermits <= 0:
		return configError("payload_permits %d must be > 0", c.PayloadPermits)
	case c.PublicationDelay <= 0:
		return configError("publication_delay %v must be > 0", c.PublicationDelay)
	case c.FaultCapacity <= 0:
		return configError("fault_capacity %d must be > 0", c.FaultCapacity)
	case c.SubscriberBuffer <= 0:
		return configError("subscriber_buffer %d must be > 0", c.SubscriberBuffer)
	case c.RecoveryQuietWindow <= 0:
		return configError("recovery_quiet_window %v must be > 0", c.RecoveryQuietWindow)
	case c.InitialRecoveryDeadline <= 0:
		return configError("initial_recovery_deadline %v must be > 0", c.InitialRecoveryDeadline)
	case c.MaxIdleSourceEpochs <= 0:
		return configError("max_idle_source_epochs %d must be > 0", c.MaxIdleSourceEpochs)
	}
	return nil
}

func configError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// Scope names the stream a pool's actor publishes: the pool and the
// producer's incarnation and layout generation. With the pool's format it
// forms the [ckf.ProducerIdentity].
type Scope struct {
	Pool                ckf.PoolID
	ProducerIncarnation uint64
	LayoutGeneration    uint64
}

// Identity returns the producer identity of the scope for format f.
func (s Scope) Identity(f ckf.Format) ckf.ProducerIdentity {
	return ckf.ProducerIdentity{Pool: s.Pool, ProducerIncarnation: s.ProducerIncarnation,
		LayoutGeneration: s.LayoutGeneration, Format: f}
}
