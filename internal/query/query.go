// Package query is the `relay query` command, the router in a box: it
// follows pools as a router does (client.Router over a consumer, the
// WebAssembly module by default), over HTTP (pools by name) or gRPC (data
// centers by dc_id, pools chosen by the catalog selection), and answers, for each request read from
// stdin as a JSON line, how many leading blocks each pool's data center
// holds and which holds the most.
package query

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/tail"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// ErrUsage is returned when the flags are invalid; the message has been
// written to stderr already, and the command exits 2.
var ErrUsage = errors.New("query: usage")

// ErrNotReady is returned when some pool's lane is not ready within --wait.
var ErrNotReady = errors.New("query: pools not ready")

// maxLineBytes bounds one request line: 64 MiB, the consumer's input cap
// (consumer.MaxInputBytes) — a longer line could not be queried anyway.
const maxLineBytes = consumer.MaxInputBytes

// poolFlags collects repeated --pool values.
type poolFlags []string

func (p *poolFlags) String() string     { return strings.Join(*p, ",") }
func (p *poolFlags) Set(v string) error { *p = append(*p, v); return nil }

// dcFlags collects repeated --dc values.
type dcFlags []uint64

func (d *dcFlags) String() string { return fmt.Sprint([]uint64(*d)) }
func (d *dcFlags) Set(v string) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return fmt.Errorf("want a decimal dc_id: %w", err)
	}
	if slices.Contains(*d, n) {
		return fmt.Errorf("dc_id %d given twice", n)
	}
	*d = append(*d, n)
	return nil
}

// Run is `relay query`: it parses args, follows the pools until every lane
// is ready (or --wait passes: ErrNotReady), then answers each stdin line on
// stdout until stdin ends or ctx is done.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("query", flag.ContinueOnError)
	fs.SetOutput(stderr)
	relay := fs.String("relay", "http://127.0.0.1:7878", "relay base URL of the pools given without @URL")
	var pools poolFlags
	fs.Var(&pools, "pool", "pool to follow: NAME (on --relay) or NAME@URL (on another relay); repeatable, in answer order")
	var grpcAddrs poolFlags
	fs.Var(&grpcAddrs, "grpc", "follow the data centers of a KvEventRelay gRPC server at HOST:PORT instead of --pool (repeatable); each is labelled by its dc_id")
	var dcs dcFlags
	fs.Var(&dcs, "dc", "with --grpc: follow this data center (dc_id; repeatable, in answer order; default every data center a pool is selected in, by dc_id)")
	sel := tail.AddSelectionFlags(fs)
	token := fs.String("auth-token", "", "bearer token")
	caFile := fs.String("ca-file", "", "PEM file of the CA that signed the relays' certificates (for https:// relays, or TLS gRPC relays, under a private CA; default: the system's roots)")
	impl := fs.String("impl", "wasm", "consumer: wasm (the WebAssembly module under wazero) or native (the Go consumer)")
	consumerID := tail.ConsumerFlag(fs)
	blockSize := fs.Int("block-size", 0, "token block size of every pool (0: each pool's catalog block_size)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for every pool's lane to be ready")
	if err := fs.Parse(args); err != nil {
		return ErrUsage
	}
	if (len(pools) == 0) == (len(grpcAddrs) == 0) || fs.NArg() > 0 || (*impl != "wasm" && *impl != "native") || *blockSize < 0 || *wait <= 0 {
		fmt.Fprintln(stderr, "query: at least one --pool or --grpc (not both), --impl wasm or native, --block-size ≥ 0, --wait > 0 and no arguments are required")
		return ErrUsage
	}
	if len(grpcAddrs) == 0 {
		var stray []string
		fs.Visit(func(f *flag.Flag) {
			if slices.Contains([]string{"dc", "model", "namespace", "role", "domain"}, f.Name) {
				stray = append(stray, "--"+f.Name)
			}
		})
		if len(stray) > 0 {
			fmt.Fprintf(stderr, "query: %s select gRPC catalog pools: they go with --grpc\n", strings.Join(stray, ", "))
			return ErrUsage
		}
	} else if _, _, _, err := sel.Selection(); err != nil {
		fmt.Fprintln(stderr, "query:", err)
		return ErrUsage
	}
	hc := http.DefaultClient
	if *caFile != "" && len(grpcAddrs) == 0 {
		var err error
		if hc, err = tail.CAClient(*caFile); err != nil {
			return err
		}
	}
	var set *poolSet
	var err error
	if len(grpcAddrs) > 0 {
		set, err = resolveGRPC(ctx, grpcAddrs, dcs, sel, *token, *caFile, *blockSize)
	} else {
		set, err = resolve(ctx, hc, *relay, pools, *token, *blockSize)
	}
	if err != nil {
		return err
	}
	*consumerID = tail.ConsumerID(*consumerID)
	m := set.manifest(*consumerID)
	var lanes client.Lanes
	if *impl == "native" {
		n, err := client.NewNative(m)
		if err != nil {
			return err
		}
		lanes = n
	} else {
		rt, err := host.NewRuntime(ctx, host.NewConfig())
		if err != nil {
			return err
		}
		defer rt.Close(context.Background())
		in, err := rt.NewInstance(ctx, m)
		if err != nil {
			return err
		}
		defer in.Close()
		lanes = in
	}
	r, err := client.New(set.config(*token, *consumerID, hc), lanes)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	if err := set.waitReady(ctx, r, *wait); err != nil {
		return err
	}
	return answerLines(stdin, stdout, func(line []byte) any { return set.answer(r, line) })
}

// answerLines writes one JSON line for each line of in.
func answerLines(in io.Reader, out io.Writer, answer func(line []byte) any) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		if err := enc.Encode(answer(line)); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("query: stdin: a request line over %d bytes (the consumer's input limit)", maxLineBytes)
		}
		return fmt.Errorf("query: stdin: %w", err)
	}
	return nil
}
