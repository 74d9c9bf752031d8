package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/ckfrelay/ckfrelay/internal/query"
)

// runQuery is `relay query`: the router in a box (internal/query).
func runQuery(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	err := query.Run(ctx, args, os.Stdin, stdout, stderr)
	if errors.Is(err, query.ErrUsage) {
		return errUsage
	}
	return err
}
