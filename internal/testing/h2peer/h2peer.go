// Package h2peer is a hostile HTTP/2 peer for the gRPC listener's tests: it
// opens streams that send only HEADERS, requests that declare a size and
// send part of it, and subscriptions that never read (no WINDOW_UPDATE),
// which a well-behaved gRPC client library cannot be made to do. It records
// what the server answers: its SETTINGS, RST_STREAM codes, each stream's
// grpc-status, GOAWAY and the connection's end.
package h2peer

import (
	"bytes"
	"encoding/binary"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Conn is one raw HTTP/2 client connection. Its methods are safe for
// concurrent use.
type Conn struct {
	nc     net.Conn
	closed chan struct{}

	wmu  sync.Mutex // framer writes, next, hpack encoder
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	next uint32

	mu        sync.Mutex
	settings  map[http2.SettingID]uint32
	rst       map[uint32]http2.ErrCode
	status    map[uint32]string // grpc-status of ended streams
	dataBytes int64
	goaway    bool
	pings     int              // PING acks received
	connWin   int64            // what the server lets us send on the connection
	streamWin map[uint32]int64 // … and on each stream, beyond the initial window
	initWin   int64
	changed   chan struct{} // closed and replaced on every recorded event
}

// Dial connects to addr, sends the client preface and empty SETTINGS, and
// starts reading what the server sends. It never sends WINDOW_UPDATE: the
// server can send at most 64 KiB on the connection.
func Dial(addr string) (*Conn, error) { return DialFrom(addr, "") }

// DialFrom is Dial from the local IP address ip ("" for any): on Linux every
// 127.0.0.0/8 address is loopback, so tests can give the hostile peer an
// address of its own.
func DialFrom(addr, ip string) (*Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if ip != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(ip)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, closed: make(chan struct{}), next: 1, settings: map[http2.SettingID]uint32{},
		rst: map[uint32]http2.ErrCode{}, status: map[uint32]string{}, changed: make(chan struct{}),
		connWin: 65535, streamWin: map[uint32]int64{}, initWin: 65535}
	c.fr = http2.NewFramer(nc, nc)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(); err != nil {
		nc.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *Conn) read() {
	defer close(c.closed)
	defer c.event(func() {})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			_ = f.ForeachSetting(func(s http2.Setting) error {
				c.event(func() {
					c.settings[s.ID] = s.Val
					if s.ID == http2.SettingInitialWindowSize {
						c.initWin = int64(s.Val)
					}
				})
				return nil
			})
			c.wmu.Lock()
			_ = c.fr.WriteSettingsAck()
			c.wmu.Unlock()
		case *http2.WindowUpdateFrame:
			c.event(func() {
				if f.StreamID == 0 {
					c.connWin += int64(f.Increment)
				} else {
					c.streamWin[f.StreamID] += int64(f.Increment)
				}
			})
		case *http2.PingFrame:
			if f.IsAck() {
				c.event(func() { c.pings++ })
			} else {
				c.wmu.Lock()
				_ = c.fr.WritePing(true, f.Data)
				c.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			c.event(func() { c.rst[f.StreamID] = f.ErrCode })
		case *http2.MetaHeadersFrame:
			if st := f.PseudoValue("status"); st != "" && st != "200" {
				c.event(func() { c.status[f.StreamID] = "http " + st })
			}
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					c.event(func() { c.status[f.StreamID] = hf.Value })
				}
			}
		case *http2.DataFrame:
			c.event(func() { c.dataBytes += int64(len(f.Data())) })
		case *http2.GoAwayFrame:
			c.event(func() { c.goaway = true })
		}
	}
}

