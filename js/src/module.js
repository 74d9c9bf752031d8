// The consumer WebAssembly module's host for JavaScript (docs/abi.md): the
// one JS host of the ABI, used by the Router, by the conformance runner
// (testdata/conformance/run.mjs) and by the benchmarks.

import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";

/** apply outcomes (docs/abi.md §4). */
export const Outcome = Object.freeze({
  Applied: 1, SnapshotInstalled: 2, SnapshotChunkAccepted: 3, IgnoredForeignLease: 4,
  IgnoredStaleOrDuplicate: 5, AwaitingSnapshot: 6, DrainAcknowledged: 7, Deactivated: 8,
  RetrySnapshot: 9, HeartbeatObserved: 10, StreamClosed: 11, IgnoredUnknownKind: 12,
});

/** Faults of outcomes 8 and 9 (docs/abi.md §4), by code. */
export const FaultNames = Object.freeze([
  "NoFault", "WrongIdentity", "WrongBucketCount", "SnapshotWhileReady", "BaseSequenceMismatch",
  "SequenceOverflow", "NonContiguous", "MalformedImages", "EmptyDelta", "TerminalSequenceMismatch",
  "ChunkOutOfOrder", "ChunkOverlap", "ChunkSequenceMismatch", "DeltaDuringSnapshot", "MalformedChunk",
  "HeartbeatSequenceMismatch",
]);

/** Error codes (docs/abi.md §5). */
export const Code = Object.freeze({
  OK: 0, NotConfigured: -1, BadArgument: -2, Internal: -3, OutOfMemory: -4, BufferTooSmall: -5,
  InvalidManifest: -10, ManifestEncoding: -11, WrongConsumer: -20, WrongLane: -21, WrongPool: -22,
  FormatMismatch: -23, StaleAssignmentEpoch: -24, AssignmentEncoding: -25, Unavailable: -30,
  InvalidQuery: -31, FrameTruncated: -40, FrameTrailingBytes: -41, FrameTooLarge: -42,
  FrameUnknownVersion: -43, FrameUnknownKind: -44, FrameMalformed: -45,
});
const codeNames = new Map(Object.entries(Code).map(([k, v]) => [v, k]));

/** Query kinds (docs/abi.md §3). */
export const QueryKind = Object.freeze({ LocalHashes: 0, SequenceHashes: 1, Tokens: 2, TokensWith: 3 });

/**
 * encodeTokenQuery encodes a request for query kind 3 (docs/abi.md §3.1):
 * tokens, per-block multimodal hashes (mm[i]: block i's, BigInt or number;
 * a missing or empty list means none) and Eagle windows. The namespace is
 * not here: it rides in the salt (Consumer.salt).
 */
export function encodeTokenQuery(tokens, { mm = [], eagle = false } = {}) {
  const nTok = tokens.length, nLists = mm.length;
  let nMM = 0;
  for (const l of mm) nMM += l?.length ?? 0;
  const mmAt = (16 + 4 * nTok + 4 * nLists + 7) & ~7;
  const b = new Uint8Array(mmAt + 8 * nMM), v = new DataView(b.buffer);
  v.setUint32(0, eagle ? 1 : 0, true);
  v.setUint32(4, nTok, true);
  v.setUint32(8, nLists, true);
  v.setUint32(12, nMM, true);
  for (let i = 0; i < nTok; i++) v.setUint32(16 + 4 * i, tokens[i], true);
  let at = mmAt;
  mm.forEach((l, i) => {
    v.setUint32(16 + 4 * nTok + 4 * i, l?.length ?? 0, true);
    for (const h of l ?? []) { v.setBigUint64(at, BigInt.asUintN(64, BigInt(h)), true); at += 8; }
  });
  return b;
}

/** The token-hash seed of the base model (no adapter, no namespace). */
export const BASE_SALT = 1337n;

// Typed arrays use the platform's byte order; the module reads little-endian.
const littleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * MAX_INPUT_BYTES is the consumer's input cap, natively and in the module
 * (consumer.MaxInputBytes, the alloc limit): a larger frame is FrameTooLarge
 * and a larger query InvalidQuery, as the Go hosts answer.
 */
export const MAX_INPUT_BYTES = 64 * 1024 * 1024;

