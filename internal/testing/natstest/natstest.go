// Package natstest runs real NATS servers for tests: the embedded
// nats-server/v2 with JetStream on a temporary directory (restartable on the
// same port and store, to test a server restart), two of them joined as a
// leaf node (two regions), or Debian's nats-server binary as a separate
// process.
package natstest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is one embedded NATS server with JetStream on files.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// Options tunes Start.
type Options struct {
	// Name is the server name (default "ckf-test").
	Name string
	// LeafListen opens a leaf-node listener (the hub of a region).
	LeafListen bool
	// LeafRemote joins this server as a leaf node to a hub's leaf URL.
	LeafRemote string
	// NoJetStream runs the server without JetStream (a leaf whose clients
	// use the hub's JetStream through its domain).
	NoJetStream bool
	// Domain is the server's JetStream domain, through which clients of a
	// leaf node reach it.
	Domain string
	// MaxPayload overrides the server's max_payload (default 1 MiB).
	MaxPayload int32
}

// Start runs an embedded server on a free port with JetStream under
// t.TempDir(); it is shut down at the end of the test.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Name == "" {
		o.Name = "ckf-test"
	}
	opts := server.Options{
		ServerName:      o.Name,
		Host:            "127.0.0.1",
		Port:            server.RANDOM_PORT,
		JetStream:       !o.NoJetStream,
		StoreDir:        filepath.Join(t.TempDir(), "jetstream"),
		JetStreamDomain: o.Domain,
		MaxPayload:      o.MaxPayload,
		NoLog:           true,
		NoSigs:          true,
	}
	if o.LeafListen {
		opts.LeafNode.Host = "127.0.0.1"
		opts.LeafNode.Port = freePort(t)
	}
	if o.LeafRemote != "" {
		u, err := url.Parse(o.LeafRemote)
		if err != nil {
			t.Fatalf("natstest: leaf remote: %v", err)
		}
		opts.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}
	}
	s := &Server{t: t, opts: opts}
	s.start()
	// Later restarts keep the port the first start chose.
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(s.Shutdown)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	opts := s.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("natstest: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		s.t.Fatalf("natstest: server not ready")
	}
	s.srv = srv
}

// URL is the client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// JetStream connects a client to s for the rest of the test (closed at its
// end) and returns the connection and its JetStream context.
func (s *Server) JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", s.URL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// LeafURL is the leaf-node URL of a server started with LeafListen.
func (s *Server) LeafURL() string {
	return fmt.Sprintf("nats-leaf://127.0.0.1:%d", s.opts.LeafNode.Port)
}

// Shutdown stops the server (idempotent).
func (s *Server) Shutdown() {
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.srv = nil
	}
}

// Restart stops the server and starts it again on the same port and store
// directory: file-backed streams and buckets survive; connections drop and
// clients reconnect.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	s.start()
}

// StartBinary runs the nats-server binary (Debian's package "nats-server")
// with JetStream on a temporary directory, as a separate process, and
// returns its client URL. The test is skipped when the binary is absent.
func StartBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("nats-server binary not found: install the Debian package nats-server")
	}
	port := freePort(t)
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", t.TempDir())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("natstest: start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: %s did not listen on %s", bin, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "nats://" + addr
}

// freePort returns a port that was free a moment ago.
func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
