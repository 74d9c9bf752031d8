//go:build !linux

package server

import "net"

// tcpProbe is Linux-only (TCP_INFO); elsewhere no stall is detected and the
// stream write timeout is the bound.
func tcpProbe(net.Conn) func() (sendProgress, bool) { return nil }
