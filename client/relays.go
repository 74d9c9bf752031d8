package client

import (
	"fmt"
	"sync"
)

// Relay is one relay a Router follows, given as the addresses of its
// replicas: http(s) base URLs over HTTP ("http://10.0.0.7:7878"), gRPC
// targets over gRPC ("10.0.0.7:7879"). A relay run as one process has one
// address. A relay run as a group of replicas (one leads, the others stand
// by) lists them all: the router talks to one at a time and moves to the
// next when one cannot serve its streams (refused, unreachable, or a
// standby answering 503), so it follows whichever replica leads without a
// restart.
type Relay struct {
	Addrs []string
}

// replicas is one Relay's addresses and the one its lanes use now, shared by
// every target of that relay so that a move (one lane found a standby) moves
// them all.
type replicas struct {
	mu    sync.Mutex
	addrs []string
	cur   int
}

// current returns the address in use and its index.
func (r *replicas) current() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addrs[r.cur], r.cur
}

// failed moves past the address at index i, unless another lane already
// moved (then the address in use is newer than the one that failed).
func (r *replicas) failed(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == i {
		r.cur = (i + 1) % len(r.addrs)
	}
}

// checkRelays validates cfg's relays and targets for its transport: HTTP and
// gRPC need at least one relay, each with at least one address (HTTP's are
// checked URLs), and every target's Relay names one of them; NATS takes no
// relays (the router reads the broadcast, not a relay).
func checkRelays(cfg *Config) error {
	if cfg.NATS != nil {
		if len(cfg.Relays) != 0 {
			return fmt.Errorf("client: NATS reads the relays' broadcast: Relays must be empty")
		}
		return nil
	}
	if len(cfg.Relays) == 0 {
		return fmt.Errorf("client: at least one relay is required (Config.Relays)")
	}
	for i, rl := range cfg.Relays {
		if len(rl.Addrs) == 0 {
			return fmt.Errorf("client: relay %d has no address", i)
		}
		seen := map[string]bool{}
		for _, a := range rl.Addrs {
			if seen[a] {
				return fmt.Errorf("client: relay %d lists %q twice", i, a)
			}
			seen[a] = true
			if cfg.GRPC == nil {
				if err := CheckRelayURL(a); err != nil {
					return err
				}
			} else if a == "" {
				return fmt.Errorf("client: relay %d has an empty gRPC target", i)
			}
		}
	}
	for _, t := range cfg.Targets {
		if t.Relay < 0 || t.Relay >= len(cfg.Relays) {
			return fmt.Errorf("client: target %+v: Relay %d names no relay (Config.Relays has %d)", t, t.Relay, len(cfg.Relays))
		}
	}
	return nil
}
