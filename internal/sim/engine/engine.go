// Package engine is an inference-engine emulator for the ZMQ source's tests,
// benchmarks and the demo: a real ZMQ PUB socket publishing KV-event batches
// the way vLLM, SGLang and TensorRT-LLM do, and a real ROUTER replay socket,
// with the faults a source must survive (dropped, duplicated and garbage
// messages, restarts, silence) under the caller's control. It keeps the
// ground truth: the blocks the engine holds.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// Form is how events are encoded.
type Form int

// Event forms engines have shipped.
const (
	// Positional is msgspec's array_like tagged union: ["BlockStored", …].
	Positional Form = iota
	// Named is a map tagged under "type" (newer vLLM and SGLang).
	Named
)

// Layout is the replay reply layout.
type Layout int

// Replay layouts engines have shipped.
const (
	// SeqPayload replies [seq, payload], ends with [-1, ""] (older vLLM).
	SeqPayload Layout = iota
	// TopicSeqPayload replies [topic, seq, payload], ends with ["", -1, ""].
	TopicSeqPayload
)

// Config configures an emulated engine (one DP rank).
type Config struct {
	// Endpoint is where the PUB socket binds (e.g. "tcp://127.0.0.1:5557");
	// Replay where the ROUTER binds ("" for none).
	Endpoint, Replay string
	// Connect makes the PUB socket connect to Endpoint instead (a relay
	// that binds).
	Connect bool
	Topic   string
	DPRank  uint32
	// OmitDPRank sends nil as the batch's data_parallel_rank.
	OmitDPRank bool
	// PublisherID adds the 4th batch element, a fresh id per lifetime.
	PublisherID bool
	Form        Form
	Layout      Layout
	// BlockSize in tokens (default 16); BufferSteps batches kept for
	// replay (default 10,000).
	BlockSize, BufferSteps int
	// Medium is sent on every event ("" sends nil).
	Medium string
	// Seed seeds the engine's choices (hash encodings, tokens).
	Seed uint64
}

// Block is one block the engine holds.
type Block struct {
	Hash      uint64 // the engine's (external) block hash
	Parent    uint64 // 0 for a root
	Tokens    []uint32
	Canonical uint64 // the relay's canonical hash (SPEC §3 chain)
}

type buffered struct {
	seq     int64
	payload []byte
}

// Engine is one emulated engine rank.
type Engine struct {
	cfg Config
	rng *mrand.Rand

	mu       sync.Mutex
	pub      zmq4.Socket
	router   zmq4.Socket
	cancel   context.CancelFunc
	done     chan struct{}
	seq      int64
	buf      []buffered
	pubID    []byte
	blocks   map[uint64]Block
	drop     int
	lastSent [][]byte
	lifetime int
}

var quiet = log.New(io.Discard, "", 0)

// Pause points for tests: replayReceived runs when the replay server has a
// request, replayStopping when a close waits for the server to stop.
var replayReceived, replayStopping func()

// Start binds (or connects) the engine's sockets.
func Start(cfg Config) (*Engine, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = 10_000
	}
	e := &Engine{cfg: cfg, rng: mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), blocks: map[uint64]Block{}}
	if err := e.open(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Engine) open() error {
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(quiet))
	var err error
	if e.cfg.Connect {
		err = pub.Dial(e.cfg.Endpoint)
	} else {
		err = pub.Listen(e.cfg.Endpoint)
	}
	if err != nil {
		cancel()
		pub.Close()
		return fmt.Errorf("engine: pub %s: %w", e.cfg.Endpoint, err)
	}
	e.pub, e.cancel, e.done = pub, cancel, make(chan struct{})
	e.lifetime++
	if e.cfg.PublisherID {
		e.pubID = make([]byte, 16)
		_, _ = rand.Read(e.pubID)
	}
	if e.cfg.Replay == "" {
		close(e.done)
		return nil
	}
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(quiet))
	if err := router.Listen(e.cfg.Replay); err != nil {
		cancel()
		pub.Close()
		router.Close()
		return fmt.Errorf("engine: replay %s: %w", e.cfg.Replay, err)
	}
	e.router = router
	go e.serveReplay(ctx, router, e.done)
	return nil
}

