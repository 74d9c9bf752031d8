package engine

import (
	"fmt"
	"net"
)

func portsFree(base, n int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}
