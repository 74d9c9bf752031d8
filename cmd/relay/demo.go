package main

import (
	"context"
	"errors"
	"io"

	"github.com/ckfrelay/ckfrelay/internal/sim/demo"
)

// runDemo is `relay demo`: the three-data-center run of internal/sim/demo.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := demo.Run(ctx, args, stdout, stderr)
	if errors.Is(err, demo.ErrUsage) {
		return errUsage
	}
	return err
}
