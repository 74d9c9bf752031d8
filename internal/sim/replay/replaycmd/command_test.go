package replaycmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzParseRTTMatrix: any --rtt-matrix text parses or fails without
// panicking, and a parsed matrix is rows of the fields given.
func FuzzParseRTTMatrix(f *testing.F) {
	for _, s := range []string{"0,20ms;20ms,0", "0", "", ";", "1h,,2s", "0,-1ms;1ms,0", "9999999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseRTTMatrix(s)
		if err != nil {
			return
		}
		require.Len(t, m, strings.Count(s, ";")+1)
	})
}

// A progress bar is drawn only on a terminal: a buffer or a plain file
// keeps the once-a-second lines.
func TestNewProgress_OnlyOnATerminal(t *testing.T) {
	var buf bytes.Buffer
	assert.Nil(t, newProgress(&buf, "x", 10))
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer f.Close()
	assert.Nil(t, newProgress(f, "x", 10))
	newProgress(f, "x", 10).finish() // nil-safe
}