/**
 * abiBlockSize maps a token block size to the module's signed i32 argument,
 * with the Go hosts' rule: anything but a positive integer is invalid (0),
 * and one above 2^31−1 is passed as 2^31−1, which answers like any larger
 * block size (an input of at most 2^24 tokens holds no complete block).
 * Passing the number through would let WebAssembly wrap it (2^32+16 → 16).
 */
function abiBlockSize(bs) {
  const n = typeof bs === "bigint" ? bs : Number.isInteger(bs) ? BigInt(bs) : 0n;
  if (n <= 0n) return 0;
  return n > 0x7fffffffn ? 0x7fffffff : Number(n);
}

const ABI_VERSION = 1, RESULT_SIZE = 32, QUERY_SIZE = 80, LANE_STATUS_SIZE = 168, STATS_SIZE = 48, RECORD = 256;

/** An export returned a negative status: `code` (number) and `codeName`, and the module's message. */
export class AbiError extends Error {
  constructor(op, code, message) {
    const name = codeNames.get(code) ?? `Code(${code})`;
    super(`ckfconsumer: ${op}: ${name}${message ? `: ${message}` : ""}`);
    this.name = "AbiError";
    this.op = op;
    this.code = code;
    this.codeName = name;
  }
}

/** The committed module: js/ckfconsumer.wasm in a packed npm package, else wasm/host/ in the repository. */
const defaultLocations = [
  new URL("../ckfconsumer.wasm", import.meta.url),
  new URL("../../wasm/host/ckfconsumer.wasm", import.meta.url),
];

/**
 * compileModule compiles the consumer module from bytes, a path or URL, or
 * (no argument) the committed module. Compile once, instantiate many.
 */
export async function compileModule(source) {
  if (source instanceof WebAssembly.Module) return source;
  if (source instanceof Uint8Array || source instanceof ArrayBuffer) return WebAssembly.compile(source);
  if (source !== undefined) return WebAssembly.compile(await readFile(source));
  let lastErr;
  for (const u of defaultLocations) {
    try {
      return await WebAssembly.compile(await readFile(u));
    } catch (e) {
      if (e.code !== "ENOENT") throw e;
      lastErr = e;
    }
  }
  throw new Error(`ckfconsumer.wasm not found next to the package or in the repository: ${lastErr?.message}`);
}

/**
 * Consumer is one instance of the module: up to 16 lanes, a table, and
 * queries over them. Calls are synchronous, so JavaScript's one thread
 * already serializes them. Every memory view is re-read after each call
 * (growth detaches the old buffer).
 */
export class Consumer {
  /** instantiate returns a fresh, unconfigured instance of a compiled module (default: the committed one). */
  static async instantiate(module) {
    const wasi = new WASI({ version: "preview1", args: [], env: {}, returnOnExit: true });
    const instance = await WebAssembly.instantiate(await compileModule(module), wasi.getImportObject());
    wasi.initialize(instance); // _initialize, exactly once: the module is a reactor
    return new Consumer(instance.exports);
  }

  constructor(exports) {
    this.x = exports;
    if (this.x.abi_version() !== ABI_VERSION) throw new Error(`ckfconsumer: ABI version ${this.x.abi_version()}, want ${ABI_VERSION}`);
    this.out = this.x.alloc(RECORD);
    this.cap = 0;
    this.in = 0;
  }

  view() { return new DataView(this.x.memory.buffer); }
  bytes(p, n) { return new Uint8Array(this.x.memory.buffer, p, n); }

  /** input returns a module buffer of at least n bytes (the reused scratch buffer). */
  input(n) {
    if (n > this.cap) {
      if (this.in) this.x.free(this.in);
      this.cap = Math.max(n, 4096);
      this.in = this.x.alloc(this.cap);
      if (this.in === 0) {
        this.cap = 0;
        throw new AbiError("alloc", Code.OutOfMemory, `alloc(${n}) refused`);
      }
    }
    return this.in;
  }

  write(buf) {
    const p = this.input(buf.length);
    this.bytes(p, buf.length).set(buf);
    return p;
  }

  /** lastError is the module's message for the last failed call. */
  lastError() {
    const n = this.x.last_error(this.out, RECORD);
    return n > 0 ? Buffer.from(this.bytes(this.out, Math.min(n, RECORD))).toString("utf8") : "";
  }

