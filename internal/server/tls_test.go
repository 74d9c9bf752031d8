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
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// selfSigned writes a certificate for 127.0.0.1 and its key to dir and
// returns the paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
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
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
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
	_, base, addr := serveReal(t, cfg)
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
	code, err := get(tlsClient, base+"/v1/pools", "tok")
	require.NoError(t, err, "TLS with token")
	assert.Equal(t, http.StatusOK, code, "TLS with token")
	code, err = get(tlsClient, base+"/v1/pools", "")
	require.NoError(t, err, "TLS without token")
	assert.Equal(t, http.StatusUnauthorized, code, "TLS without token")
	// A plain-HTTP request to the TLS port gets no API answer: an error, or
	// any status but 200.
	if code, err := get(&http.Client{Timeout: 5 * time.Second}, "http://"+addr+"/v1/pools", "tok"); err == nil {
		assert.NotEqual(t, http.StatusOK, code, "plain HTTP on the TLS port answered 200")
	}
	// A client that does not trust the certificate is refused.
	_, err = get(&http.Client{Timeout: 5 * time.Second}, base+"/healthz", "")
	assert.Error(t, err, "an untrusted certificate was accepted")
}

// TestNew_BadTLSFilesFailBeforeServing: a missing key pair is New's error,
// so `relay serve` never announces an address it cannot serve.
func TestNew_BadTLSFilesFailBeforeServing(t *testing.T) {
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(t.TempDir(), "missing.pem"), filepath.Join(t.TempDir(), "missing.key")
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		_ = s.Shutdown(context.Background())
	}
	require.ErrorIs(t, err, fs.ErrNotExist, "New accepted a TLS configuration whose files do not exist")
}
