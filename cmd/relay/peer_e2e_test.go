//go:build unix

package main

// Black-box regressions for hostile HTTP peers and a damaged or shared data
// directory, against the real relay binary.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/server"
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

// TestE2E_BodylessIngestHoldsNoSlot: 16 connections that announce
// Content-Length: 100000 and send no body, reconnecting whenever answered,
// as many as max_concurrent_ingest, must not hold the ingest slots: 12
// legitimate posts made meanwhile are all admitted (202).
func TestE2E_BodylessIngestHoldsNoSlot(t *testing.T) {
	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", "p:dc=1,expected=65536")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var started sync.WaitGroup
	var attempts atomic.Int64
	const attackers = 16
	started.Add(attackers)
	for range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", rl.addr)
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, "POST /v1/pools/p/events?source_epoch=1 HTTP/1.1\r\nHost: x\r\n"+
					"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
				attempts.Add(1)
				if first {
					started.Done()
					first = false
				}
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				go func() { <-stop; _ = c.Close() }()
				_, _ = http.ReadResponse(bufio.NewReader(c), nil)
				_ = c.Close()
			}
		}()
	}
	started.Wait()
	ok, codes := 0, map[int]int{}
	for i := range 12 {
		ev := fmt.Sprintf(`[{"worker_id": %d, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": %d, "tokens_hash": %d}]}}}}]`, 100+i, 1000+i, 2000+i)
		resp, err := http.Post(rl.base+"/v1/pools/p/events?source_epoch=1", "application/json", strings.NewReader(ev))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusAccepted {
			ok++
		}
		<-time.After(250 * time.Millisecond) // spread over the attack, not ordering
	}
	close(stop)
	wg.Wait()
	assert.Equal(t, 12, ok, "legitimate posts by status: %v (attacker requests %d)", codes, attempts.Load())
	assert.Zero(t, metricValue(t, rl.base, `ckfrelay_requests_rejected_total{code="overloaded"}`))
}

// raiseNoFile makes sure this process (and the relay it starts, which
// inherits the limit) may open n descriptors, or skips.
func raiseNoFile(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d < %d", lim.Max, n)
	}
	old := lim
	lim.Cur = n
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// holdIdleConnections opens n keep-alive connections to addr, each after
// one GET /healthz, and leaves them idle until the test ends. It does not
// wait for the answers: past a connection bound they would never come.
func holdIdleConnections(t *testing.T, addr string, n int) {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		conns = append(conns, c)
		_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		go func() { // drain the answer, if any, so the server can go idle
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// healthLatency GETs /healthz over k fresh connections and returns the
// latencies (a failed or timed-out request counts as the timeout).
func healthLatency(t *testing.T, base string, k int) (lat []time.Duration, failed int) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range k {
		start := time.Now()
		resp, err := hc.Get(base + "/healthz")
		d := time.Since(start)
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		lat = append(lat, d)
	}
	slices.Sort(lat)
	return lat, failed
}

// TestE2E_IdleConnectionsDoNotStarveHealth: 4,100 idle keep-alive
// connections (more than max_connections 4096) must not time out /healthz
// or an authenticated client; a 401 closes its connection. Once with the
// per-client idle bound (the default 256: every connection here comes from
// 127.0.0.1) and once without it (a bound above the attack), where only the
// eviction of the longest-idle connection at max_connections keeps the
// relay answering.
func TestE2E_IdleConnectionsDoNotStarveHealth(t *testing.T) {
	const idle = 4100
	raiseNoFile(t, 3*idle)
	for _, perClient := range []int{0, 1 << 20} {
		t.Run(fmt.Sprintf("max_idle_per_client=%d", perClient), func(t *testing.T) {
			cfg := server.Config{Listen: "127.0.0.1:0", AuthToken: "s3cret", MaxIdlePerClient: perClient,
				Pools: []server.PoolSpec{{Name: "p", DCID: 1, ExpectedBlocks: 4096}}}
			rl := startRelay(t, "--config", writeConfig(t, cfg))
			// A 401 is answered with Connection: close, and the relay closes.
			c, err := net.Dial("tcp", rl.addr)
			require.NoError(t, err)
			_, err = io.WriteString(c, "GET /v1/pools HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			assert.True(t, resp.Close, "Connection: close on a 401")
			_, _ = io.Copy(io.Discard, resp.Body)
			_, err = br.ReadByte()
			assert.ErrorIs(t, err, io.EOF, "the relay closed the 401'd connection")
			c.Close()

			holdIdleConnections(t, rl.addr, idle)
			lat, failed := healthLatency(t, rl.base, 50)
			t.Logf("/healthz over a fresh connection beside %d idle ones: median %v, p90 %v, max %v, %d failed",
				idle, lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1], failed)
			assert.Zero(t, failed, "/healthz timed out beside idle connections")
			hc := &http.Client{Timeout: 5 * time.Second}
			for range 10 {
				req, _ := http.NewRequest("GET", rl.base+"/v1/pools", nil)
				req.Header.Set("Authorization", "Bearer s3cret")
				resp, err := hc.Do(req)
				require.NoError(t, err, "an authenticated client timed out")
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
}
