package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// TestConfig_ManifestOverGRPC: over gRPC the manifest's lanes are the pools
// Select picks in each target's data center, in their routing domain, with no
// format pinned (the two pools differ in size) unless a target pins one; a
// data center without a pool is an error.
func TestConfig_ManifestOverGRPC(t *testing.T) {
	kv, addr := startFakeKV(t)
	east := testID
	west := testID
	west.Pool.DCID, west.Format = 2, ckf.NewFormat(ckf.DefaultSeed, 65536)
	kv.setCatalog(1, descriptor(east), descriptor(west))
	cfg := Config{GRPC: &GRPCConfig{}, Relays: []Relay{{Addrs: []string{addr}}}, ConsumerInstance: testConsumer,
		Targets: []Target{{Pool: "east", Lane: 0, DCID: 1}, {Pool: "west", Lane: 5, DCID: 2}}}
	m, err := cfg.Manifest(context.Background())
	require.NoError(t, err)
	want := consumer.Manifest{ConsumerInstance: testConsumer, Domain: testDomain, VerificationWindow: consumer.DefaultVerificationWindow}
	want.Lanes[0], want.Lanes[5] = &east.Pool, &west.Pool
	require.Equal(t, want, m)
	_, pinned := m.UniformFormat()
	require.False(t, pinned, "no format pinned")

	cfg.Targets[1].Format = west.Format
	cfg.VerificationWindow = 4
	m, err = cfg.Manifest(context.Background())
	require.NoError(t, err)
	want.LaneFormats[5], want.VerificationWindow = west.Format, 4
	require.Equal(t, want, m, "a pinned target")

	cfg.Targets = append(cfg.Targets, Target{Pool: "none", Lane: 6, DCID: 3})
	_, err = cfg.Manifest(context.Background())
	require.ErrorIs(t, err, ErrNotInCatalog, "a data center without a pool")
}

// TestConfig_ManifestRefusals: a NATS config has no catalog to read; a relay
// that serves no catalog and a config New refuses fail before anything.
func TestConfig_ManifestRefusals(t *testing.T) {
	_, err := Config{NATS: &NATSConfig{}, ConsumerInstance: 1, Targets: []Target{{Pool: "p"}}}.Manifest(context.Background())
	require.ErrorIs(t, err, ErrNoCatalog)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "standby", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	_, err = Config{Relays: []Relay{{Addrs: []string{down.URL}}}, Targets: []Target{{Pool: "p"}}}.Manifest(context.Background())
	require.ErrorContains(t, err, "no replica served its catalog")
	_, err = Config{Relays: []Relay{{Addrs: []string{down.URL}}}}.Manifest(context.Background())
	require.Error(t, err, "no target")
}

// TestConfig_ManifestRefusesBadCatalogs: a catalog over MaxCatalogBytes, one
// that does not decode, one without the pool and one whose digest does not
// parse are typed errors, read within the bound.
func TestConfig_ManifestRefusesBadCatalogs(t *testing.T) {
	pool := func(digest string) string {
		return `{"pools":[{"name":"p","dc_id":"1","identity":{"cache_semantics":"` + digest + `","cache_semantics_source":"explicit",` +
			`"routing_scope":"00000000000000000000000000000002","routing_scope_source":"explicit"}}]}`
	}
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer srv.Close()
	cfg := Config{Relays: []Relay{{Addrs: []string{srv.URL}}}, ConsumerInstance: 1, Targets: []Target{{Pool: "p"}}}
	body = pool("00000000000000000000000000000001")
	m, err := cfg.Manifest(context.Background())
	require.NoError(t, err)
	require.Equal(t, ckf.PoolID{Domain: m.Domain, DCID: 1}, *m.Lanes[0])
	require.Equal(t, ckf.DigestExplicit, m.Domain.CacheSemantics.Source)
	require.Equal(t, byte(1), m.Domain.CacheSemantics.Digest[15])

	for _, tc := range []struct{ name, body, want string }{
		{"too long", `{"pools":[{"name":"` + strings.Repeat("a", MaxCatalogBytes) + `"}]}`, "longer than"},
		{"not JSON", "{", "catalog:"},
		{"dc_id a number", strings.Replace(pool("00000000000000000000000000000001"), `"1"`, `1`, 1), "catalog:"},
		{"bad digest", pool("zz"), "cache_semantics"},
		{"no pool", `{"pools":[]}`, "no pool"},
	} {
		body = tc.body
		_, err := cfg.Manifest(context.Background())
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	body = `{"pools":[]}`
	_, err = cfg.Manifest(context.Background())
	require.ErrorIs(t, err, ErrNotInCatalog)
}

// TestConfig_ManifestHonoursTheContext: a relay that accepts the catalog
// request and never answers holds Manifest only until ctx ends.
func TestConfig_ManifestHonoursTheContext(t *testing.T) {
	got := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(got)
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-got; cancel() }()
	_, err := Config{Relays: []Relay{{Addrs: []string{srv.URL}}}, Targets: []Target{{Pool: "p"}}}.Manifest(ctx)
	require.ErrorIs(t, err, context.Canceled)
}