// event records one change under mu and wakes waiters.
func (c *Conn) event(f func()) {
	c.mu.Lock()
	f()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// Closed is closed once the server has closed the connection (or Close).
func (c *Conn) Closed() <-chan struct{} { return c.closed }

// Open sends HEADERS for a gRPC call of method ("/pkg.Service/Method")
// without END_STREAM, with the extra header fields given as name, value
// pairs, and returns the stream id.
func (c *Conn) Open(method string, extra ...string) (uint32, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", method, ":authority", "relay",
		"content-type", "application/grpc", "te", "trailers"}, extra...)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	id := c.next
	c.next += 2
	return id, c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
}

// Data sends b on stream id, with END_STREAM when end.
func (c *Conn) Data(id uint32, b []byte, end bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(b) > 16384 {
		if err := c.fr.WriteData(id, false, b[:16384]); err != nil {
			return err
		}
		b = b[16384:]
	}
	return c.fr.WriteData(id, end, b)
}

// Send sends b on stream id as the server's flow-control windows allow,
// for at most d, and returns how many bytes it sent: it stops early when the
// stream ends or the connection closes.
func (c *Conn) Send(id uint32, b []byte, d time.Duration) int {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	sent := 0
	for sent < len(b) {
		c.mu.Lock()
		_, ended := c.status[id]
		_, reset := c.rst[id]
		win := min(c.connWin, c.initWin+c.streamWin[id]-int64(sent), 16384, int64(len(b)-sent))
		ch := c.changed
		c.mu.Unlock()
		if ended || reset {
			return sent
		}
		if win > 0 {
			c.wmu.Lock()
			err := c.fr.WriteData(id, false, b[sent:sent+int(win)])
			c.wmu.Unlock()
			if err != nil {
				return sent
			}
			c.mu.Lock()
			c.connWin -= win
			c.mu.Unlock()
			sent += int(win)
			continue
		}
		select {
		case <-ch:
		case <-c.closed:
			return sent
		case <-deadline.C:
			return sent
		}
	}
	return sent
}

// Ping sends a PING and waits up to d for its ack: the server has read
// every frame sent before it.
func (c *Conn) Ping(d time.Duration) bool {
	c.mu.Lock()
	want := c.pings + 1
	c.mu.Unlock()
	c.wmu.Lock()
	err := c.fr.WritePing(false, [8]byte{'h', '2', 'p', 'e', 'e', 'r'})
	c.wmu.Unlock()
	if err != nil {
		return false
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok, ch := c.pings >= want, c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-c.closed:
			return false
		case <-deadline.C:
			return false
		}
	}
}

// Message returns a gRPC length-prefixed message: declared is the length
// the prefix announces (len(body) for a whole message).
func Message(body []byte, declared uint32) []byte {
	out := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(out[1:], declared)
	return append(out, body...)
}

// Setting returns the server's value of a SETTINGS parameter, if it sent one.
func (c *Conn) Setting(id http2.SettingID) (uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.settings[id]
	return v, ok
}

// Refused returns how many streams the server reset with REFUSED_STREAM.
func (c *Conn) Refused() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, code := range c.rst {
		if code == http2.ErrCodeRefusedStream {
			n++
		}
	}
	return n
}

// Ended returns how many streams ended (a grpc-status or a reset).
func (c *Conn) Ended() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.rst)
	for id := range c.status {
		if _, ok := c.rst[id]; !ok {
			n++
		}
	}
	return n
}

// DataBytes returns the DATA payload bytes received.
func (c *Conn) DataBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dataBytes
}

// Wait waits up to d for stream id to end and returns its grpc-status (or
// "rst <code>"), "" if it had not ended by then or the connection closed
// first ("closed").
func (c *Conn) Wait(id uint32, d time.Duration) string {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		st, ok := c.status[id]
		code, reset := c.rst[id]
		ch := c.changed
		c.mu.Unlock()
		switch {
		case ok:
			return st
		case reset:
			return "rst " + strconv.Itoa(int(code))
		}
		select {
		case <-ch:
		case <-c.closed:
			return "closed"
		case <-deadline.C:
			return ""
		}
	}
}
