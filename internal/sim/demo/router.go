package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/wasm/host"
)

// demoConsumerInstance is the router consumer's instance id.
const demoConsumerInstance = 77

// demoRouter is the demo's router: one consumer with a lane per data
// center, fed by a client.Router that subscribes to every pool.
type demoRouter struct {
	*client.Router
	lanes    client.Lanes
	delivery *deliveryLanes // wraps lanes for the client
	dcs      int
	laneInfo []client.LaneInfo // each lane's state when the router stopped
	grpc     *grpcCounts       // what arrived over gRPC (nil: HTTP or NATS)

	closeLanes func()
	cancel     context.CancelFunc
	done       chan struct{}
	stopped    bool
}

// startDemoRouter builds the router's consumer, starts the client subscribing
// to every pool of relay, and waits (bounded by --ready-timeout) until every
// lane installed a snapshot.
func startDemoRouter(ctx context.Context, o demoOptions, relay *demoRelay) (*demoRouter, error) {
	domain := relay.cfg.Domain()
	m := consumer.Manifest{ConsumerInstance: demoConsumerInstance, Domain: domain, Format: relay.format, VerificationWindow: 2}
	var targets []client.Target
	for d := range o.dataCenters {
		m.Lanes[d] = &ckf.PoolID{Domain: domain, DCID: uint64(d + 1)}
		targets = append(targets, client.Target{Pool: poolName(d), Lane: d, DCID: uint64(d + 1)})
	}
	lanes, closeLanes, err := newLanes(ctx, o.consumer, m)
	if err != nil {
		return nil, err
	}
	rcfg := client.Config{Relays: []client.Relay{{Addrs: []string{relay.base}}}, ConsumerInstance: demoConsumerInstance, Targets: targets, IdleTimeout: 5 * time.Second}
	var counts *grpcCounts
	switch {
	case relay.nats != nil:
		rcfg.Relays, rcfg.NATS = nil, relay.nats
	case relay.grpc != "":
		counts = &grpcCounts{}
		rcfg.Relays, rcfg.GRPC = []client.Relay{{Addrs: []string{relay.grpc}}}, demoGRPC(counts)
	}
	delivery := &deliveryLanes{Lanes: lanes}
	cr, err := client.New(rcfg, delivery)
	if err != nil {
		closeLanes()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &demoRouter{Router: cr, lanes: lanes, delivery: delivery, dcs: o.dataCenters, grpc: counts, closeLanes: closeLanes, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_ = cr.Run(rctx)
	}()
	if err := waitReady(ctx, cr, o.dataCenters, o.readyTimeout); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// halt stops the client after recording every lane's final state in
// laneInfo; the consumer stays open and is the caller's alone from here (see
// consumerBytes). It is idempotent.
func (r *demoRouter) halt() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.laneInfo = r.laneInfo[:0]
	for d := range r.dcs {
		r.laneInfo = append(r.laneInfo, r.Lane(d))
	}
	r.cancel()
	<-r.done
}

// stop halts the router and closes its consumer.
func (r *demoRouter) stop() {
	r.halt()
	if r.closeLanes != nil {
		r.closeLanes()
		r.closeLanes = nil
	}
}

// newLanes builds the router's consumer: the WebAssembly module under wazero,
// or the native package.
func newLanes(ctx context.Context, kind string, m consumer.Manifest) (client.Lanes, func(), error) {
	if kind == "native" {
		n, err := client.NewNative(m)
		if err != nil {
			return nil, nil, err
		}
		return n, func() {}, nil
	}
	rt, err := host.NewRuntime(ctx, host.NewConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("wasm runtime: %w", err)
	}
	in, err := rt.NewInstance(ctx, m)
	if err != nil {
		_ = rt.Close(context.Background())
		return nil, nil, fmt.Errorf("wasm consumer: %w", err)
	}
	return in, func() { _ = in.Close(); _ = rt.Close(context.Background()) }, nil
}

// waitReady waits, bounded by timeout, until every lane installed a snapshot.
// It polls (the router has no readiness callback) and says which lanes failed
// and why, so a demo that cannot converge ends instead of hanging silently.
func waitReady(ctx context.Context, router *client.Router, lanes int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var notReady []string
		for d := range lanes {
			if li := router.Lane(d); !li.Ready {
				notReady = append(notReady, fmt.Sprintf("lane %d (%s): %s", d, li.Pool, cmpStr(li.LastError, "no snapshot yet")))
			}
		}
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("router lanes not ready after %v: %s", timeout, strings.Join(notReady, "; "))
		case <-tick.C:
		}
	}
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
