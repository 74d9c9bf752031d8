// Package tail is the `relay tail` command: it subscribes to one pool's frame
// stream over HTTP, or follows a dynamo.kvrelay.v1 KvEventRelay server over
// gRPC as the Go client does (grpc.go), and prints every frame as a JSON line
// (words and images in hex, 64-bit values as decimal strings as in the
// catalog).
package tail

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/client"
)

// ErrUsage is returned when the flags are invalid; the message has been
// written to stderr already, and the command exits 2.
var ErrUsage = errors.New("tail: usage")

// Run is `relay tail`: it parses args, subscribes to the pool and prints each
// frame on stdout as a JSON line until the stream ends, a close frame, --frames
// frames or ctx is done.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	relay := fs.String("relay", "http://127.0.0.1:7878", "relay base URL")
	pool := fs.String("pool", "", "pool name (required)")
	consumer := ConsumerFlag(fs)
	lane := fs.Uint("lane", 0, "physical lane 0..15")
	epoch := fs.Uint64("epoch", 0, "assignment epoch; must exceed the lane's last one on this relay (0: the current time in ns, which always does)")
	token := fs.String("auth-token", "", "bearer token")
	limit := fs.Int("frames", 0, "stop after this many frames (0: until the stream ends)")
	caFile := fs.String("ca-file", "", "PEM file of the CA that signed the relay's certificate (for https:// relays, or a TLS gRPC relay, under a private CA; default: the system's roots)")
	g := grpcFlags(fs)
	if err := fs.Parse(args); err != nil {
		return ErrUsage
	}
	if *g.addr != "" {
		return runGRPC(ctx, g, *token, *caFile, *limit, stdout, stderr)
	}
	if *pool == "" {
		fmt.Fprintln(stderr, "tail: --pool is required (or --grpc HOST:PORT)")
		return ErrUsage
	}
	if *epoch == 0 {
		*epoch = uint64(time.Now().UnixNano())
	}
	*consumer = ConsumerID(*consumer)
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
		if hc, err = CAClient(*caFile); err != nil {
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
	return printFrames(resp.Body, stdout, *limit)
}

// CAClient returns an HTTP client that trusts only the certificates in the
// PEM file at path (`--ca-file` of relay tail and relay query).
func CAClient(path string) (*http.Client, error) {
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
