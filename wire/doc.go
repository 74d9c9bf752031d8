// Package wire implements ckfrelay's wire v1 (SPEC §9, pinned in
// docs/wire.md): the five msgpack frames a producer streams to consumers
// (snapshot chunk, delta, drain marker, heartbeat, close), the
// length-prefixed stream [Reader] and [Writer] with a frame limit, snapshot
// chunking, and codecs for NVIDIA Dynamo's RouterEvent in JSON and msgpack
// (SPEC §4.1).
//
// Frames are encoded by [AppendFrame] and decoded by [DecodeFrame] with a
// hand-written msgpack reader over the frame bytes: no reflection, no
// allocation per bucket, and bucket words and images travel as one
// little-endian msgpack bin each. Decoding reuses the caller's [Frame]
// buffers, so a steady stream decodes without allocating.
//
// # Errors
//
// Every decoder returns a [*DecodeError] wrapping one of [ErrTruncated],
// [ErrTrailingBytes], [ErrFrameTooLarge], [ErrUnknownVersion],
// [ErrUnknownKind] or [ErrMalformed]; it never panics, and never allocates
// more than its input (or the frame limit) justifies: every length header is
// checked against the bytes that remain before anything is sized from it.
// A failed decode leaves the destination unchanged.
//
// wire checks what a frame says about itself (shape, types, integer ranges,
// closed enums, chunk index < chunk count); it does not judge a frame
// against consumer state (format, lease, sequence continuity, empty or
// out-of-range images): the consumer's §8.3 check order decides those.
//
// # Concurrency and portability
//
// Functions are safe for concurrent use; a [Frame], [Reader] or [Writer] is
// not. The package has no goroutines, no cgo and no OS access outside the
// io.Reader/io.Writer a stream is given, and builds for GOOS=wasip1
// GOARCH=wasm, where the consumer decodes frames itself.
//
// See docs/RATIONALE.md "Why a hand-written msgpack reader in wire?" and
// "Why does wire leave sequence and format checks to the consumer?".
package wire
