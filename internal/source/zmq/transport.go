package zmq

import (
	"bufio"
	"context"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// bufferedTCP names zmq4's TCP transport with a read buffer on every
// connection; the source's SUB sockets use it for tcp:// endpoints.
//
// zmq4 reads each frame with io.ReadFull on the bare connection: a 2-byte
// header, the rest of a long header, then the body, so an engine message
// (topic, sequence, payload) costs about seven read system calls. On the
// virtual machines measured here a system call is expensive (the kernel's
// paravirtualised interrupt toggling was 20% of a `perf` profile of
// BenchmarkIngest), and zmq4's reads were 18% of the whole process's CPU.
// Reading through a 64 KiB buffer takes one call for as many messages as
// have arrived (docs/RATIONALE.md, "Why does the ZMQ source read through its
// own buffered transport?").
const bufferedTCP = "ckfrelay-tcp"

// readBufferSize holds a few typical engine batches (≈ 20–25 KB for 64
// events of 4 blocks); a larger body is read straight into its frame.
const readBufferSize = 64 << 10

func init() {
	if err := zmq4.RegisterTransport(bufferedTCP, bufferedTransport{transport.New("tcp")}); err != nil {
		panic(err) // only on a duplicate name: a programming error
	}
}

// subEndpoint is the endpoint the source's SUB socket dials or binds for ep:
// tcp:// endpoints go through bufferedTCP; others (ipc, inproc) are kept.
func subEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return bufferedTCP + "://" + rest
	}
	return ep
}

type bufferedTransport struct{ transport.Transport }

func (t bufferedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return newBufferedConn(c), nil
}

func (t bufferedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return bufferedListener{l}, nil
}

type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newBufferedConn(c), nil
}

// bufferedConn reads through a buffer and writes straight through.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func newBufferedConn(c net.Conn) *bufferedConn {
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, readBufferSize)}
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
