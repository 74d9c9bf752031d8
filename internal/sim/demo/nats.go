package demo

import (
	"fmt"
	"os"
	"time"

	"github.com/ckfrelay/ckfrelay/client"
	natsserver "github.com/nats-io/nats-server/v2/server"
)

// demoNATS starts what --transport asks for: nothing for "http"; for "nats"
// an embedded nats-server with JetStream on a temporary directory, through
// which the relay broadcasts and the router reads (docs/deploy.md). It
// returns the router's NATS config (nil for HTTP) and a stop function.
func demoNATS(transport string) (*client.NATSConfig, string, func(), error) {
	if transport != "nats" {
		return nil, "", func() {}, nil
	}
	dir, err := os.MkdirTemp("", "ckfrelay-demo-nats-")
	if err != nil {
		return nil, "", nil, err
	}
	ns, err := natsserver.NewServer(&natsserver.Options{ServerName: "ckfrelay-demo", Host: "127.0.0.1",
		Port: natsserver.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, fmt.Errorf("demo: nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		os.RemoveAll(dir)
		return nil, "", nil, fmt.Errorf("demo: nats: the embedded server did not start")
	}
	stop := func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
	}
	url := ns.ClientURL()
	return &client.NATSConfig{URL: url}, url, stop, nil
}