// PubAddr is the PUB socket's bound address (for port 0 endpoints).
func (e *Engine) PubAddr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub == nil {
		return e.cfg.Endpoint
	}
	if a := e.pub.Addr(); a != nil {
		return "tcp://" + a.String()
	}
	return e.cfg.Endpoint
}

func (e *Engine) serveReplay(ctx context.Context, router zmq4.Socket, done chan struct{}) {
	defer close(done)
	for {
		m, err := router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue // a client went away; keep serving, as vLLM does
		}
		if replayReceived != nil {
			replayReceived()
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue // as vLLM: an invalid request is ignored
		}
		id, start := m.Frames[0], int64(binary.BigEndian.Uint64(m.Frames[2]))
		e.mu.Lock()
		var out []buffered
		for _, b := range e.buf {
			if b.seq >= start {
				out = append(out, b)
			}
		}
		e.mu.Unlock()
		for _, b := range out {
			if router.SendMulti(e.replyMsg(id, b.seq, b.payload)) != nil {
				break
			}
		}
		_ = router.SendMulti(e.replyMsg(id, -1, []byte{}))
	}
}

func (e *Engine) replyMsg(id []byte, seq int64, payload []byte) zmq4.Msg {
	s := binary.BigEndian.AppendUint64(nil, uint64(seq))
	if e.cfg.Layout == TopicSeqPayload {
		topic := []byte(e.cfg.Topic)
		if seq == -1 {
			topic = []byte{}
		}
		return zmq4.NewMsgFrom(id, []byte{}, topic, s, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, s, payload)
}

// Close closes the engine's sockets.
func (e *Engine) Close() error {
	e.mu.Lock()
	finish := e.detachLocked()
	e.mu.Unlock()
	return finish()
}

// detachLocked takes the sockets out of e (e.mu held) and returns what
// closes them and waits for the replay server, to be called without e.mu:
// the replay server takes e.mu to read the buffer.
func (e *Engine) detachLocked() func() error {
	pub, router, cancel, done := e.pub, e.router, e.cancel, e.done
	e.pub, e.router = nil, nil
	return func() error {
		if pub == nil {
			return nil
		}
		cancel()
		err := pub.Close()
		if router != nil {
			err = errors.Join(err, router.Close())
			if replayStopping != nil {
				replayStopping()
			}
			<-done
		}
		return err
	}
}

// Restart simulates an engine process restart: sockets closed and bound
// again, sequence back to 0, replay buffer and cache (the ground truth)
// empty, a new publisher id.
func (e *Engine) Restart() error {
	e.mu.Lock()
	finish := e.detachLocked()
	e.mu.Unlock()
	// The library reports closing an already-closed connection as an
	// error; a restart only needs the sockets gone.
	_ = finish()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq, e.buf, e.blocks, e.drop, e.lastSent = 0, nil, map[uint64]Block{}, 0, nil
	var err error
	for range 50 { // the old listener's port may take a moment to free
		if err = e.open(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// DropNext makes the next n batches go to the replay buffer but not to
// subscribers (a lost message).
func (e *Engine) DropNext(n int) {
	e.mu.Lock()
	e.drop += n
	e.mu.Unlock()
}

// SkipTo makes seq the sequence of the next batch, as an engine that has
// published for long would (its replay buffer emptied: it holds only what
// follows). Past 2^63-1 the engine goes on as a Python publisher's counter
// does: 2^63 on the wire, which a signed reader sees as -2^63.
func (e *Engine) SkipTo(seq int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq, e.buf = seq, nil
}

// PublisherID is the publisher_id of the engine's current lifetime (nil
// when the engine sends none).
func (e *Engine) PublisherID() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.pubID)
}

// Seq is the sequence of the last batch published (-1 before any).
func (e *Engine) Seq() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq - 1
}

// Lifetime counts the engine's starts (1 before any restart).
func (e *Engine) Lifetime() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lifetime
}

// Truth returns the blocks the engine holds.
func (e *Engine) Truth() map[uint64]Block {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[uint64]Block, len(e.blocks))
	for k, v := range e.blocks {
		out[k] = v
	}
	return out
}

