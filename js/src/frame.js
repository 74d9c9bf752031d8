// Wire v1 frames (docs/wire.md): a strict decoder built on msgpack.js, and
// the stream framing (a u32 big-endian length before every body).

import { Reader, MsgpackError } from "./msgpack.js";

/** Frame kinds (docs/wire.md §2). */
export const Kind = Object.freeze({ SnapshotChunk: 1, Delta: 2, DrainMarker: 3, Heartbeat: 4, Close: 5 });

const elems = { 1: 9, 2: 7, 3: 4, 4: 6, 5: 4 };

/** Default frame limit: 8 MiB of body. */
export const DEFAULT_MAX_FRAME_BYTES = 8 << 20;

/**
 * A frame that does not decode. `code` is one of "truncated", "trailing_bytes",
 * "too_large", "unknown_version", "unknown_kind", "malformed" (the wire
 * package's categories); `field` names the value when known.
 */
export class FrameError extends Error {
  constructor(code, message, offset = 0, field = "") {
    super(`wire: ${code}${field ? ` (${field})` : ""}: ${message}`);
    this.name = "FrameError";
    this.code = code;
    this.offset = offset;
    this.field = field;
  }
}

const U8 = 0xffn, U32 = 0xffffffffn, U64 = 0xffffffffffffffffn;
const hex = (b) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex");

function fail(field, message) {
  throw new FrameError("malformed", message, 0, field);
}

function uint(v, max, field) {
  if (typeof v !== "bigint") fail(field, `want integer, got ${v === null ? "nil" : typeof v}`);
  if (v < 0n) fail(field, `negative value ${v}`);
  if (v > max) fail(field, `value ${v} exceeds ${max}`);
  return v;
}

function array(v, n, field) {
  if (!Array.isArray(v)) fail(field, "want array");
  if (v.length !== n) fail(field, `want array of ${n} elements, got ${v.length}`);
  return v;
}

function bin(v, field) {
  if (!(v instanceof Uint8Array)) fail(field, "want bin");
  return v;
}

function digest(d, src, field) {
  const b = bin(d, `${field}_digest`);
  if (b.length !== 16) fail(`${field}_digest`, `digest of ${b.length} bytes, want 16`);
  return { digest: hex(b), source: Number(uint(src, 1n, `${field}_source`)) };
}

function identity(v) {
  const [pool, inc, gen, fmt] = array(v, 4, "identity");
  const p = array(pool, 5, "identity.pool_id");
  const f = array(fmt, 5, "identity.format");
  return {
    pool: {
      cacheSemantics: digest(p[0], p[1], "identity.pool_id.sem"),
      routingScope: digest(p[2], p[3], "identity.pool_id.scope"),
      dcId: uint(p[4], U64, "identity.pool_id.dc_id"),
    },
    producerIncarnation: uint(inc, U64, "identity.producer_incarnation"),
    layoutGeneration: uint(gen, U64, "identity.layout_generation"),
    format: {
      version: Number(uint(f[0], U8, "identity.format.format_version")),
      seed: uint(f[1], U64, "identity.format.seed"),
      bucketCount: uint(f[2], U64, "identity.format.bucket_count"),
      fingerprintBits: Number(uint(f[3], U8, "identity.format.fingerprint_bits")),
      slotsPerBucket: Number(uint(f[4], U8, "identity.format.slots_per_bucket")),
    },
  };
}

function lease(v) {
  const l = array(v, 3, "lease");
  return {
    consumerInstance: uint(l[0], U64, "lease.consumer_instance"),
    physicalLane: Number(uint(l[1], U8, "lease.physical_lane")),
    assignmentEpoch: uint(l[2], U64, "lease.assignment_epoch"),
  };
}

/**
 * decodeFrame decodes exactly one frame body (no length prefix). Integers of
 * 64 bits are BigInt. `identityBytes` is a view of the identity's encoding
 * inside body (what `assign` takes, unchanged). Throws FrameError.
 */
