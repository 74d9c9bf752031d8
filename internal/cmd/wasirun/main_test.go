package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGuestKernels builds the ckf and consumer tests for GOOS=wasip1
// GOARCH=wasm and runs them under wazero through run, so the hand-written
// WebAssembly kernels (ckf/kernels_wasm.s) and the search that calls them
// are tested as the module runs them, against the pure-Go reference and
// zeebo/xxh3 (kernels_test.go, search tests), the multi-group probe and
// search against their Go references at every row width (rows_test.go,
// TestSearch_GroupKernelEqualsGo) and the format-group property tests.
func TestGuestKernels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two wasm test binaries (≈ 30 s)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain on PATH")
	}
	root, err := filepath.Abs("../../..")
	require.NoError(t, err)
	// want: a line only the intended tests print (ckf's names the GOARCH).
	for _, pkg := range []struct {
		dir, run string
		want     []string
	}{
		{"ckf", "Kernel|HashBlocks|Chain|LaneRow|RowHits|GroupHits|AddGroup|XXH3|Sequence|LocalBlockHash|Address", []string{"GOARCH=wasm",
			"--- PASS: TestRowHits_MatchesAddressAndContains", "--- PASS: TestGroupHits_MatchesRowHits", "--- PASS: FuzzGroupHits",
			"--- PASS: TestKernel_SearchGroupsRefusesBrokenContract"}},
		{"consumer", "Search|Query|Contains|MixedFormats|OneGroup|FormatPins", []string{"--- PASS: TestSearch_KernelEqualsGo",
			"--- PASS: TestSearch_GroupKernelEqualsGo", "--- PASS: TestConsumer_OneGroupRunsTodaysPath",
			"--- PASS: TestConsumer_MixedFormats_property", "--- PASS: TestSearch_GroupProbesEqualReadingEveryGroup",
			"--- PASS: TestSearch_GroupProbeReadsTheNeededGroups"}},
	} {
		t.Run(pkg.dir, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), pkg.dir+".wasm")
			build := exec.Command(goBin, "test", "-c", "-o", bin, "./"+pkg.dir)
			build.Dir = root
			build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			out, err := build.CombinedOutput()
			require.NoError(t, err, "build: %s", out)

			var stdout, stderr bytes.Buffer
			env := append(os.Environ(), "PWD="+filepath.Join(root, pkg.dir))
			code, err := run(context.Background(), []string{bin, "-test.run", pkg.run, "-test.v"}, env, &stdout, &stderr)
			require.NoError(t, err, "stderr: %s", stderr.String())
			require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			for _, w := range pkg.want {
				require.Contains(t, stdout.String(), w, "the intended tests did not run in the guest")
			}
			require.NotContains(t, stdout.String(), "--- FAIL")
		})
	}
}