  check(op, code) {
    if (code < 0) throw new AbiError(op, code, this.lastError());
    return code;
  }

  /** configure installs a manifest (encoded per docs/abi.md §6, see encodeManifest). */
  configure(manifest) {
    this.check("configure", this.x.configure(this.write(manifest), manifest.length));
  }

  /** assign grants a lane from an encoded (identity, lease) (see encodeAssignment). */
  assign(assignment) {
    this.check("assign", this.x.assign(this.write(assignment), assignment.length));
  }

  retire(lane) {
    this.check("retire", this.x.retire(lane));
  }

  /**
   * apply feeds one frame body. It returns the result record; a frame that
   * does not decode throws AbiError (-40..-45) and changes nothing.
   */
  apply(frame) {
    if (frame.length > MAX_INPUT_BYTES) {
      throw new AbiError("apply", Code.FrameTooLarge, `frame of ${frame.length} bytes exceeds the consumer's ${MAX_INPUT_BYTES}`);
    }
    const code = this.x.apply(this.write(frame), frame.length);
    if (code < 0) throw new AbiError("apply", code, this.lastError());
    this.x.last_result(this.out);
    const v = this.view(), o = this.out;
    return {
      outcome: v.getUint8(o + 4), fault: v.getUint8(o + 5), lane: v.getInt8(o + 6), kind: v.getUint8(o + 7),
      sequence: v.getBigUint64(o + 8, true),
    };
  }

  /**
   * queryRaw runs a query and returns {code, mask, depths, blocks, probes}
   * without throwing on a negative code (the record is read for a success
   * and for Unavailable). input is a Uint32Array (tokens) or BigUint64Array
   * / array of BigInt (hashes); for kind 3 the bytes of encodeTokenQuery.
   */
  queryRaw(kind, input, blockSize = 0, salt = BASE_SALT) {
    const width = kind === QueryKind.TokensWith ? 1 : kind === QueryKind.Tokens ? 4 : 8;
    const count = input.length;
    if (width * count > MAX_INPUT_BYTES) {
      return { code: Code.InvalidQuery, mask: 0, depths: new Array(16).fill(0), blocks: 0, probes: 0,
        message: `input of ${width * count} bytes exceeds the ${MAX_INPUT_BYTES}-byte limit` };
    }
    const p = this.input(width * count);
    if (width === 1) {
      this.bytes(p, count).set(input);
    } else if (littleEndian && width === 4 && input instanceof Uint32Array && p % 4 === 0) {
      // One bulk copy: a DataView store per token was over half of a
      // 1024-block token query under Node (BENCHMARKS.md "Four runtimes").
      new Uint32Array(this.x.memory.buffer, p, count).set(input);
    } else if (littleEndian && width === 8 && input instanceof BigUint64Array && p % 8 === 0) {
      new BigUint64Array(this.x.memory.buffer, p, count).set(input);
    } else {
      const v = this.view();
      if (width === 4) for (let i = 0; i < count; i++) v.setUint32(p + 4 * i, input[i], true);
      else for (let i = 0; i < count; i++) v.setBigUint64(p + 8 * i, BigInt(input[i]), true);
    }
    const code = this.x.query(kind, p, count, abiBlockSize(blockSize), BigInt.asIntN(64, BigInt(salt)), this.out);
    const r = { code, mask: 0, depths: new Array(16).fill(0), blocks: 0, probes: 0 };
    if (code >= 0 || code === Code.Unavailable) {
      const w = this.view(), o = this.out;
      for (let l = 0; l < 16; l++) r.depths[l] = w.getUint32(o + 4 * l, true);
      r.mask = w.getUint32(o + 64, true);
      r.blocks = w.getUint32(o + 68, true);
      r.probes = w.getUint32(o + 72, true);
    }
    return r;
  }

  query(kind, input, blockSize, salt) {
    const r = this.queryRaw(kind, input, blockSize, salt);
    if (r.code < 0) throw new AbiError("query", r.code, r.message ?? this.lastError());
    delete r.code;
    return r;
  }

