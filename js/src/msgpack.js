// A small, strict msgpack reader and the few writers the consumer ABI needs.
//
// The reader is deliberately independent of the Go codec (package wire): it
// decodes any msgpack value generically, exactly one per input, and rejects
// trailing bytes, truncation, the reserved type byte 0xc1 and nesting deeper
// than a bound. frame.js checks frame shapes on top of it, so every frame the
// relay emits is read by a second decoder written from docs/wire.md alone.

/** A msgpack decode failure. `code` is one of "truncated", "trailing_bytes", "malformed". */
export class MsgpackError extends Error {
  constructor(code, message, offset) {
    super(`msgpack: ${message} at offset ${offset}`);
    this.name = "MsgpackError";
    this.code = code;
    this.offset = offset;
  }
}

const utf8 = new TextDecoder("utf-8");

/** Default bound on array/map nesting. */
export const MAX_DEPTH = 64;

/**
 * Reader decodes msgpack values from a Uint8Array. Integers decode as
 * BigInt (u64 and i64 exactly); bin as a Uint8Array view into the input;
 * str as a string; arrays as arrays; maps as Map; nil as null; ext as
 * {extType, data}.
 */
export class Reader {
  constructor(bytes, maxDepth = MAX_DEPTH) {
    this.b = bytes;
    this.dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.off = 0;
    this.maxDepth = maxDepth;
  }

  need(n) {
    if (this.b.length - this.off < n) throw new MsgpackError("truncated", `${n} bytes needed, ${this.b.length - this.off} left`, this.off);
  }

  u(n) {
    this.need(n);
    const o = this.off;
    this.off += n;
    switch (n) {
      case 1: return this.dv.getUint8(o);
      case 2: return this.dv.getUint16(o);
      case 4: return this.dv.getUint32(o);
    }
    return this.dv.getBigUint64(o);
  }

  bytes(n) {
    this.need(n);
    const v = this.b.subarray(this.off, this.off + n);
    this.off += n;
    return v;
  }

  /** value decodes one value of any type. */
  value(depth = 0) {
    if (depth > this.maxDepth) throw new MsgpackError("malformed", `nesting deeper than ${this.maxDepth}`, this.off);
    const start = this.off;
    const c = this.u(1);
    if (c <= 0x7f) return BigInt(c);
    if (c >= 0xe0) return BigInt(c - 0x100);
    if (c >= 0x80 && c <= 0x8f) return this.map(c & 0x0f, depth);
    if (c >= 0x90 && c <= 0x9f) return this.array(c & 0x0f, depth);
    if (c >= 0xa0 && c <= 0xbf) return utf8.decode(this.bytes(c & 0x1f));
    switch (c) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bytes(this.u(1));
      case 0xc5: return this.bytes(this.u(2));
      case 0xc6: return this.bytes(this.u(4));
      case 0xc7: case 0xc8: case 0xc9: {
        const n = this.u(1 << (c - 0xc7));
        this.need(1);
        const extType = this.dv.getInt8(this.off++);
        return { extType, data: this.bytes(n) };
      }
      case 0xca: this.need(4); this.off += 4; return this.dv.getFloat32(this.off - 4);
      case 0xcb: this.need(8); this.off += 8; return this.dv.getFloat64(this.off - 8);
      case 0xcc: return BigInt(this.u(1));
      case 0xcd: return BigInt(this.u(2));
      case 0xce: return BigInt(this.u(4));
      case 0xcf: return this.u(8);
      case 0xd0: this.need(1); return BigInt(this.dv.getInt8(this.off++));
      case 0xd1: this.need(2); this.off += 2; return BigInt(this.dv.getInt16(this.off - 2));
      case 0xd2: this.need(4); this.off += 4; return BigInt(this.dv.getInt32(this.off - 4));
      case 0xd3: this.need(8); this.off += 8; return this.dv.getBigInt64(this.off - 8);
      case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
        this.need(1);
        const extType = this.dv.getInt8(this.off++);
        return { extType, data: this.bytes(1 << (c - 0xd4)) };
      }
      case 0xd9: return utf8.decode(this.bytes(this.u(1)));
      case 0xda: return utf8.decode(this.bytes(this.u(2)));
      case 0xdb: return utf8.decode(this.bytes(this.u(4)));
      case 0xdc: return this.array(this.u(2), depth);
      case 0xdd: return this.array(this.u(4), depth);
      case 0xde: return this.map(this.u(2), depth);
      case 0xdf: return this.map(this.u(4), depth);
    }
    throw new MsgpackError("malformed", "reserved type byte 0xc1", start);
  }

  array(n, depth) {
    // Every element takes at least one byte: a count beyond the input is
    // truncated before anything is allocated for it.
    this.need(n);
    const out = new Array(n);
    for (let i = 0; i < n; i++) out[i] = this.value(depth + 1);
    return out;
  }

  map(n, depth) {
    this.need(2 * n);
    const out = new Map();
    for (let i = 0; i < n; i++) {
      const k = this.value(depth + 1);
      out.set(k, this.value(depth + 1));
    }
    return out;
  }

  /** end throws unless every byte was consumed. */
  end() {
    if (this.off !== this.b.length) {
      throw new MsgpackError("trailing_bytes", `${this.b.length - this.off} bytes after the value`, this.off);
    }
  }
}

/** decode reads exactly one msgpack value from bytes; trailing bytes are an error. */
export function decode(bytes, maxDepth = MAX_DEPTH) {
  const r = new Reader(bytes, maxDepth);
  const v = r.value();
  r.end();
  return v;
}

/** Writer appends msgpack values, integers in their smallest encoding. */
export class Writer {
  constructor() {
    this.parts = [];
    this.n = 0;
  }
  push(bytes) {
    this.parts.push(bytes);
    this.n += bytes.length;
    return this;
  }
  /** uint writes a non-negative integer (number or BigInt) up to 2^64-1. */
  uint(v) {
    const x = BigInt(v);
    if (x < 0n || x > 0xffffffffffffffffn) throw new RangeError(`msgpack: ${v} is not a u64`);
    if (x < 0x80n) return this.push(Uint8Array.of(Number(x)));
    if (x <= 0xffn) return this.push(Uint8Array.of(0xcc, Number(x)));
    const b = new Uint8Array(x <= 0xffffn ? 3 : x <= 0xffffffffn ? 5 : 9);
    const dv = new DataView(b.buffer);
    if (b.length === 3) { b[0] = 0xcd; dv.setUint16(1, Number(x)); }
    else if (b.length === 5) { b[0] = 0xce; dv.setUint32(1, Number(x)); }
    else { b[0] = 0xcf; dv.setBigUint64(1, x); }
    return this.push(b);
  }
  array(n) {
    if (n < 16) return this.push(Uint8Array.of(0x90 | n));
    return this.push(Uint8Array.of(0xdc, n >> 8, n & 0xff));
  }
  nil() { return this.push(Uint8Array.of(0xc0)); }
  /** bin writes a bin8 (up to 255 bytes: digests). */
  bin(bytes) {
    if (bytes.length > 0xff) throw new RangeError("msgpack: bin8 holds at most 255 bytes");
    this.push(Uint8Array.of(0xc4, bytes.length));
    return this.push(bytes);
  }
  raw(bytes) { return this.push(bytes); }
  bytes() {
    const out = new Uint8Array(this.n);
    let o = 0;
    for (const p of this.parts) { out.set(p, o); o += p.length; }
    return out;
  }
}
