package cbi1

// Assembler rebuilds a table from the decoded chunks of one snapshot, with
// the rules of Dynamo's snapshot assembly: chunk 0 starts a snapshot
// (abandoning any partial one); every further chunk must be the next index
// and carry the same epoch, chunk count and format, and start at the bucket
// where the previous one ended; the last chunk must end at the bucket count.
// It also requires the same dc_id throughout. Any violation abandons the
// snapshot. Nothing is exposed before the last chunk has been checked.
//
// The zero Assembler is ready to use. Its table buffer is reused across
// snapshots. An Assembler is not safe for concurrent use.
type Assembler struct {
	words      []uint64
	header     Header // of chunk 0
	count      uint32
	next       uint32 // the chunk index expected next
	nextBucket uint64 // the bucket the next chunk starts at
	active     bool   // a snapshot is in progress
	complete   bool   // words holds a completed snapshot
}

// Add stages one decoded snapshot chunk. It reports complete = true when f
// was the last chunk of a snapshot that covers the table: [Assembler.Words]
// and [Assembler.Header] then describe it until the next call to Add or
// Reset. A violation returns an [*Error] wrapping [ErrChunkSequence] or
// [ErrIncompleteCoverage] (or [ErrMalformed] for a hand-built Frame that
// [Decode] would have rejected) and abandons the snapshot in progress. Cost:
// O(len(f.Words)), plus O(bucket count) to clear the table at chunk 0.
func (a *Assembler) Add(f *Frame) (complete bool, err error) {
	a.complete = false
	if f.Kind != KindSnapshotChunk {
		a.Reset()
		return false, decodeErr(ErrChunkSequence, offFlags, "flags", "%v frame during snapshot assembly", f.Kind)
	}
	if f.ChunkCount == 0 || f.ChunkIndex >= f.ChunkCount || f.Format.Validate() != nil ||
		f.BucketOffset > f.Format.BucketCount || uint64(len(f.Words)) > f.Format.BucketCount-f.BucketOffset {
		a.Reset()
		return false, decodeErr(ErrMalformed, HeaderLen, "chunk", "chunk %d of %d, words [%d, +%d) of a %d-bucket table", f.ChunkIndex, f.ChunkCount, f.BucketOffset, len(f.Words), f.Format.BucketCount)
	}
	if f.ChunkIndex == 0 {
		a.start(f)
	}
	if !a.active || f.ChunkIndex != a.next || f.ChunkCount != a.count || f.Header != a.header || f.BucketOffset != a.nextBucket {
		want, wantBucket, active := a.next, a.nextBucket, a.active
		a.Reset()
		if !active {
			return false, decodeErr(ErrChunkSequence, HeaderLen, "chunk_index", "chunk %d of %d with no snapshot in progress", f.ChunkIndex, f.ChunkCount)
		}
		return false, decodeErr(ErrChunkSequence, HeaderLen, "chunk_index", "chunk %d of %d at bucket %d (epoch %d), expected chunk %d at bucket %d of that snapshot", f.ChunkIndex, f.ChunkCount, f.BucketOffset, f.Epoch, want, wantBucket)
	}
	copy(a.words[f.BucketOffset:], f.Words)
	a.nextBucket += uint64(len(f.Words))
	a.next++
	if a.next < a.count {
		return false, nil
	}
	a.active = false
	if a.nextBucket != a.header.Format.BucketCount {
		covered := a.nextBucket
		a.Reset()
		return false, decodeErr(ErrIncompleteCoverage, 0, "", "chunks cover %d of %d buckets", covered, a.header.Format.BucketCount)
	}
	a.complete = true
	return true, nil
}

// start begins a snapshot at chunk 0, clearing the reused table.
func (a *Assembler) start(f *Frame) {
	n := int(f.Format.BucketCount) // ≤ 2^24: the format is valid
	if cap(a.words) < n {
		a.words = make([]uint64, n)
	} else {
		a.words = a.words[:n]
		clear(a.words)
	}
	a.header, a.count, a.next, a.nextBucket, a.active = f.Header, f.ChunkCount, 0, 0, true
}

// Words returns the table of the snapshot that Add just completed (owned by
// the Assembler, overwritten by the next snapshot), or nil when the last
// Add did not complete one.
func (a *Assembler) Words() []uint64 {
	if !a.complete {
		return nil
	}
	return a.words
}

// Header returns the header of chunk 0 of the snapshot in progress or just
// completed (the zero Header before any).
func (a *Assembler) Header() Header { return a.header }

// Reset abandons any snapshot in progress.
func (a *Assembler) Reset() {
	a.next, a.nextBucket, a.active, a.complete = 0, 0, false, false
}
