// Command relay is ckfrelay's server and its operator tools.
//
//	relay serve [flags]     host pools over HTTP (see README "HTTP API")
//	relay tail [flags]      print a pool's frame stream (HTTP) or a gRPC relay's catalog and selected pools (--grpc) as JSON lines
//	relay query [flags]     follow pools as a router does; answer each request's depth per pool
//	relay demo [flags]      three data centers, a synthetic fleet and a router, in one process
//	relay replay [flags]    replay a Mooncake trace through simulated data centers, scored against exact truth
//
// Run "relay <command> -h" for each command's flags. Each command is one
// small file here that calls the Run of the package that owns it:
// internal/serve, internal/tail, internal/query, internal/sim/demo and
// internal/sim/replay/replaycmd.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errUsage is what a subcommand returns for bad flags (its package's usage
// error translated); the command exits 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program, callable from tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(ctx, args[1:], stdout, stderr)
	case "tail":
		err = runTail(ctx, args[1:], stdout, stderr)
	case "query":
		err = runQuery(ctx, args[1:], stdout, stderr)
	case "demo":
		err = runDemo(ctx, args[1:], stdout, stderr)
	case "replay":
		err = runReplay(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "relay: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err == errUsage {
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: relay <command> [flags]

commands:
  serve   host pools over HTTP: events in, frame streams out
  tail    subscribe to a pool (or, with --grpc, a KvEventRelay server) and print decoded frames as JSON lines
  query   follow pools as a router does; for each request on stdin, the depth each pool holds
  demo    three data centers, a synthetic fleet and a router, in one process
  replay  replay a Mooncake trace through simulated data centers; score routing against exact truth
`)
}
