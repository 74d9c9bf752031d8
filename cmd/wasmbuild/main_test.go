package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun_Flags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int
		msg  string
	}{
		{"opt without -o", []string{"-opt"}, 2, "-opt needs -o"},
		{"unknown flag", []string{"-nope"}, 2, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(tc.args, &out, &errb); got != tc.want || !strings.Contains(errb.String(), tc.msg) {
				t.Errorf("got status %d, stderr %q; want %d containing %q", got, errb.String(), tc.want, tc.msg)
			}
		})
	}
}

// TestRun_BuildsToFile builds the guest into a temporary file and checks the
// printed size and digest describe that file.
func TestRun_BuildsToFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the guest (≈ 10 s)")
	}
	dst := filepath.Join(t.TempDir(), "m.wasm")
	var out, errb bytes.Buffer
	if got := run([]string{"-o", dst}, &out, &errb); got != 0 {
		t.Fatalf("status %d: %s", got, errb.String())
	}
	b, err := os.ReadFile(dst)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	if !bytes.HasPrefix(b, []byte("\x00asm")) || !strings.Contains(out.String(), hex.EncodeToString(sum[:])) {
		t.Errorf("got %d bytes and output %q; want a wasm module whose sha256 is printed", len(b), out.String())
	}
}
