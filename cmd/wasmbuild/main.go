// Command wasmbuild builds the consumer WebAssembly module from wasm/guest
// (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared, trimmed, reproducible) and
// prints its size and sha256.
//
//	go run ./cmd/wasmbuild            # rebuild the embedded module and its stamp
//	go run ./cmd/wasmbuild -check     # exit 1 when the committed module is stale
//	go run ./cmd/wasmbuild -opt -o x.wasm   # wasm-opt -O2 if installed, to another file
//
// The committed module (wasm/host/ckfconsumer.wasm) is always the plain Go
// build, so any machine with the same Go toolchain reproduces it byte for
// byte; -opt is for distributing a smaller file (≈ 4%) and is refused for the
// embedded path.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ckfrelay/ckfrelay/internal/wasmbuild"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wasmbuild", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output file (default: the embedded module "+wasmbuild.EmbeddedPath+" and its stamp)")
	opt := fs.Bool("opt", false, "run wasm-opt -O2 when installed (not allowed for the embedded module)")
	check := fs.Bool("check", false, "build and compare with the committed module; exit 1 when stale")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	root, err := wasmbuild.ModuleRoot()
	if err != nil {
		fmt.Fprintln(stderr, "wasmbuild:", err)
		return 1
	}
	if *check {
		r, err := wasmbuild.Check(root)
		if err != nil {
			fmt.Fprintln(stderr, "wasmbuild:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s up to date: %d bytes sha256:%s (%s)\n", wasmbuild.EmbeddedPath, len(r.Wasm), r.SHA256, r.Toolchain)
		return 0
	}
	if *out == "" && *opt {
		fmt.Fprintln(stderr, "wasmbuild: -opt needs -o: the embedded module must stay reproducible without binaryen")
		return 2
	}
	r, err := wasmbuild.Build(wasmbuild.Options{Dir: root, Optimize: *opt})
	if err != nil {
		fmt.Fprintln(stderr, "wasmbuild:", err)
		return 1
	}
	if *opt && !r.Optimized {
		fmt.Fprintln(stderr, "wasmbuild: wasm-opt not installed; writing the unoptimized module")
	}
	dest := *out
	if dest == "" {
		err = wasmbuild.Write(root, r)
		dest = filepath.Join(root, wasmbuild.EmbeddedPath)
	} else {
		err = os.WriteFile(dest, r.Wasm, 0o644)
	}
	if err != nil {
		fmt.Fprintln(stderr, "wasmbuild:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %d bytes sha256:%s (%s, optimized=%v)\n", dest, len(r.Wasm), r.SHA256, r.Toolchain, r.Optimized)
	return 0
}
