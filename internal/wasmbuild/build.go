// Package build compiles the consumer guest (wasm/guest) into a WebAssembly
// reactor module, reproducibly: the same Go toolchain and sources give the
// same bytes on any machine. cmd/wasmbuild is its command line; the wasm/host
// tests use it to prove the embedded module is not stale.
package wasmbuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GuestPackage is the import path of the guest module's main package.
const GuestPackage = "github.com/ckfrelay/ckfrelay/wasm/guest"

// EmbeddedPath is where the committed module lives, relative to the module
// root; wasm/host embeds it.
const EmbeddedPath = "wasm/host/ckfconsumer.wasm"

// StampPath records the toolchain and digest of the committed module.
const StampPath = "wasm/host/ckfconsumer.wasm.stamp"

// ErrStale is returned by [Check] when the committed module differs from a
// fresh build.
var ErrStale = errors.New("build: committed wasm module is stale")

// Options controls [Build].
type Options struct {
	// Dir is the module root (where go.mod is); empty means the current directory.
	Dir string
	// Optimize runs `wasm-opt -O2` on the result when it is installed.
	// Optimized output depends on binaryen's version, so the committed
	// module is never optimized (see docs/RATIONALE.md).
	Optimize bool
}

// Result describes one built module.
type Result struct {
	Wasm      []byte
	SHA256    string
	Toolchain string // `go env GOVERSION`
	Optimized bool   // wasm-opt ran
}

// Stamp is the content of [StampPath] for r: toolchain, digest and size.
func (r *Result) Stamp() string {
	return fmt.Sprintf("%s sha256:%s size:%d\n", r.Toolchain, r.SHA256, len(r.Wasm))
}

// Build compiles the guest with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared
// -trimpath -buildvcs=false, with a cleared GOFLAGS and CGO disabled, so only
// the toolchain version and the sources decide the bytes.
func Build(o Options) (*Result, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("build: go toolchain not found: %w", err)
	}
	tmp, err := os.MkdirTemp("", "wasmbuild")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "guest.wasm")
	env := append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=", "GOWASM=")
	ver, err := goCmd(goBin, o.Dir, env, "env", "GOVERSION")
	if err != nil {
		return nil, err
	}
	if _, err := goCmd(goBin, o.Dir, env, "build", "-buildmode=c-shared", "-trimpath", "-buildvcs=false",
		"-o", out, GuestPackage); err != nil {
		return nil, err
	}
	r := &Result{Toolchain: strings.TrimSpace(ver)}
	if o.Optimize {
		if opt, err := exec.LookPath("wasm-opt"); err == nil {
			optOut := filepath.Join(tmp, "guest.opt.wasm")
			cmd := exec.Command(opt, "-O2", "--enable-bulk-memory", "--enable-sign-ext",
				"--enable-nontrapping-float-to-int", "--enable-mutable-globals", out, "-o", optOut)
			if b, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("build: wasm-opt: %v: %s", err, b)
			}
			out, r.Optimized = optOut, true
		}
	}
	if r.Wasm, err = os.ReadFile(out); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(r.Wasm)
	r.SHA256 = hex.EncodeToString(sum[:])
	return r, nil
}

// Check builds the guest unoptimized and compares it with the committed
// module and stamp under dir. It returns an error wrapping [ErrStale] that
// names the command to run when they differ.
func Check(dir string) (*Result, error) {
	r, err := Build(Options{Dir: dir})
	if err != nil {
		return nil, err
	}
	have, err := os.ReadFile(filepath.Join(dir, EmbeddedPath))
	if err != nil {
		return r, fmt.Errorf("%w: %v (run `go run ./cmd/wasmbuild`)", ErrStale, err)
	}
	stamp, _ := os.ReadFile(filepath.Join(dir, StampPath))
	if !bytes.Equal(have, r.Wasm) || string(stamp) != r.Stamp() {
		sum := sha256.Sum256(have)
		return r, fmt.Errorf("%w: committed sha256:%x, fresh build sha256:%s (run `go run ./cmd/wasmbuild` and commit %s and %s)",
			ErrStale, sum, r.SHA256, EmbeddedPath, StampPath)
	}
	return r, nil
}

// Write stores r as the committed module and its stamp under dir.
func Write(dir string, r *Result) error {
	if err := os.WriteFile(filepath.Join(dir, EmbeddedPath), r.Wasm, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, StampPath), []byte(r.Stamp()), 0o644)
}

// ModuleRoot returns the directory of the main module's go.mod.
func ModuleRoot() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	out, err := goCmd(goBin, "", nil, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(out)
	if mod == "" || mod == os.DevNull {
		return "", errors.New("build: not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

func goCmd(goBin, dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build: go %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}