// Held returns the hashes of the blocks the engine holds, sorted.
func (e *Engine) Held() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]uint64, 0, len(e.blocks))
	for h := range e.blocks {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// Heartbeat publishes an empty batch, as an idle engine does every second.
func (e *Engine) Heartbeat() error { return e.publish(nil) }

// Store stores n new blocks chained under parent (0: a new root) in one
// BlockStored event and returns them.
func (e *Engine) Store(parent uint64, n int) ([]Block, error) {
	e.mu.Lock()
	var prevCanon uint64
	if parent != 0 {
		p, ok := e.blocks[parent]
		if !ok {
			e.mu.Unlock()
			return nil, fmt.Errorf("engine: parent %#x not held", parent)
		}
		prevCanon = p.Canonical
	}
	blocks := make([]Block, n)
	prev := parent
	for i := range blocks {
		toks := make([]uint32, e.cfg.BlockSize)
		for j := range toks {
			toks[j] = e.rng.Uint32N(200_000)
		}
		h := e.rng.Uint64() | 1 // never 0, which means "no parent" here
		local := ckf.LocalBlockHash(toks, ckf.BaseSalt)
		c := local
		if prev != 0 {
			c = ckf.ChainHash(prevCanon, local)
		}
		blocks[i] = Block{Hash: h, Parent: prev, Tokens: toks, Canonical: c}
		prev, prevCanon = h, c
	}
	ev := e.storedEvent(blocks, parent)
	for _, b := range blocks {
		e.blocks[b.Hash] = b
	}
	e.mu.Unlock()
	return blocks, e.publish([]any{ev})
}

// Remove evicts blocks (they need not be leaves: engines evict freely).
func (e *Engine) Remove(hashes ...uint64) error {
	e.mu.Lock()
	for _, h := range hashes {
		delete(e.blocks, h)
	}
	ev := e.removedEvent(hashes)
	e.mu.Unlock()
	return e.publish([]any{ev})
}

// Clear publishes AllBlocksCleared.
func (e *Engine) Clear() error {
	e.mu.Lock()
	e.blocks = map[uint64]Block{}
	ev := e.encode(Event{Type: "AllBlocksCleared"})
	e.mu.Unlock()
	return e.publish([]any{ev})
}

// Duplicate sends the last batch sent again.
func (e *Engine) Duplicate() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastSent == nil || e.pub == nil {
		return nil
	}
	return e.pub.SendMulti(zmq4.NewMsgFrom(e.lastSent...))
}

// SendRaw sends arbitrary frames on the PUB socket (garbage), outside the
// sequence.
func (e *Engine) SendRaw(frames ...[]byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub == nil {
		return errors.New("engine: engine closed")
	}
	return e.pub.SendMulti(zmq4.NewMsgFrom(frames...))
}

// hashValue encodes h as engines may: uint64, int64 (two's complement) or
// a 32-byte digest whose last 8 bytes are h.
func (e *Engine) hashValue(h uint64) any {
	switch e.rng.IntN(3) {
	case 0:
		return h
	case 1:
		return int64(h)
	}
	d := make([]byte, 32)
	for i := range 24 {
		d[i] = byte(e.rng.Uint32())
	}
	binary.BigEndian.PutUint64(d[24:], h)
	return d
}

func (e *Engine) medium() any {
	if e.cfg.Medium == "" {
		return nil
	}
	return e.cfg.Medium
}

func (e *Engine) storedEvent(blocks []Block, parent uint64) any {
	hashes := make([]uint64, len(blocks))
	var toks []uint32
	for i, b := range blocks {
		hashes[i] = b.Hash
		toks = append(toks, b.Tokens...)
	}
	return e.encode(Event{Type: "BlockStored", BlockHashes: hashes, Parent: parent, HasParent: parent != 0, TokenIDs: toks})
}

// Event is one event to publish as given (see [Engine.Publish]).
type Event struct {
	Type        string // "BlockStored", "BlockRemoved", "AllBlocksCleared"
	BlockHashes []uint64
	HasParent   bool
	Parent      uint64
	TokenIDs    []uint32
	BlockSize   int // 0: the engine's
}

