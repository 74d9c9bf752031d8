package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// clientFrom returns an HTTP client whose connections come from local
// address ip (127.0.0.0/8 is all loopback on Linux), so a test can play
// two client addresses.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// The red-team lock-out: connections from one address each send an ingest
// request's headers and one body byte, then stall. Each takes an ingest
// slot; before the per-client share they took all max_concurrent_ingest
// slots and every other producer was answered 503 overloaded.
func TestServer_OneClientCannotHoldEveryIngestSlot(t *testing.T) {
	cfg := testConfig()
	cfg.BodyReadTimeout = Duration(time.Minute) // the stalled bodies hold their slots for the whole test
	s, base, addr := serveReal(t, cfg)
	total := DefaultConcurrentIngest
	share := s.cfg.MaxConcurrentIngestPerClient
	require.Equal(t, total/4, share, "default share: a quarter")

	var answered, overloaded atomic.Int64
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	for range total {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/pools/dc-a/events?source_epoch=1 HTTP/1.1\r\nHost: x\r\n"+
			"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n[")
		require.NoError(t, err)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode == http.StatusServiceUnavailable && errCode(body) == CodeOverloaded {
				overloaded.Add(1)
			}
			answered.Add(1)
		}()
	}
	// Every stalled request either holds a slot or has been answered.
	require.Eventually(t, func() bool { return len(s.ingestSlots)+int(answered.Load()) == total }, 10*time.Second, time.Millisecond,
		"slots %d, answered %d", len(s.ingestSlots), answered.Load())
	assert.Equal(t, share, len(s.ingestSlots), "one address holds its share of the slots")
	assert.Equal(t, int64(total-share), overloaded.Load(), "the rest are answered 503 overloaded")

	// Another address's producer is served.
	ev, _ := chainJSON(1, 1, 2)
	resp, err := clientFrom(t, "127.0.0.2").Post(base+"/v1/pools/dc-a/events?source_epoch=1", "application/json", strings.NewReader("["+ev+"]"))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusAccepted, resp.StatusCode, "another client address still posts: %s", b)
}

// The red-team lock-out: one address opened max_subscribers streams on a
// pool and kept reading them; every other router's subscribe was answered
// 503 too_many_subscribers.
func TestServer_OneClientCannotHoldEverySubscriberSlot(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSubscribers = 8
	s, base, _ := serveReal(t, cfg)
	share := s.cfg.MaxSubscribersPerClient
	require.Equal(t, 2, share, "default share: a quarter")

	open := func(c *http.Client, consumer, epoch uint64) (int, string) {
		t.Helper()
		resp, err := c.Get(fmt.Sprintf("%s/v1/pools/dc-a/stream?consumer=%d&lane=0&epoch=%d", base, consumer, epoch))
		require.NoError(t, err)
		if resp.StatusCode == http.StatusOK {
			t.Cleanup(func() { resp.Body.Close() }) // the stream stays open
			return resp.StatusCode, ""
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, errCode(body)
	}
	attacker := clientFrom(t, "127.0.0.1")
	granted := 0
	for i := range cfg.MaxSubscribers {
		code, ecode := open(attacker, uint64(1000+i), 1)
		if code == http.StatusOK {
			granted++
			continue
		}
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Equal(t, CodeTooMany, ecode)
	}
	assert.Equal(t, share, granted, "one address holds its share of the pool's subscriber slots")
	// At its share, the address may still replace its own stream on a lane
	// (a higher epoch supersedes it and takes its slot and share).
	code, _ := open(attacker, 1000, 2)
	assert.Equal(t, http.StatusOK, code, "superseding its own stream is not refused for the share")

	// Another address's router subscribes.
	code, ecode := open(clientFrom(t, "127.0.0.2"), 42, 1)
	assert.Equal(t, http.StatusOK, code, "another client address still subscribes (%s)", ecode)
}

func TestConfig_PerClientSharesValidated(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Config)
	}{
		{"ingest share above the total", func(c *Config) { c.MaxConcurrentIngest, c.MaxConcurrentIngestPerClient = 4, 5 }},
		{"negative ingest share", func(c *Config) { c.MaxConcurrentIngestPerClient = -1 }},
		{"subscriber share above the total", func(c *Config) { c.MaxSubscribers, c.MaxSubscribersPerClient = 8, 9 }},
		{"negative subscriber share", func(c *Config) { c.MaxSubscribersPerClient = -1 }},
	} {
		cfg := testConfig()
		c.set(&cfg)
		assert.ErrorIs(t, cfg.WithDefaults().Validate(), ErrInvalidConfig, c.name)
	}
	cfg := testConfig().WithDefaults()
	assert.Equal(t, DefaultConcurrentIngest/4, cfg.MaxConcurrentIngestPerClient)
	assert.Equal(t, DefaultMaxSubscribers/4, cfg.MaxSubscribersPerClient)
	require.NoError(t, cfg.Validate())
}
