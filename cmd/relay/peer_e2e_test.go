//go:build unix

package main

// Black-box regressions for hostile HTTP peers and a damaged or shared data
// directory, against the real relay binary.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawExchange writes req on a fresh connection to addr, half-closes it when
// fin is set, and returns the response's status code and whether it says
// Connection: close.
func rawExchange(t *testing.T, addr, req string, fin bool) (int, bool) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	if fin {
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Close
}

// TestE2E_BrokenBodiesAreClientErrors: a malformed chunked body and a body
// cut by the peer's FIN are the client's fault (400, connection closed), not
// 500 internal.
func TestE2E_BrokenBodiesAreClientErrors(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=4096")
	head := "POST /v1/pools/p/events?source_epoch=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	cases := []struct {
		name, req string
		fin       bool
	}{
		{"malformed chunk size", head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n[]\r\n0\r\n\r\n", false},
		{"chunk without its CRLF", head + "Transfer-Encoding: chunked\r\n\r\n2\r\n[]xx0\r\n\r\n", false},
		{"chunked body cut by FIN", head + "Transfer-Encoding: chunked\r\n\r\n10\r\n[{\"worker", true},
		{"Content-Length body cut by FIN", head + "Content-Length: 100\r\n\r\n[{\"worker_id\": 1", true},
	}
	for _, c := range cases {
		code, closed := rawExchange(t, rl.addr, c.req, c.fin)
		assert.Equal(t, http.StatusBadRequest, code, c.name)
		assert.True(t, closed, "%s: Connection: close", c.name)
	}
	assert.Zero(t, metricValue(t, rl.base, `ckfrelay_requests_rejected_total{code="internal"}`))
	assert.Equal(t, float64(len(cases)), metricValue(t, rl.base, `ckfrelay_requests_rejected_total{code="bad_request"}`))
}

// TestE2E_SecondRelayOnTheDataDirSaysSo: a second relay on a data dir in
// use exits 1 naming the directory and the reason, not EAGAIN.
func TestE2E_SecondRelayOnTheDataDirSaysSo(t *testing.T) {
	dir := t.TempDir()
	startRelay(t, "--listen", "127.0.0.1:0", "--data-dir", dir, "--pool", "p:dc=1,expected=4096")
	cmd := exec.Command(relayBinary(t), "serve", "--listen", "127.0.0.1:0", "--data-dir", dir, "--pool", "p:dc=1,expected=4096")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Contains(t, string(out), "another relay holds the data directory "+dir)
	assert.NotContains(t, string(out), "resource temporarily unavailable")
	_, statErr := os.Stat(dir)
	require.NoError(t, statErr)
}

// newestWAL returns the path of the data dir's newest Pebble write-ahead
// log (NNNNNN.log).
func newestWAL(t *testing.T, dir string) string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs, "no write-ahead log in %s", dir)
	slices.Sort(logs)
	return logs[len(logs)-1]
}

// TestE2E_DamagedWALIsNotSilent: the newest write-ahead log deleted,
// truncated or with bytes flipped loses journalled commands; the relay must
// say so (log, catalog recovery "partial" with the count lost) and start the
// pool degraded — every recovered rank reset — so no stale block, whose
// Removed may be among the lost, is advertised. An intact restart stays
// "complete" with every block.
func TestE2E_DamagedWALIsNotSilent(t *testing.T) {
	damage := map[string]func(t *testing.T, wal string){
		"intact": func(*testing.T, string) {},
		"deleted": func(t *testing.T, wal string) {
			require.NoError(t, os.Remove(wal))
		},
		"truncated": func(t *testing.T, wal string) {
			fi, err := os.Stat(wal)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(wal, fi.Size()/2))
		},
		"flipped": func(t *testing.T, wal string) {
			b, err := os.ReadFile(wal)
			require.NoError(t, err)
			for i := len(b) / 2; i < len(b)/2+64; i++ {
				b[i] ^= 0xff
			}
			require.NoError(t, os.WriteFile(wal, b, 0o644))
		},
	}
	for _, name := range []string{"intact", "deleted", "truncated", "flipped"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--pool", "p:dc=1,expected=65536"}
			rl := startRelay(t, args...)
			postBurst(t, rl.base, "p", 400, 4)
			require.Eventually(t, func() bool {
				ps := catalogPersistence(t, rl.base, "p")
				return ps.JournalPosition > 0 && ps.DurablePosition == ps.JournalPosition
			}, 10*time.Second, 5*time.Millisecond)
			before := getCatalog(t, rl.base)["p"].Stats
			require.Positive(t, before.UniqueBlocks)
			rl.kill()
			damage[name](t, newestWAL(t, dir))

			rl2 := startRelay(t, args...)
			ps := catalogPersistence(t, rl2.base, "p")
			after := getCatalog(t, rl2.base)["p"].Stats
			require.True(t, ps.Recovered)
			if name == "intact" {
				assert.Equal(t, "complete", ps.Recovery)
				assert.Zero(t, ps.LostCommands)
				assert.Equal(t, before.UniqueBlocks, after.UniqueBlocks)
				return
			}
			assert.Equal(t, "partial", ps.Recovery)
			assert.Positive(t, ps.LostCommands)
			assert.Zero(t, after.UniqueBlocks, "a partially recovered pool advertises nothing")
			rl2.kill()
			// The degraded resets were journalled: a clean restart keeps
			// the pool empty and says the journal is whole again.
			rl3 := startRelay(t, args...)
			assert.Zero(t, getCatalog(t, rl3.base)["p"].Stats.UniqueBlocks)
			assert.NotEqual(t, "partial", catalogPersistence(t, rl3.base, "p").Recovery)
		})
	}
}
