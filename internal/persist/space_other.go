//go:build !unix

package persist

import "math"

// freeBytes reports unlimited space where statfs is not available: the
// reserve check is off, and a failed write is still contained (store.go).
func freeBytes(string) (uint64, error) { return math.MaxUint64, nil }
