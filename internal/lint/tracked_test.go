package lint

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxTrackedBytes is the size above which a tracked file must be on
// largeFiles: big files in git are almost always build output or data that
// belongs elsewhere.
const maxTrackedBytes = 1 << 20

// largeFiles are the tracked files allowed above maxTrackedBytes, each with
// the reason it is committed.
var largeFiles = map[string]string{
	"wasm/host/ckfconsumer.wasm":                            "the consumer module wasm/host embeds (make wasm rebuilds it; TestEmbeddedModule_UpToDate checks it)",
	"internal/sim/replay/testdata/mooncake_synthetic.jsonl": "the embedded Mooncake trace the demo and replay run on by default",
}

// binaryMagic are the leading bytes of executables and object files for
// the platforms Go builds for.
var binaryMagic = []struct {
	name  string
	magic []byte
}{
	{"ELF", []byte("\x7fELF")},
	{"Mach-O", []byte{0xfe, 0xed, 0xfa, 0xce}},
	{"Mach-O", []byte{0xfe, 0xed, 0xfa, 0xcf}},
	{"Mach-O", []byte{0xce, 0xfa, 0xed, 0xfe}},
	{"Mach-O", []byte{0xcf, 0xfa, 0xed, 0xfe}},
	{"Mach-O universal", []byte{0xca, 0xfe, 0xba, 0xbe}},
	{"PE", []byte("MZ")},
}

// trackedFileProblems lists what must not be in the git repository at dir:
// tracked files that .gitignore matches, executables, and files over
// maxTrackedBytes that are not on allowed. Each message names the fix.
func trackedFileProblems(dir string, allowed map[string]string) ([]string, error) {
	git := func(args ...string) ([]string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.FieldsFunc(string(out), func(r rune) bool { return r == 0 }), nil
	}
	var problems []string
	ignored, err := git("ls-files", "-z", "--cached", "--ignored", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	for _, f := range ignored {
		problems = append(problems, fmt.Sprintf("%s is tracked but .gitignore matches it: `git rm --cached %s` (or fix .gitignore if it should be committed)", f, f))
	}
	files, err := git("ls-files", "-z", "--cached")
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		info, err := os.Lstat(filepath.Join(dir, f))
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		if kind := executableKind(filepath.Join(dir, f)); kind != "" {
			problems = append(problems, fmt.Sprintf("%s is a tracked %s binary: build output never goes into git; `git rm --cached %s` and add it to .gitignore", f, kind, f))
			continue
		}
		if _, ok := allowed[f]; !ok && info.Size() > maxTrackedBytes {
			problems = append(problems, fmt.Sprintf("%s is %d bytes, over the %d-byte limit for tracked files: remove it, or add it with its reason to largeFiles in internal/lint/tracked_test.go", f, info.Size(), maxTrackedBytes))
		}
	}
	return problems, nil
}

// executableKind names the binary format of the file at path, or "".
func executableKind(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 4)
	n, _ := io.ReadFull(f, head)
	for _, m := range binaryMagic {
		if bytes.HasPrefix(head[:n], m.magic) {
			return m.name
		}
	}
	return ""
}

func TestTrackedFiles_NoBuildOutput(t *testing.T) {
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout: the tracked-file rule needs git's index")
	}
	problems, err := trackedFileProblems(root, largeFiles)
	require.NoError(t, err)
	for _, p := range problems {
		t.Error(p)
	}
	for f := range largeFiles {
		_, err := os.Stat(filepath.Join(root, f))
		assert.NoError(t, err, "largeFiles allows %s, which does not exist: drop the allowance", f)
	}
}

// The rule catches each kind of build output in a scratch repository, so a
// re-added binary fails the lint.
func TestTrackedFiles_CatchesEachKind(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not found (install git)")
	}
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	write := func(name string, data []byte) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	run("init", "-q")
	write(".gitignore", []byte("/relay\n*.log\n"))
	write("relay", append([]byte("\x7fELF"), make([]byte, 64)...))
	write("tool.exe", []byte("MZ\x90\x00"))
	write("notes.log", []byte("scratch\n"))
	write("big.bin", make([]byte, maxTrackedBytes+1))
	write("allowed.bin", make([]byte, maxTrackedBytes+1))
	write("ok.go", []byte("package ok\n"))
	run("add", "-f", ".")

	problems, err := trackedFileProblems(dir, map[string]string{"allowed.bin": "test"})
	require.NoError(t, err)
	joined := strings.Join(problems, "\n")
	for _, want := range []string{
		"relay is tracked but .gitignore matches it",
		"relay is a tracked ELF binary",
		"tool.exe is a tracked PE binary",
		"notes.log is tracked but .gitignore matches it",
		"big.bin is 1048577 bytes",
	} {
		assert.Contains(t, joined, want)
	}
	assert.Len(t, problems, 5, joined)
	assert.False(t, slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, "allowed.bin") || strings.HasPrefix(p, "ok.go") }), joined)
}
