package server

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// tcpProbe reads TCP_INFO of c's socket: bytes_acked, and unacked segments
// plus not-yet-sent bytes as "pending" (any non-zero value is what counts).
func tcpProbe(c net.Conn) func() (sendProgress, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return func() (sendProgress, bool) {
		var info *unix.TCPInfo
		var ierr error
		if err := raw.Control(func(fd uintptr) {
			info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		}); err != nil || ierr != nil {
			return sendProgress{}, false
		}
		return sendProgress{acked: info.Bytes_acked, pending: uint64(info.Unacked) + uint64(info.Notsent_bytes)}, true
	}
}
