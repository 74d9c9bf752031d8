package zmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-zeromq/zmq4"
)

// This file holds the ZMTP 3.x checks the source's transport applies to a
// peer's bytes before go-zeromq/zmq4 sees them (rfc.zeromq.org/spec:23):
// the peer's greeting and READY command, checked in full before the
// library's handshake runs, and every later frame header, checked before the
// library allocates the body it announces. zmq4 trusts both: it allocates
// any announced length (2^40 is an out-of-memory crash, 2^62 a makeslice
// panic) and its metadata parser indexes past a short READY body.

// ErrPeerRefused is wrapped by every error that makes the transport drop a
// peer's connection; the source counts them (Status.PeersRefused).
var ErrPeerRefused = errors.New("zmq source: peer refused")

// ZMTP 3.x constants.
const (
	greetingLen  = 64
	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xf8
	// maxHandshakeFrame bounds the peer's READY command (its socket type
	// and identity, at most 255 bytes, plus any user metadata).
	maxHandshakeFrame = 16 << 10
)

// ourGreeting is the greeting zmq4 v0.17.0 sends: signature, version 3.0,
// mechanism NULL, as-server 0, filler. The transport sends it itself, so it
// can read the peer's whole greeting before zmq4's handshake starts, and
// absorbs zmq4's identical copy (zmtpConn.Write).
var ourGreeting = func() [greetingLen]byte {
	var g [greetingLen]byte
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// refused builds a peer-refusal error.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrPeerRefused, fmt.Sprintf(format, args...))
}

// checkGreeting checks a peer's 64-byte greeting: ZMTP signature, major
// version ≥ 3 (zmq4 speaks 3.0, and accepts later minors), mechanism NULL.
func checkGreeting(g []byte) error {
	if len(g) != greetingLen {
		return refused("greeting of %d bytes", len(g))
	}
	if g[0] != 0xff || g[9] != 0x7f {
		return refused("not a ZMTP 3 greeting (signature % x)", g[:10])
	}
	if g[10] < 3 {
		return refused("ZMTP version %d.%d (3.0 or later is required)", g[10], g[11])
	}
	mech := string(bytes.TrimRight(g[12:32], "\x00"))
	if mech != "NULL" {
		return refused("security mechanism %q (only NULL is served)", mech)
	}
	if g[32] > 1 {
		return refused("as-server flag %d", g[32])
	}
	return nil
}

// readHandshakeFrame reads the peer's first frame after the greeting: it
// must be one command frame of at most maxHandshakeFrame bytes. It returns
// the frame's bytes as read (header included) and its body.
func readHandshakeFrame(r io.Reader) (raw, body []byte, err error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:2]); err != nil {
		return nil, nil, err
	}
	fl := hdr[0]
	if fl&flagCommand == 0 || fl&(flagMore|flagReserved) != 0 {
		return nil, nil, refused("handshake frame flags %#02x: want one command frame", fl)
	}
	n, size := 2, uint64(hdr[1])
	if fl&flagLong != 0 {
		if _, err := io.ReadFull(r, hdr[2:]); err != nil {
			return nil, nil, err
		}
		n, size = 9, binary.BigEndian.Uint64(hdr[1:])
	}
	if size > maxHandshakeFrame {
		return nil, nil, refused("handshake command of %d bytes (limit %d)", size, maxHandshakeFrame)
	}
	raw = make([]byte, n+int(size))
	copy(raw, hdr[:n])
	if _, err := io.ReadFull(r, raw[n:]); err != nil {
		return nil, nil, err
	}
	return raw, raw[n:], nil
}

