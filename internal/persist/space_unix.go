//go:build unix

package persist

import "syscall"

// freeBytes returns the bytes an unprivileged writer may still use on the
// file system holding dir (statfs: available blocks × block size).
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}
