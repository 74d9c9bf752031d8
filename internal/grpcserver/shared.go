package grpcserver

import (
	"sync"
	"time"
	"unsafe"

	"google.golang.org/grpc"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/hub"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// Bounds of the shared delta encodings (docs/limits.md, "Memory").
const (
	// sharedDeltas is how many of a hub's newest encoded deltas are kept
	// for the filter streams still behind: subscribers read the hub's one
	// log in order, so they meet the same few deltas within a moment of
	// each other. A subscriber further behind encodes again (and is
	// counted), nothing else changes.
	sharedDeltas = 16
	// sharedDeltaBytes bounds the encoded deltas kept beside the newest
	// one, with the images their keys keep alive; a larger delta is kept
	// alone.
	sharedDeltaBytes = 4 << 20
)

// deltaKey names one delta of a hub's log. The hub shares a delta's images
// with every subscriber and never modifies them (hub.Hub.Apply), so the
// address of the image array names the delta; an entry holds that array,
// so the address is not reused while the key exists. An empty delta is
// named by its header alone, which is all its encoding holds.
type deltaKey struct {
	id        ckf.ProducerIdentity
	base, seq uint64
	images    *ckf.BucketImage
	n         int
}

func keyOf(d *ckf.Delta) deltaKey {
	k := deltaKey{id: d.Identity, base: d.BaseSequence, seq: d.Sequence, n: len(d.Images)}
	if len(d.Images) > 0 {
		k.images = &d.Images[0]
	}
	return k
}

// sharedDelta is one delta's FilterUpdate, marshalled once (by the first
// stream that needs it) and sent as is on every stream of the hub.
type sharedDelta struct {
	key  deltaKey
	once sync.Once
	msg  *grpc.PreparedMsg
	size int
	err  error
}

// deltaCache is the shared encodings of one hub's deltas, used by the
// filter streams subscribed to it.
type deltaCache struct {
	mu      sync.Mutex
	streams int            // filter streams using it: the cache goes with the last
	entries []*sharedDelta // oldest first
	bytes   int            // bytes entries hold: messages and the images their keys keep alive
}

// deltaCache returns the delta cache of h for a new filter stream; release
// when the stream ends.
func (g *Server) deltaCache(h *hub.Hub) (c *deltaCache, release func()) {
	g.cachesMu.Lock()
	defer g.cachesMu.Unlock()
	c = g.caches[h]
	if c == nil {
		c = &deltaCache{}
		g.caches[h] = c
	}
	c.mu.Lock()
	c.streams++
	c.mu.Unlock()
	return c, func() {
		g.cachesMu.Lock()
		defer g.cachesMu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.streams--; c.streams == 0 {
			delete(g.caches, h)
		}
	}
}

// get returns the entry of d's key, adding an empty one (evicting the
// oldest beyond the bounds) when there is none.
func (c *deltaCache) get(d *ckf.Delta) *sharedDelta {
	k := keyOf(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.entries) - 1; i >= 0; i-- {
		if c.entries[i].key == k {
			return c.entries[i]
		}
	}
	e := &sharedDelta{key: k}
	c.entries = append(c.entries, e)
	return e
}

// sized records e's encoded size and evicts the oldest entries beyond the
// bounds (never e).
func (c *deltaCache) sized(e *sharedDelta, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.size = n
	c.bytes += n
	for len(c.entries) > 1 && (len(c.entries) > sharedDeltas || c.bytes > sharedDeltaBytes) && c.entries[0] != e {
		c.bytes -= c.entries[0].size
		c.entries[0] = nil
		c.entries = c.entries[1:]
	}
}

// prepare marshals d's FilterUpdate once for every stream of the cache:
// its CBI1 payload and its protobuf message, with one send_ts_us, the time
// of this encoding (docs/RATIONALE.md "Why is a delta's FilterUpdate
// marshalled once for all subscribers?"). stream gives the codec.
func (ps *poolStream) prepare(d *ckf.Delta) (*grpc.PreparedMsg, error) {
	e := ps.cache.get(d)
	e.once.Do(func() {
		ps.g.deltaEncodes.Add(1)
		payload, err := cbi1.AppendFrame(nil, &cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindDelta, Format: d.Identity.Format,
			DCID: d.Identity.Pool.DCID, Epoch: d.Sequence}, BaseEpoch: d.BaseSequence, Images: d.Images})
		if err != nil {
			e.err = err
			return
		}
		u := &kvrelaypb.FilterUpdate{Producer: producerToWire(d.Identity), BaseSequence: d.BaseSequence, Sequence: d.Sequence,
			SendTsUs: uint64(time.Now().UnixMicro()), Kind: kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_DELTA, Payload: payload}
		kvrelay.StampResponse(u, ps.g.id)
		msg := &grpc.PreparedMsg{}
		if e.err = msg.Encode(ps.stream, u); e.err == nil {
			e.msg = msg
			// The entry holds the marshalled message (the payload and a
			// small envelope) and, through its key, the delta's images.
			ps.cache.sized(e, len(payload)+len(d.Images)*int(unsafe.Sizeof(ckf.BucketImage{})))
		}
	})
	return e.msg, e.err
}