// checkReady parses a READY command body (name, then properties of a
// 1-byte name length, name, 4-byte big-endian value length, value) and
// checks that the peer's Socket-Type can talk to own. Every length is
// checked against the body, so zmq4's own parser, which trusts them, sees
// only a well-formed body.
func checkReady(cmd []byte, own zmq4.SocketType) error {
	if len(cmd) < 1 || int(cmd[0]) > len(cmd)-1 {
		return refused("truncated command name")
	}
	name, p := string(cmd[1:1+int(cmd[0])]), cmd[1+int(cmd[0]):]
	if name != zmq4.CmdReady {
		return refused("handshake command %q: want READY (NULL mechanism)", name)
	}
	var peer string
	seen := false
	for len(p) > 0 {
		kl := int(p[0])
		if kl == 0 || 1+kl+4 > len(p) {
			return refused("truncated READY property")
		}
		key := string(p[1 : 1+kl])
		vl := binary.BigEndian.Uint32(p[1+kl:])
		p = p[1+kl+4:]
		if uint64(vl) > uint64(len(p)) {
			return refused("READY property %q of %d bytes overruns the command", key, vl)
		}
		if strings.EqualFold(key, "Socket-Type") {
			peer, seen = string(p[:vl]), true
		}
		p = p[vl:]
	}
	if !seen {
		return refused("READY without Socket-Type")
	}
	if !own.IsCompatible(zmq4.SocketType(peer)) {
		return refused("peer socket type %q cannot talk to %s", peer, own)
	}
	return nil
}

// frameLimits bound what one peer may announce after the handshake.
type frameLimits struct {
	// MaxMessage bounds a message's frame bodies together (and so each
	// frame); MaxFrames a message's frame count.
	MaxMessage uint64
	MaxFrames  int
}

// frameTracker follows the ZMTP frame headers in the byte stream a peer
// sends after its handshake, so that an announced length above the limits
// is refused before the reader (zmq4) has the whole header and allocates.
// Its work per call is O(frames in the bytes scanned), not O(bytes).
type frameTracker struct {
	lim frameLimits

	state   int    // trackFlags, trackSize, trackBody
	flags   byte   // of the frame being read
	need    int    // size bytes still to read (trackSize)
	size    uint64 // size accumulated (trackSize)
	body    uint64 // body bytes still to pass (trackBody)
	msg     uint64 // body bytes of the message so far
	frames  int    // frames of the message so far
	last    bool   // the frame being passed ends a message (not a command)
	done    uint64 // messages passed whole
	failure error  // sticky
}

const (
	trackFlags = iota
	trackSize
	trackBody
)

// scan passes b through the tracker. It returns len(b) and nil, or the
// count of leading bytes that may be delivered (stopping before the byte
// that completes an oversized header) and the refusal, which stays.
func (t *frameTracker) scan(b []byte) (int, error) {
	if t.failure != nil {
		return 0, t.failure
	}
	for i := 0; i < len(b); {
		switch t.state {
		case trackBody:
			n := min(uint64(len(b)-i), t.body)
			t.body -= n
			i += int(n)
			if t.body == 0 {
				t.bodyDone()
			}
		case trackFlags:
			t.flags = b[i]
			if t.flags&flagReserved != 0 {
				t.failure = refused("frame flags %#02x have reserved bits set", t.flags)
				return i, t.failure
			}
			t.state, t.size, t.need = trackSize, 0, 1
			if t.flags&flagLong != 0 {
				t.need = 8
			}
			i++
		case trackSize:
			t.size = t.size<<8 | uint64(b[i])
			if t.need--; t.need > 0 {
				i++
				continue
			}
			if err := t.frameDone(); err != nil {
				return i, err
			}
			i++
		}
	}
	return len(b), nil
}

// frameDone accounts a complete frame header.
func (t *frameTracker) frameDone() error {
	command := t.flags&flagCommand != 0
	if command && t.frames > 0 {
		t.failure = refused("command frame inside a message")
		return t.failure
	}
	t.frames++
	t.msg += t.size
	switch {
	case t.size > t.lim.MaxMessage || t.msg > t.lim.MaxMessage:
		t.failure = refused("message of more than %d bytes announced (frame of %d bytes)", t.lim.MaxMessage, t.size)
		return t.failure
	case t.frames > t.lim.MaxFrames:
		t.failure = refused("message of more than %d frames", t.lim.MaxFrames)
		return t.failure
	}
	if t.flags&flagMore == 0 || command {
		t.msg, t.frames = 0, 0
	}
	t.last = t.flags&flagMore == 0 && !command
	t.body = t.size
	t.state = trackBody
	if t.body == 0 {
		t.bodyDone()
	}
	return nil
}

// bodyDone ends a frame whose body has passed.
func (t *frameTracker) bodyDone() {
	t.state = trackFlags
	if t.last {
		t.done++
	}
}
