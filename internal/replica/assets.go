package replica

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// The JetStream assets a replica group shares — the records stream
// (EnsureStream), the lease bucket (OpenLeases), the checkpoint store and
// its index (EnsureCheckpoints) — are created by the first replica that
// starts and only opened by the others. An existing asset is the
// operator's as much as the group's (a cap, deny flags, the lease TTL),
// and one replica's configuration is no better a view of it than theirs:
// every replica start used to rewrite them with its own (red-team HA F0:
// two leaders; F5: an operator's cap undone, the group downgraded to one
// copy). What each function checks of an existing asset is its own; the
// shape is shared here.

// openOrCreate returns the asset open finds, or the one create makes when
// there is none, or — when another replica created it in between — the
// one open then finds.
func openOrCreate[T any](ctx context.Context, open, create func(context.Context) (T, error)) (T, error) {
	v, err := open(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
		v, err = create(ctx)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrBucketExists) {
			v, err = open(ctx)
		}
	}
	return v, err
}

// raiseReplicas raises the replica count of the stream configured as have
// (a bucket's is its backing stream, KV_<bucket> or OBJ_<bucket>) to want
// and changes nothing else of its configuration; a count at or above want
// is left alone, so a replica started with fewer never downgrades the
// group. It returns the updated stream, or nil when nothing changed.
func raiseReplicas(ctx context.Context, js jetstream.JetStream, have jetstream.StreamConfig, want int) (jetstream.Stream, error) {
	if have.Replicas >= want {
		return nil, nil
	}
	have.Replicas = want
	return js.UpdateStream(ctx, have)
}

// raiseStreamReplicas is raiseReplicas for the stream named name.
func raiseStreamReplicas(ctx context.Context, js jetstream.JetStream, name string, want int) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	_, err = raiseReplicas(ctx, js, s.CachedInfo().Config, want)
	return err
}
