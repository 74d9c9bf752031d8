// Command wasirun runs a WASI (GOOS=wasip1) command module under wazero's
// compiler engine, so `go test` can execute a package's test binary as
// WebAssembly without an external runtime (build it natively first: under
// GOOS=wasip1, `go run` would build it for wasm too):
//
//	go build -o /tmp/wasirun ./internal/cmd/wasirun
//	GOOS=wasip1 GOARCH=wasm go test -exec /tmp/wasirun ./ckf
//	GOOS=wasip1 GOARCH=wasm go test -exec /tmp/wasirun -run '^$' -bench Kernels ./ckf
//
// It mounts the host's root directory, passes the environment through (the
// Go wasip1 runtime takes its working directory from PWD) and exits with the
// module's exit code. Compiled modules are cached under the user's cache
// directory. Its test runs the ckf and consumer test binaries this way, which
// is how the hand-written wasm kernels (ckf/*_wasm.s) are tested in CI.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasirun module.wasm [args...]")
		os.Exit(2)
	}
	code, err := run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasirun:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// run executes the command module at args[0] with argv args (args[0] is
// also the program name) and returns its exit code. An error means the
// module could not be loaded or trapped.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) (int, error) {
	bin, err := os.ReadFile(args[0])
	if err != nil {
		return 0, err
	}
	cfg := wazero.NewRuntimeConfigCompiler()
	if dir, err := os.UserCacheDir(); err == nil {
		if cache, err := wazero.NewCompilationCacheWithDir(filepath.Join(dir, "ckfrelay-wasirun")); err == nil {
			cfg = cfg.WithCompilationCache(cache)
		}
	}
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	mc := wazero.NewModuleConfig().
		WithArgs(args...).
		WithStdout(stdout).WithStderr(stderr).WithStdin(os.Stdin).
		WithFSConfig(wazero.NewFSConfig().WithDirMount("/", "/")).
		WithSysWalltime().WithSysNanotime().WithSysNanosleep().WithRandSource(rand.Reader)
	for _, kv := range env {
		for i := 0; i < len(kv); i++ {
			if kv[i] == '=' {
				mc = mc.WithEnv(kv[:i], kv[i+1:])
				break
			}
		}
	}
	_, err = rt.InstantiateWithConfig(ctx, bin, mc)
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		return int(exit.ExitCode()), nil
	}
	if err != nil {
		return 0, err
	}
	return 0, nil
}
