package demo

import (
	"slices"
	"sync"
	"time"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
)

// deliveryLanes measures the demo's delivery time: from sending a request's
// events to its data center's relay (the HTTP POST, or the engine's ZMQ
// publish for the ZMQ data center) to the first frame after which the
// router's lane for that data center holds the request's last block. It wraps the
// router's consumer; client.Router serializes every call into it, so the
// check after each frame reads the consumer safely. One probe per lane is
// pending at a time.
type deliveryLanes struct {
	client.Lanes

	mu      sync.Mutex // guards pending and tookNs
	pending [ckf.MaxLanes]deliveryProbe
	tookNs  []int64
}

type deliveryProbe struct {
	key uint64
	t0  time.Time
	set bool
}

// ApplyFrame applies frame and times every pending probe it made visible.
func (d *deliveryLanes) ApplyFrame(frame []byte) (consumer.Result, error) {
	res, err := d.Lanes.ApplyFrame(frame)
	d.mu.Lock()
	defer d.mu.Unlock()
	for lane := range d.pending {
		p := &d.pending[lane]
		if !p.set {
			continue
		}
		if mask, _ := d.Lanes.Contains(p.key); mask&(1<<lane) != 0 {
			d.tookNs = append(d.tookNs, time.Since(p.t0).Nanoseconds())
			p.set = false
		}
	}
	return res, err
}

// probe times the arrival of key in lane from t0, unless a probe of the
// lane is pending or router's lane already holds key (a block stored before
// says nothing about this delivery).
func (d *deliveryLanes) probe(router *client.Router, lane int, key uint64, t0 time.Time) {
	d.mu.Lock()
	busy := d.pending[lane].set
	d.mu.Unlock()
	if busy {
		return
	}
	if mask, err := router.Contains(key); err != nil || mask&(1<<lane) != 0 {
		return
	}
	d.mu.Lock()
	d.pending[lane] = deliveryProbe{key: key, t0: t0, set: true}
	d.mu.Unlock()
}

// samples returns the delivery times measured so far, in nanoseconds.
func (d *deliveryLanes) samples() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.tookNs)
}