// encode writes ev in the engine's form, hashes in a random encoding.
func (e *Engine) encode(ev Event) any {
	hashes := make([]any, len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		hashes[i] = e.hashValue(h)
	}
	bs := ev.BlockSize
	if bs == 0 {
		bs = e.cfg.BlockSize
	}
	var par any
	if ev.HasParent {
		par = e.hashValue(ev.Parent)
	}
	switch {
	case ev.Type == "BlockStored" && e.cfg.Form == Named:
		return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": par,
			"token_ids": ev.TokenIDs, "block_size": bs, "lora_id": nil, "medium": e.medium(),
			"lora_name": nil, "extra_keys": nil, "group_idx": 0, "locality": "LOCAL", "future_field": []any{1, "x"}}
	case ev.Type == "BlockStored":
		return []any{"BlockStored", hashes, par, ev.TokenIDs, bs, nil, e.medium(), nil, nil, 0, "full_attention", nil}
	case ev.Type == "BlockRemoved" && e.cfg.Form == Named:
		return map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": e.medium(), "group_idx": 0}
	case ev.Type == "BlockRemoved":
		return []any{"BlockRemoved", hashes, e.medium(), 0}
	case e.cfg.Form == Named:
		return map[string]any{"type": ev.Type}
	}
	return []any{ev.Type}
}

// Publish sends events as given in one batch, for callers that keep their
// own ground truth (the demo's fleet); the engine's Truth is not updated.
func (e *Engine) Publish(events ...Event) error {
	e.mu.Lock()
	enc := make([]any, len(events))
	for i, ev := range events {
		enc[i] = e.encode(ev)
	}
	e.mu.Unlock()
	return e.publish(enc)
}

// EncodeBatch returns the payload of a batch of events, for callers that
// publish it later with [Engine.PublishEncoded] (a benchmark's publisher
// that must not spend its time encoding).
func (e *Engine) EncodeBatch(events ...Event) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	enc := make([]any, len(events))
	for i, ev := range events {
		enc[i] = e.encode(ev)
	}
	return e.payload(enc)
}

// PublishEncoded publishes a payload from [Engine.EncodeBatch] as the next
// batch. Like Publish, it leaves Truth alone.
func (e *Engine) PublishEncoded(payload []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.send(payload)
}

// HeartbeatEvery publishes an empty batch every d, as an idle vLLM engine
// does every second, until stop is called.
func (e *Engine) HeartbeatEvery(d time.Duration) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = e.Heartbeat()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func (e *Engine) removedEvent(hashes []uint64) any {
	return e.encode(Event{Type: "BlockRemoved", BlockHashes: hashes})
}

// Payload encodes a batch of events as the engine would.
func (e *Engine) payload(events []any) ([]byte, error) {
	ts := float64(time.Now().UnixNano()) / 1e9
	batch := []any{ts, events}
	if events == nil {
		batch[1] = []any{}
	}
	var dp any = e.cfg.DPRank
	if e.cfg.OmitDPRank {
		dp = nil
	}
	batch = append(batch, dp)
	if e.cfg.PublisherID {
		batch = append(batch, e.pubID)
	}
	return msgpack.Marshal(batch)
}

func (e *Engine) publish(events []any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pub == nil {
		return errors.New("engine: engine closed")
	}
	p, err := e.payload(events)
	if err != nil {
		return err
	}
	return e.send(p)
}

// send publishes payload p as the next batch (e.mu held).
func (e *Engine) send(p []byte) error {
	if e.pub == nil {
		return errors.New("engine: engine closed")
	}
	seq := e.seq
	e.seq++
	e.buf = append(e.buf, buffered{seq, p})
	if over := len(e.buf) - e.cfg.BufferSteps; over > 0 {
		e.buf = slices.Delete(e.buf, 0, over)
	}
	if e.drop > 0 {
		e.drop--
		return nil
	}
	frames := [][]byte{[]byte(e.cfg.Topic), binary.BigEndian.AppendUint64(nil, uint64(seq)), p}
	e.lastSent = frames
	return e.pub.SendMulti(zmq4.NewMsgFrom(frames...))
}

// FreePorts returns a base port with n consecutive free loopback ports (as
// vLLM lays out DP ranks), checked by binding them.
func FreePorts(n int) (int, error) {
	for range 100 {
		base := 20000 + mrand.IntN(40000)
		if base+n > math.MaxUint16 {
			continue
		}
		if portsFree(base, n) {
			return base, nil
		}
	}
	return 0, errors.New("engine: no free port range")
}
