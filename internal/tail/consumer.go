package tail

import (
	"crypto/rand"
	"encoding/binary"
	"flag"
)

// ConsumerFlag defines --consumer, the consumer instance id a command's
// leases name; 0 (the default) means a random one (ConsumerID).
func ConsumerFlag(fs *flag.FlagSet) *uint64 {
	return fs.Uint64("consumer", 0, "consumer instance id (0: a random one). A lane belongs to the consumer that took it last: two commands, or a command and a router, under one id take each other's lanes")
}

// ConsumerID returns id, or a random non-zero id when id is 0. A fixed
// default made every `relay tail` and `relay query` one consumer, so two of
// them — or one and a production router left at that id — took each
// other's lanes on every resubscribe (found by a red-team pass: two
// queries answered not_ready 10 and 9 times in 20), and made the id a
// guess away for anyone who can reach the stream port.
func ConsumerID(id uint64) uint64 {
	for id == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
		id = binary.LittleEndian.Uint64(b[:])
	}
	return id
}