  /** querySequenceHashes: per ready lane, how many leading blocks of the canonical chained hashes it holds. */
  querySequenceHashes(hashes) { return this.query(QueryKind.SequenceHashes, hashes); }
  /** queryLocalHashes: the same from per-block tokens_hash values, chained inside the module. */
  queryLocalHashes(hashes) { return this.query(QueryKind.LocalHashes, hashes); }
  /** queryTokens: the same from token ids, hashed in complete blocks of blockSize with salt. */
  queryTokens(tokens, blockSize, salt = BASE_SALT) { return this.query(QueryKind.Tokens, tokens, blockSize, salt); }
  /**
   * queryTokensWith: queryTokens with per-block multimodal hashes and Eagle
   * windows ({mm, eagle}, see encodeTokenQuery), so a router computes
   * Dynamo's block keys; pass a namespace through salt (this.salt("", ns)).
   */
  queryTokensWith(tokens, blockSize, salt = BASE_SALT, options = {}) {
    return this.query(QueryKind.TokensWith, encodeTokenQuery(tokens, options), blockSize, salt);
  }

  /** contains returns the mask of ready lanes whose filter holds a canonical sequence hash. */
  contains(hash) {
    return this.check("contains", this.x.contains(BigInt.asIntN(64, BigInt(hash))));
  }

  /** laneStatus returns the lane record of docs/abi.md §7.3. */
  laneStatus(lane) {
    this.check("lane_status", this.x.lane_status(lane, this.out));
    const v = this.view(), o = this.out;
    const u64 = (at) => v.getBigUint64(o + at, true);
    const counters = ["assignments", "framesApplied", "framesIgnored", "deactivations", "snapshotRetries",
      "snapshotsInstalled", "deltasApplied", "imagesApplied", "drainsAcknowledged"];
    const s = {
      configured: v.getUint8(o) !== 0, assigned: v.getUint8(o + 1) !== 0, ready: v.getUint8(o + 2) !== 0,
      hasEpoch: v.getUint8(o + 3) !== 0, staging: v.getUint8(o + 4) !== 0, lastOutcome: v.getUint8(o + 5),
      lastFault: v.getUint8(o + 6), leaseLane: v.getUint8(o + 7), leaseConsumer: u64(8), leaseEpoch: u64(16),
      lastEpoch: u64(24), installedSequence: u64(32), chunksStaged: v.getUint32(o + 40, true),
      chunkCount: v.getUint32(o + 44, true), dcId: u64(48), producerIncarnation: u64(56), layoutGeneration: u64(64),
      lastHeartbeatMicros: v.getBigInt64(o + 144, true),
      // The lane's own format (docs/abi.md §7.3): 0n and 0n before it has one.
      seed: u64(152), bucketCount: u64(160),
    };
    counters.forEach((k, i) => { s[k] = u64(72 + 8 * i); });
    return s;
  }

  /** laneWords returns a copy of a ready lane's bucket words (as many as its own format's bucket count). */
  laneWords(lane) {
    const n = 8 * Number(this.laneStatus(lane).bucketCount);
    const p = this.input(n);
    this.check("lane_words", this.x.lane_words(lane, p, n));
    return new BigUint64Array(this.x.memory.buffer.slice(p, p + n));
  }

  /** stats returns the record of docs/abi.md §7.4. */
  stats() {
    this.check("stats", this.x.stats(this.out));
    const v = this.view(), o = this.out;
    return {
      bucketCount: v.getBigUint64(o, true), tableBytes: v.getBigUint64(o + 8, true), readyMask: v.getUint16(o + 16, true),
      queries: v.getBigUint64(o + 24, true), probes: v.getBigUint64(o + 32, true), groups: v.getUint32(o + 40, true),
    };
  }

  /** salt returns the token-hash seed for an adapter (LoRA) name and a cache namespace ("" = absent). */
  salt(lora = "", namespace = "") {
    const l = Buffer.from(lora, "utf8"), n = Buffer.from(namespace, "utf8");
    const p = this.input(l.length + n.length);
    this.bytes(p, l.length).set(l);
    this.bytes(p + l.length, n.length).set(n);
    this.check("salt", this.x.salt(p, l.length, p + l.length, n.length, this.out));
    return this.view().getBigUint64(this.out, true);
  }

  /** liveBuffers is how many module buffers this host holds (2 in steady state: input and record). */
  liveBuffers() { return this.x.live_buffers(); }
}
