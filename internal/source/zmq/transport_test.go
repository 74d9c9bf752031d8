package zmq

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingConn counts the reads that reach the connection.
type countingConn struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

func TestSubEndpoint_BuffersOnlyTCP(t *testing.T) {
	assert.Equal(t, guardedTCP+"://127.0.0.1:5557", subEndpoint("tcp://127.0.0.1:5557"))
	assert.Equal(t, guardedTCP+"://*:5557", subEndpoint("tcp://*:5557"))
	assert.Equal(t, "ipc:///tmp/x", subEndpoint("ipc:///tmp/x"))
	assert.Equal(t, "inproc://x", subEndpoint("inproc://x"))
}

// TestBufferedConn_ReadsManyFramesPerSystemCall reads 20 three-frame
// messages the way zmq4 does (a 2-byte frame header, then the body) from a
// real TCP connection: through the buffer that takes a few reads of the
// socket, not the 120 the bare connection would see.
func TestBufferedConn_ReadsManyFramesPerSystemCall(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var wire bytes.Buffer
	const messages = 20
	for m := range messages {
		for f, body := range [][]byte{{}, bytes.Repeat([]byte{byte(m)}, 8), bytes.Repeat([]byte{byte(m)}, 200)} {
			flags := byte(0x01) // more frames follow
			if f == 2 {
				flags = 0
			}
			wire.Write([]byte{flags, byte(len(body))})
			wire.Write(body)
		}
	}
	w, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer w.Close()
	raw, err := l.Accept()
	require.NoError(t, err)
	defer raw.Close()
	_, err = w.Write(wire.Bytes()) // all of it in the socket before reading
	require.NoError(t, err)
	counted := &countingConn{Conn: raw}
	c := &zmtpConn{Conn: counted, r: bufio.NewReaderSize(counted, readBufferSize), g: guardOf(context.Background()),
		t: frameTracker{lim: frameLimits{MaxMessage: DefaultMaxMessageBytes, MaxFrames: MaxFramesPerMessage}}}
	for m := range messages {
		for f := range 3 {
			var hdr [2]byte
			_, err := io.ReadFull(c, hdr[:])
			require.NoError(t, err)
			body := make([]byte, hdr[1])
			_, err = io.ReadFull(c, body)
			require.NoError(t, err)
			if f > 0 {
				assert.Equal(t, byte(m), body[0])
			}
		}
	}
	assert.LessOrEqual(t, counted.reads.Load(), int64(5), "reads that reached the socket for %d frame reads", messages*3*2)
}
