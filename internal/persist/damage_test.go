//go:build unix

package persist

import (
	"bufio"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpen_HeldDirectoryIsErrLocked: a data dir another process holds (this
// test binary re-run as a helper that opens the store and waits) fails with
// ErrLocked naming the directory.
func TestOpen_HeldDirectoryIsErrLocked(t *testing.T) {
	if dir := os.Getenv("CKFRELAY_PERSIST_HOLD"); dir != "" {
		st, err := Open(dir)
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		_ = st.Close()
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpen_HeldDirectoryIsErrLocked$")
	cmd.Env = append(os.Environ(), "CKFRELAY_PERSIST_HOLD="+dir)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "held\n", line)

	_, err = Open(dir)
	require.ErrorIs(t, err, ErrLocked)
	assert.Contains(t, err.Error(), "another relay holds the data directory "+dir)
}
