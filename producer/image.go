package producer

import (
	"context"
	"fmt"
	"slices"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Image is the whole state of a pool's actor between two commands (issue
// #34's checkpoint): the pool's image ([ckf.PoolImage]: words, generator
// state, counters, exact state), the source-epoch records with the order of
// the idle ones (which record is pruned next), the publisher's last
// sequence, and the journal position it includes. An actor started from it
// ([StartImage]) answers every later command exactly as the original does.
// Unlike [ExactState], which re-creates the lineages through replacements
// (and so different words), it restores the filter as it is.
type Image struct {
	Pool ckf.PoolImage
	// Epochs: the records of members that are not idle, by (worker, rank),
	// then the idle ones, least recently idle first.
	Epochs       []EpochImage
	EpochsPruned uint64 // idle records pruned so far
	Sequence     uint64 // the publisher's last sequence
	// JournalPosition is [Journal.Position] when the image was taken: the
	// journal of an actor started from the image must go on from there.
	JournalPosition uint64
}

// EpochImage is one member's source-epoch record.
type EpochImage struct {
	Member ckf.Member
	Epoch  uint64
	Idle   bool
}

// ExportImage returns the actor's image, taken between two commands: every
// command sent before it has been applied. It costs the actor a copy of the
// words and of the lineages, O(tracked blocks) (the caller's goroutine
// sorts them), so a replica that is not on the admission path (a standby)
// is the one to take it.
func (h Handle) ExportImage(ctx context.Context) (Image, error) {
	r, err := h.a.request(ctx, command{kind: cmdImage}, false)
	if err != nil {
		return Image{}, err
	}
	r.image.Pool.SortLineages() // here, not on the actor
	return *r.image, nil
}

// image runs on the actor goroutine.
func (a *actor) image() *Image {
	img := &Image{Pool: a.pool.Image(), EpochsPruned: a.epochs.pruned, Sequence: a.pub.LastSequence()}
	if a.cfg.Journal != nil {
		img.JournalPosition = a.cfg.Journal.Position()
	}
	for m, r := range a.epochs.rec {
		if !r.isIdle() {
			img.Epochs = append(img.Epochs, EpochImage{Member: m, Epoch: r.epoch})
		}
	}
	slices.SortFunc(img.Epochs, func(x, y EpochImage) int { return x.Member.Compare(y.Member) })
	a.epochs.idleRecords(func(r *epochRecord) {
		img.Epochs = append(img.Epochs, EpochImage{Member: r.member, Epoch: r.epoch, Idle: true})
	})
	return img
}

// StartImage restores the pool of configuration poolCfg from img.Pool
// ([ckf.RestorePool]) and starts its actor as [Start] does, with the image's
// source-epoch records, idle order and publisher sequence. A record named
// twice, or an epoch above [MaxSourceEpoch], is refused with an error
// wrapping [ckf.ErrInvalidImage]; more idle records than
// [Config.MaxIdleSourceEpochs] are pruned, least recently idle first, as
// the actor would have. cfg.Journal must go on from img.JournalPosition.
func StartImage(poolCfg ckf.Config, img *Image, scope Scope, cfg Config) (Handle, <-chan Fault, error) {
	if err := cfg.Validate(); err != nil {
		return Handle{}, nil, err
	}
	pool, err := ckf.RestorePool(poolCfg, &img.Pool)
	if err != nil {
		return Handle{}, nil, err
	}
	a, err := newActor(pool, scope, cfg, img.Sequence)
	if err != nil {
		return Handle{}, nil, err
	}
	s := a.epochs
	for _, e := range img.Epochs {
		switch {
		case s.rec[e.Member] != nil:
			return Handle{}, nil, fmt.Errorf("%w: two source-epoch records of worker %d rank %d", ckf.ErrInvalidImage, e.Member.WorkerID, e.Member.DPRank)
		case e.Epoch > MaxSourceEpoch:
			return Handle{}, nil, fmt.Errorf("%w: source epoch %d above %d", ckf.ErrInvalidImage, e.Epoch, uint64(MaxSourceEpoch))
		}
		r := &epochRecord{member: e.Member, epoch: e.Epoch}
		s.rec[e.Member] = r
		if e.Idle {
			s.pushIdle(r)
		}
	}
	s.pruned = img.EpochsPruned
	s.pruneIdle()
	go a.run()
	return Handle{a: a}, a.faults, nil
}
