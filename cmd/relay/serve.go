package main

import (
	"context"
	"errors"
	"io"

	"github.com/ckfrelay/ckfrelay/internal/serve"
)

// runServe is `relay serve`: pools over HTTP (and gRPC) until ctx is done
// (internal/serve).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := serve.Run(ctx, args, stdout, stderr)
	if errors.Is(err, serve.ErrUsage) {
		return errUsage
	}
	return err
}
