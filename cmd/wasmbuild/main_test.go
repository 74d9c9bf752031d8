package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
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
			assert.Equal(t, tc.want, run(tc.args, &out, &errb), "status")
			assert.Contains(t, errb.String(), tc.msg, "stderr")
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
	require.Zero(t, run([]string{"-o", dst}, &out, &errb), "status; stderr: %s", errb.String())
	b, err := os.ReadFile(dst)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	assert.True(t, bytes.HasPrefix(b, []byte("\x00asm")), "not a wasm module: % x", b[:min(len(b), 8)])
	assert.Contains(t, out.String(), hex.EncodeToString(sum[:]), "the module's sha256 is printed")
}
