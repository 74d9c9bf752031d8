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
