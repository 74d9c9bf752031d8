package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BuildServer builds nats-server at the version go.mod requires into a
// temporary directory and returns the binary's path (Debian's package is
// too old for the KV and stream features the relay's HA uses). The Go
// build cache makes repeated builds a link.
func BuildServer(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("natstest: build nats-server: %v\n%s", err, out)
	}
	return bin
}

// ClusterNode is one nats-server process of a cluster.
type ClusterNode struct {
	Name    string
	URL     string
	monitor string // the server's HTTP monitoring base URL
	cmd     *exec.Cmd
	log     string // the server's own log (stdout and stderr)
}

// Kill sends SIGKILL to the node and waits for it to exit (idempotent).
func (n *ClusterNode) Kill() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	_ = n.cmd.Wait()
	n.cmd = nil
}

// StartCluster runs size nats-server processes of bin (BuildServer) as one
// JetStream cluster on loopback, each with its store under t.TempDir(), and
// waits until JetStream answers through every node. They are killed at the
// end of the test.
func StartCluster(t testing.TB, bin string, size int) []*ClusterNode {
	t.Helper()
	client := make([]int, size)
	route := make([]int, size)
	monitor := make([]int, size)
	for i := range size {
		client[i], route[i], monitor[i] = freePort(t), freePort(t), freePort(t)
	}
	var routes []string
	for i := range size {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", route[i]))
	}
	nodes := make([]*ClusterNode, size)
	for i := range size {
		dir := t.TempDir()
		name := fmt.Sprintf("n%d", i+1)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream { store_dir: %q }
cluster {
  name: ckf
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, name, client[i], monitor[i], filepath.Join(dir, "js"), route[i], strings.Join(routes, ", "))
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatalf("natstest: %v", err)
		}
		cmd := exec.Command(bin, "-c", path)
		logf, err := os.Create(filepath.Join(dir, "nats.log"))
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatalf("natstest: start %s: %v", name, err)
		}
		logf.Close() // the child holds its own descriptor
		n := &ClusterNode{Name: name, URL: "nats://127.0.0.1:" + strconv.Itoa(client[i]),
			monitor: "http://127.0.0.1:" + strconv.Itoa(monitor[i]), cmd: cmd, log: logf.Name()}
		nodes[i] = n
		t.Cleanup(n.Kill)
	}
	// JetStream answers once the meta group has a leader.
	for _, n := range nodes {
		if err := waitJetStream(n.URL); err != nil {
			var logs strings.Builder
			for _, m := range nodes {
				b, _ := os.ReadFile(m.log)
				if len(b) > 4096 {
					b = b[len(b)-4096:]
				}
				fmt.Fprintf(&logs, "--- %s (%s):\n%s\n", m.Name, m.URL, b)
			}
			t.Fatalf("natstest: %v\n%s", err, logs.String())
		}
	}
	return nodes
}

// waitJetStream waits until JetStream answers through url. A loaded
// machine (CI, other tests on two cores) can take tens of seconds to elect
// the meta leader.
func waitJetStream(url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err == nil {
			js, jerr := jetstream.New(nc)
			if jerr == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err = js.AccountInfo(ctx)
				cancel()
			} else {
				err = jerr
			}
			nc.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("JetStream at %s not ready: %w", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URLs joins the nodes' client URLs, first first, for a client that
// reconnects to the others.
func URLs(first *ClusterNode, all []*ClusterNode) string {
	urls := []string{first.URL}
	for _, n := range all {
		if n != first {
			urls = append(urls, n.URL)
		}
	}
	return strings.Join(urls, ",")
}

// ServesDirectGets reports whether the node answers direct gets of stream
// itself (its monitoring endpoint lists a local subscription on the direct
// get subject, not only the JetStream API's "$JS.API.>"). A stream's
// follower joins only once it has caught up, checked every 2 s after it saw
// a leader (nats-server monitorStream), so a test that needs the survivors
// of a leader's death to answer waits for it.
func (n *ClusterNode) ServesDirectGets(stream string) (bool, error) {
	subject := "$JS.API.DIRECT.GET." + stream
	u := n.monitor + "/subsz?subs=1&limit=100000&test=" + url.QueryEscape(subject)
	resp, err := http.Get(u)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var sz struct {
		Subs []struct {
			Subject string `json:"subject"`
		} `json:"subscriptions_list"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&sz); err != nil {
		return false, err
	}
	for _, sub := range sz.Subs {
		if sub.Subject == subject {
			return true, nil
		}
	}
	return false, nil
}

// StreamLeader returns the leader the node knows for stream ("" while it
// knows none: after it lost its quorum, a node that led keeps serving as
// leader until its Raft group notices, and a test that needs no leader
// waits for "").
func (n *ClusterNode) StreamLeader(stream string) (string, error) {
	resp, err := http.Get(n.monitor + "/jsz?accounts=true&streams=true")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name    string `json:"name"`
				Cluster *struct {
					Leader string `json:"leader"`
				} `json:"cluster"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return "", err
	}
	for _, a := range jsz.Accounts {
		for _, s := range a.Streams {
			if s.Name == stream {
				if s.Cluster == nil {
					return "", nil
				}
				return s.Cluster.Leader, nil
			}
		}
	}
	return "", fmt.Errorf("natstest: %s does not know stream %s", n.Name, stream)
}
