//go:build !linux

package natstest

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; elsewhere a killed
// test binary leaves its nats-servers to the test's cleanup.
func dieWithParent(*exec.Cmd) {}
