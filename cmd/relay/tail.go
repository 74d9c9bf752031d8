package main

import (
	"context"
	"errors"
	"io"

	"github.com/ckfrelay/ckfrelay/internal/tail"
)

// runTail is `relay tail`: a pool's frame stream as JSON lines (internal/tail).
func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := tail.Run(ctx, args, stdout, stderr)
	if errors.Is(err, tail.ErrUsage) {
		return errUsage
	}
	return err
}