export function decodeFrame(body) {
  const r = new Reader(body);
  let top, identityBytes = null;
  try {
    const c = body.length ? body[0] : -1;
    let n;
    if (c >= 0x90 && c <= 0x9f) { r.off = 1; n = c & 0x0f; }
    else if (c === 0xdc) { r.off = 1; n = r.u(2); }
    else if (c === 0xdd) { r.off = 1; n = r.u(4); }
    else if (c < 0) throw new MsgpackError("truncated", "empty frame", 0);
    else throw new FrameError("malformed", "frame is not an array", 0);
    r.need(n);
    top = new Array(n);
    for (let i = 0; i < n; i++) {
      const at = r.off;
      top[i] = r.value(1);
      if (i === 2) identityBytes = body.subarray(at, r.off);
    }
    r.end();
  } catch (e) {
    if (e instanceof MsgpackError) throw new FrameError(e.code, e.message, e.offset);
    throw e;
  }
  if (top.length < 1 || top[0] !== 1n) throw new FrameError("unknown_version", `version ${top[0]}`);
  if (top.length < 2 || typeof top[1] !== "bigint" || top[1] < 1n || top[1] > 5n) {
    throw new FrameError("unknown_kind", `kind ${top[1]}`);
  }
  const kind = Number(top[1]);
  array(top, elems[kind], "frame");
  switch (kind) {
    case Kind.SnapshotChunk: {
      const chunkIndex = Number(uint(top[5], U32, "chunk_index"));
      const chunkCount = Number(uint(top[6], U32, "chunk_count"));
      if (chunkCount === 0) fail("chunk_count", "chunk_count is 0");
      if (chunkIndex >= chunkCount) fail("chunk_index", `chunk ${chunkIndex} of ${chunkCount}`);
      const bucketOffset = uint(top[7], U64, "bucket_offset");
      const words = bin(top[8], "words");
      if (words.length % 8) fail("words", `${words.length} bytes is not a multiple of 8`);
      if (bucketOffset + BigInt(words.length / 8) > U64) fail("bucket_offset", "offset + words overflows u64");
      return {
        kind, identity: identity(top[2]), identityBytes, lease: lease(top[3]),
        sequence: uint(top[4], U64, "sequence"), chunkIndex, chunkCount, bucketOffset, words,
      };
    }
    case Kind.Delta: {
      const images = bin(top[6], "images");
      if (images.length % 12) fail("images", `${images.length} bytes is not a multiple of 12`);
      return {
        kind, identity: identity(top[2]), identityBytes, lease: lease(top[3]),
        baseSequence: uint(top[4], U64, "base_sequence"), sequence: uint(top[5], U64, "sequence"), images,
      };
    }
    case Kind.DrainMarker:
      return { kind, lease: lease(top[2]), expectedSequence: uint(top[3], U64, "expected_sequence") };
    case Kind.Heartbeat: {
      const us = top[5];
      if (typeof us !== "bigint" || us > 0x7fffffffffffffffn) fail("unix_micros", "want i64");
      return {
        kind, identity: identity(top[2]), identityBytes, lease: lease(top[3]),
        lastSequence: uint(top[4], U64, "last_sequence"), unixMicros: us,
      };
    }
    case Kind.Close:
      if (typeof top[2] !== "string") fail("reason", "want str");
      if (typeof top[3] !== "string") fail("message", "want str");
      return { kind, reason: top[2], message: top[3] };
  }
  throw new FrameError("unknown_kind", `kind ${kind}`);
}

/**
 * readFrames yields the bodies of the length-prefixed frames of a byte
 * stream (an async iterable of Uint8Array chunks, e.g. a fetch body). A
 * prefix above maxFrameBytes or zero, or a stream that ends inside a frame,
 * throws FrameError: the stream is then out of step and must be closed.
 */
export async function* readFrames(chunks, maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {
  let head = new Uint8Array(0); // bytes of an incomplete length prefix
  let body = null, filled = 0;  // the body being filled, when its prefix was read
  let offset = 0;               // stream offset, for errors
  for await (let chunk of chunks) {
    while (chunk.length) {
      if (body) {
        const k = Math.min(body.length - filled, chunk.length);
        body.set(chunk.subarray(0, k), filled);
        filled += k;
        chunk = chunk.subarray(k);
        if (filled === body.length) {
          offset += body.length;
          const done = body;
          body = null;
          yield done;
        }
        continue;
      }
      if (head.length + chunk.length < 4) {
        head = concat(head, chunk);
        break;
      }
      const need = 4 - head.length;
      const prefix = concat(head, chunk.subarray(0, need));
      chunk = chunk.subarray(need);
      head = new Uint8Array(0);
      const n = new DataView(prefix.buffer, prefix.byteOffset, 4).getUint32(0);
      if (n === 0) throw new FrameError("malformed", "zero-length frame", offset);
      if (n > maxFrameBytes) throw new FrameError("too_large", `frame of ${n} bytes exceeds limit ${maxFrameBytes}`, offset);
      offset += 4;
      if (chunk.length >= n) {
        // The whole body is in this chunk: a view, no copy.
        const done = chunk.subarray(0, n);
        chunk = chunk.subarray(n);
        offset += n;
        yield done;
      } else {
        body = new Uint8Array(n);
        filled = 0;
      }
    }
  }
  if (head.length || body) throw new FrameError("truncated", "stream ended inside a frame", offset);
}

function concat(a, b) {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
