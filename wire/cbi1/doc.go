// Package cbi1 implements CBI1 ("Cuckoo Bucket Images v1"), the payload NVIDIA
// Dynamo's DC KV relay carries in FilterUpdate.payload of its
// dynamo.kvrelay.v1.KvEventRelay gRPC service: a 48-byte little-endian
// header (magic "CBI1", wire version, flags, the CKF format, dc_id, epoch and
// a body checksum) followed by either one snapshot chunk (dense bucket words)
// or one delta (absolute bucket images). The format is pinned in
// docs/wire.md §8, written from Dynamo's protocol README and codec; this
// package is an independent implementation of it.
//
// # Words
//
// A CBI1 bucket word is exactly a ckf bucket word: one uint64 holding four
// 16-bit fingerprint slots, slot i in bits [16i, 16i+16), slot 0 least
// significant, 0 = empty (SPEC §2.3), serialized little-endian. A
// [ckf.Bucket], ckf.Filter.Words() or ckf.Snapshot.Words converts by
// identity (uint64(b)), with no byte or slot reordering.
//
// # Encoding
//
// [AppendFrame] writes one frame; [SnapshotChunks] splits a table into
// chunks of at most [MaxChunkBuckets] buckets, and [EncodeSnapshot] and
// [EncodeDelta] encode a whole snapshot or one delta. A delta holds at most
// [MaxDeltaImages] images: a larger publication must be sent as a snapshot
// instead ([ErrDeltaTooLarge]), as Dynamo's publisher does. Anything the
// encoder writes, [Decode] accepts.
//
// # Decoding
//
// [Decode] accepts exactly what Dynamo's decoder accepts, checking in its
// order: length (at least the header, at most [MaxFrameBytes]), magic, wire
// version, checksum, format (version, fingerprint bits, slots, bucket count
// a power of two in 2..=2^24), flags, then the body (exact length, chunk
// index < chunk count, word and image limits, offsets and bucket indices
// inside the table). It does not judge a frame against stream state: the
// dc_id against the producer identity ([Header.CheckFormat] compares the
// format), epochs, or chunk order across frames, which [Assembler] checks.
// Delta images need not be sorted or unique (the contract does not require
// it); applied in order, the last image of a bucket wins.
//
// Every failure is an [*Error] wrapping one sentinel ([ErrTruncated],
// [ErrFrameTooLarge], [ErrMagic], [ErrWireVersion], [ErrChecksum],
// [ErrFormat], [ErrFlags], [ErrMalformed], [ErrLimitExceeded]); the decoder
// never panics and allocates only to grow the caller's buffers up to what
// the frame holds.
//
// # Concurrency and portability
//
// Functions are safe for concurrent use; a [Frame] or [Assembler] is not.
// The package depends only on the standard library, ckf and
// github.com/zeebo/xxh3, and builds for GOOS=wasip1 GOARCH=wasm.
//
// See docs/RATIONALE.md "Why does cbi1 accept exactly what Dynamo's decoder accepts?".
package cbi1
