package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
	"github.com/ckfrelay/ckfrelay/wire"
)

// runTail subscribes to one pool and prints each frame as a JSON line.
func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	relay := fs.String("relay", "http://127.0.0.1:7878", "relay base URL")
	pool := fs.String("pool", "", "pool name (required)")
	consumer := fs.Uint64("consumer", 1, "consumer instance id")
	lane := fs.Uint("lane", 0, "physical lane 0..15")
	epoch := fs.Uint64("epoch", 0, "assignment epoch; must exceed the lane's last one on this relay (0: the current time in ns, which always does)")
	token := fs.String("auth-token", "", "bearer token")
	limit := fs.Int("frames", 0, "stop after this many frames (0: until the stream ends)")
	caFile := fs.String("ca-file", "", "PEM file of the CA that signed the relay's certificate (for https:// relays under a private CA; default: the system's roots)")
	if err := fs.Parse(args); err != nil || *pool == "" {
		if *pool == "" {
			fmt.Fprintln(stderr, "tail: --pool is required")
		}
		return errUsage
	}
	if *epoch == 0 {
		*epoch = uint64(time.Now().UnixNano())
	}
	if err := client.CheckRelayURL(*relay); err != nil {
		return err
	}
	u := fmt.Sprintf("%s/v1/pools/%s/stream?consumer=%d&lane=%d&epoch=%d",
		strings.TrimRight(*relay, "/"), url.PathEscape(*pool), *consumer, *lane, *epoch)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if *token != "" {
		req.Header.Set("Authorization", "Bearer "+*token)
	}
	hc := http.DefaultClient
	if *caFile != "" {
		if hc, err = caClient(*caFile); err != nil {
			return err
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return tailFrames(resp.Body, stdout, *limit)
}

// caClient returns an HTTP client that trusts only the certificates in the
// PEM file at path.
func caClient(path string) (*http.Client, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tail: --ca-file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tail: --ca-file %s: no PEM certificate in it", path)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// tailFrames prints frames from r until EOF, a close frame, or limit frames.
func tailFrames(r io.Reader, w io.Writer, limit int) error {
	fr := wire.NewReader(r, 0)
	enc := json.NewEncoder(w)
	var f wire.Frame
	for n := 0; limit == 0 || n < limit; n++ {
		if err := fr.ReadFrame(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := enc.Encode(frameJSON(&f)); err != nil {
			return err
		}
		if f.Kind == wire.KindClose {
			return nil
		}
	}
	return nil
}

func hexWords(words []uint64) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = fmt.Sprintf("%016x", w)
	}
	return out
}

func identityMap(id ckf.ProducerIdentity) map[string]any {
	d := id.Pool.Domain
	return map[string]any{
		"cache_semantics": hex.EncodeToString(d.CacheSemantics.Digest[:]), "routing_scope": hex.EncodeToString(d.RoutingScope.Digest[:]),
		"dc_id": catalog.U64(id.Pool.DCID), "producer_incarnation": catalog.U64(id.ProducerIncarnation),
		"layout_generation": catalog.U64(id.LayoutGeneration), "seed": catalog.U64(id.Format.Seed),
		"bucket_count": catalog.U64(id.Format.BucketCount),
	}
}

func leaseMap(l ckf.LaneLease) map[string]any {
	return map[string]any{"consumer": catalog.U64(l.ConsumerInstance), "lane": l.PhysicalLane, "epoch": catalog.U64(l.AssignmentEpoch)}
}

// frameJSON is the JSON-lines view of one frame; words and images in hex,
// every other 64-bit value as a decimal string as in the catalog (a JSON number
// loses precision above 2^53 in most readers).
func frameJSON(f *wire.Frame) map[string]any {
	switch f.Kind {
	case wire.KindSnapshotChunk:
		s := &f.Snapshot
		return map[string]any{"kind": "snapshot_chunk", "identity": identityMap(s.Identity), "lease": leaseMap(s.Lease),
			"sequence": catalog.U64(s.Sequence), "chunk_index": s.ChunkIndex, "chunk_count": s.ChunkCount,
			"bucket_offset": catalog.U64(s.BucketOffset), "words": hexWords(s.Words)}
	case wire.KindDelta:
		d := &f.Delta
		images := make([]map[string]any, len(d.Images))
		for i, im := range d.Images {
			images[i] = map[string]any{"bucket": im.Bucket, "word": fmt.Sprintf("%016x", im.Word)}
		}
		return map[string]any{"kind": "delta", "identity": identityMap(d.Identity), "lease": leaseMap(d.Lease),
			"base_sequence": catalog.U64(d.BaseSequence), "sequence": catalog.U64(d.Sequence), "images": images}
	case wire.KindDrainMarker:
		return map[string]any{"kind": "drain_marker", "lease": leaseMap(f.Drain.Lease), "expected_sequence": catalog.U64(f.Drain.ExpectedSequence)}
	case wire.KindHeartbeat:
		h := &f.Heartbeat
		return map[string]any{"kind": "heartbeat", "lease": leaseMap(h.Lease), "last_sequence": catalog.U64(h.LastSequence), "unix_micros": catalog.I64(h.UnixMicros)}
	case wire.KindClose:
		return map[string]any{"kind": "close", "reason": string(f.Close.Reason), "message": f.Close.Message}
	}
	return map[string]any{"kind": f.Kind.String()}
}
