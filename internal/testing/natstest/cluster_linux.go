package natstest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes a cluster node die with the test binary: a test
// killed by its timeout (or by hand) runs no cleanup, and its nats-servers
// would outlive it holding ports and CPU.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
