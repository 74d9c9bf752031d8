package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns the paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ckfrelay test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

// TestServer_TLSAndAuth serves over TLS with a bearer token: a client that
// trusts the certificate and sends the token gets through; plain HTTP and a
// missing token do not.
func TestServer_TLSAndAuth(t *testing.T) {
	cfg := testConfig()
	certFile, keyFile, roots := selfSigned(t, t.TempDir())
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	cfg.AuthToken = "tok"
	s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	base := "https://" + ln.Addr().String()
	tlsClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}

	get := func(c *http.Client, url, token string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(tlsClient, base+"/v1/pools", "tok"); err != nil || code != http.StatusOK {
		t.Fatalf("TLS with token: %d %v, want 200", code, err)
	}
	if code, err := get(tlsClient, base+"/v1/pools", ""); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("TLS without token: %d %v, want 401", code, err)
	}
	// A plain-HTTP request to the TLS port gets no API answer.
	if code, err := get(&http.Client{Timeout: 5 * time.Second}, "http://"+ln.Addr().String()+"/v1/pools", "tok"); err == nil && code == http.StatusOK {
		t.Fatalf("plain HTTP on the TLS port answered 200")
	}
	// A client that does not trust the certificate is refused.
	if _, err := get(&http.Client{Timeout: 5 * time.Second}, base+"/healthz", ""); err == nil {
		t.Fatalf("an untrusted certificate was accepted")
	}
}

// TestNew_BadTLSFilesFailBeforeServing: a missing key pair is New's error,
// so `relay serve` never announces an address it cannot serve.
func TestNew_BadTLSFilesFailBeforeServing(t *testing.T) {
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(t.TempDir(), "missing.pem"), filepath.Join(t.TempDir(), "missing.key")
	if s, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		_ = s.Shutdown(context.Background())
		t.Fatal("New accepted a TLS configuration whose files do not exist")
	}
}
