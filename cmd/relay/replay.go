package main

import (
	"context"
	"errors"
	"io"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay/replaycmd"
)

// runReplay is `relay replay`: a trace replayed through simulated data
// centers, routing scored against exact truth (internal/sim/replay/replaycmd).
func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := replaycmd.Run(ctx, args, stdout, stderr)
	if errors.Is(err, replaycmd.ErrUsage) {
		return errUsage
	}
	return err
}
