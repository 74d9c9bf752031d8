package persist

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// The journal's high-water mark: the last position known committed, kept in
// a small file of its own beside the database (one per pool), outside
// Pebble's write-ahead log. Pebble replays a damaged or truncated newest log
// up to the damage and opens without a word, and a deleted log simply is
// not replayed; the mark, written after each commit, then lies above the
// journal's last position and says how many commands went missing
// (docs/RATIONALE.md "Why a high-water mark beside the database, and why
// does a damaged journal start the pool degraded?").
//
// The mark is written after the commit's fsync and is not synced itself:
// it never runs ahead of the durable journal, so a crash or power loss can
// only leave it behind (detecting less), never raise a false alarm.
//
// Layout: "CKHW", the position (8 bytes big endian), and the CRC-32 (IEEE)
// of those 12 bytes. A file that does not check out claims nothing.

const markMagic = "CKHW"

// markPath names pool's mark file: a hash, since pool names may hold any
// byte a file name may not.
func markPath(dir, pool string) string {
	h := sha256.Sum256([]byte(pool))
	return filepath.Join(dir, "ckfrelay-hwm-"+hex.EncodeToString(h[:12]))
}

// What a mark file said when it was opened.
const (
	markMissing = "missing" // no file, or an empty one: no commit ever wrote it
	markDamaged = "damaged" // bytes that do not check out
)

// openMark opens (creating) pool's mark file and returns the position it
// holds, and — when it holds none — why not (markMissing, markDamaged).
func openMark(dir, pool string) (uint64, string, *os.File, error) {
	f, err := os.OpenFile(markPath(dir, pool), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, "", nil, fmt.Errorf("persist: high-water mark: %w", err)
	}
	var b [16]byte
	n, err := f.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		_ = f.Close()
		return 0, "", nil, fmt.Errorf("persist: high-water mark: %w", err)
	}
	pos, ok := decodeMark(b[:n])
	switch {
	case ok:
		return pos, "", f, nil
	case n == 0:
		return 0, markMissing, f, nil
	}
	return 0, markDamaged, f, nil
}

func encodeMark(b []byte, pos uint64) {
	copy(b, markMagic)
	binary.BigEndian.PutUint64(b[4:], pos)
	binary.BigEndian.PutUint32(b[12:], crc32.ChecksumIEEE(b[:12]))
}

func decodeMark(b []byte) (uint64, bool) {
	if len(b) < 16 || string(b[:4]) != markMagic || crc32.ChecksumIEEE(b[:12]) != binary.BigEndian.Uint32(b[12:]) {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[4:]), true
}

// writeMark records pos as committed; p.mu is held. A failed write is
// logged once: detection weakens, the journal itself is intact.
func (p *PoolLog) writeMark(pos uint64) {
	if p.mark == nil {
		return
	}
	var b [16]byte
	encodeMark(b[:], pos)
	if _, err := p.mark.WriteAt(b[:], 0); err != nil && !p.markErr {
		p.markErr = true
		p.opt.Logger.Warn("persist: writing the journal's high-water mark failed; a damaged journal may go unnoticed", "pool", p.pool, "err", err)
	}
}
