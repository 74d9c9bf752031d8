// Type declarations for @ckfrelay/router (src/index.js). They name no
// global that only a DOM lib declares, so they compile under a Node-only
// config (lib ES2022, types node) as under one with "DOM"
// (test/types/tsconfig.*.json check both).

/** Lane state as the router sees it (a copy). */
export interface LaneInfo {
  pool: string;
  /** A stream is open and the lane assigned. */
  connected: boolean;
  /** A snapshot is installed and the stream is live. */
  ready: boolean;
  /** The current (or last) assignment epoch. */
  epoch: bigint;
  /** The last installed sequence. */
  sequence: bigint;
  /** Date.now() of the last frame; 0: never. */
  lastFrame: number;
  /** Milliseconds since the last frame; null: never. Relays heartbeat while idle. */
  stalenessMs: number | null;
  /** Sessions started after the first. */
  resubscribes: number;
  framesApplied: number;
  /** Why the last session ended. */
  lastError: string;
}

export interface QueryResult {
  /** Ready lanes captured by the query (bit l = lane l). */
  mask: number;
  /** Leading blocks lane l holds; 0 for lanes not in the mask. */
  depths: number[];
  /** Blocks queried. */
  blocks: number;
  /** Table probes made (diagnostic). */
  probes: number;
}

export interface RawQueryResult extends QueryResult {
  /** The export's status: the mask (≥ 0) or a negative Code. */
  code: number;
}

export interface ApplyResult {
  outcome: number;
  fault: number;
  /** Lane the frame addressed; -1 for none. */
  lane: number;
  kind: number;
  sequence: bigint;
}

export interface LaneStatus {
  configured: boolean; assigned: boolean; ready: boolean; hasEpoch: boolean; staging: boolean;
  lastOutcome: number; lastFault: number; leaseLane: number; leaseConsumer: bigint; leaseEpoch: bigint;
  lastEpoch: bigint; installedSequence: bigint; chunksStaged: number; chunkCount: number; dcId: bigint;
  producerIncarnation: bigint; layoutGeneration: bigint; lastHeartbeatMicros: bigint;
  assignments: bigint; framesApplied: bigint; framesIgnored: bigint; deactivations: bigint;
  snapshotRetries: bigint; snapshotsInstalled: bigint; deltasApplied: bigint; imagesApplied: bigint;
  drainsAcknowledged: bigint;
  /** The lane's own format (its assignment's, else its pin): 0n and 0n before it has one. */
  seed: bigint; bucketCount: bigint;
}

/** bucketCount: the one format group's, or the largest of several; tableBytes: every group's together. */
export interface Stats { bucketCount: bigint; tableBytes: bigint; readyMask: number; queries: bigint; probes: bigint; groups: number }

/**
 * A compiled WebAssembly module: WebAssembly.Module where the program's libs
 * declare it (DOM, or @types/node versions that do), else an opaque object.
 * Written as a lookup on globalThis so that these declarations do not
 * require the DOM lib (TS2503 "Cannot find namespace 'WebAssembly'").
 */
export type WasmModule = typeof globalThis extends { WebAssembly: { Module: abstract new (...args: any[]) => infer M } } ? M : object;

export type ModuleSource = WasmModule | Uint8Array | ArrayBuffer | string | URL;
export type Hashes = BigUint64Array | ReadonlyArray<bigint | number>;
export type Tokens = Uint32Array | ReadonlyArray<number>;

/** Outcome codes of apply (docs/abi.md §4). */
export declare const Outcome: Readonly<{
  Applied: 1; SnapshotInstalled: 2; SnapshotChunkAccepted: 3; IgnoredForeignLease: 4; IgnoredStaleOrDuplicate: 5;
  AwaitingSnapshot: 6; DrainAcknowledged: 7; Deactivated: 8; RetrySnapshot: 9; HeartbeatObserved: 10;
  StreamClosed: 11; IgnoredUnknownKind: 12;
}>;
export declare const FaultNames: readonly string[];
/** Status codes (docs/abi.md §5). */
export declare const Code: Readonly<Record<
  "OK" | "NotConfigured" | "BadArgument" | "Internal" | "OutOfMemory" | "BufferTooSmall" | "InvalidManifest" |
  "ManifestEncoding" | "WrongConsumer" | "WrongLane" | "WrongPool" | "FormatMismatch" | "StaleAssignmentEpoch" |
  "AssignmentEncoding" | "Unavailable" | "InvalidQuery" | "FrameTruncated" | "FrameTrailingBytes" | "FrameTooLarge" |
  "FrameUnknownVersion" | "FrameUnknownKind" | "FrameMalformed", number>>;
export declare const QueryKind: Readonly<{ LocalHashes: 0; SequenceHashes: 1; Tokens: 2; TokensWith: 3 }>;
/** Token-hash seed of the base model. */
export declare const BASE_SALT: bigint;
/** The consumer's input cap (64 MiB): a larger frame is FrameTooLarge, a larger query InvalidQuery, on every host. */
export declare const MAX_INPUT_BYTES: number;

/** An export returned a negative status. */
export declare class AbiError extends Error {
  readonly op: string;
  readonly code: number;
  readonly codeName: string;
}

/** Compiles the module (default: the committed ckfconsumer.wasm). */
export declare function compileModule(source?: ModuleSource): Promise<WasmModule>;

/** One instance of the consumer module. Methods throw AbiError on a negative status. */
export declare class Consumer {
  static instantiate(module?: ModuleSource): Promise<Consumer>;
  configure(manifest: Uint8Array): void;
  assign(assignment: Uint8Array): void;
  retire(lane: number): void;
  apply(frame: Uint8Array): ApplyResult;
  queryRaw(kind: number, input: Hashes | Tokens, blockSize?: number, salt?: bigint): RawQueryResult;
  querySequenceHashes(hashes: Hashes): QueryResult;
  queryLocalHashes(hashes: Hashes): QueryResult;
  queryTokens(tokens: Tokens, blockSize: number, salt?: bigint): QueryResult;
  contains(hash: bigint | number): number;
  laneStatus(lane: number): LaneStatus;
  laneWords(lane: number): BigUint64Array;
  /** queryTokens with per-block multimodal hashes and Eagle windows (query kind 3). */
  queryTokensWith(tokens: Tokens, blockSize: number, salt?: bigint, options?: TokenQueryOptions): QueryResult;
  stats(): Stats;
  salt(lora?: string, namespace?: string): bigint;
  lastError(): string;
  liveBuffers(): number;
}

export interface Target { pool: string; lane: number }

export interface TraceEvent {
  op: "assign" | "apply" | "retire";
  lane: number;
  bytes?: Uint8Array;
  result?: ApplyResult;
}

export interface RouterOptions {
  /** The relay's base URL, e.g. "http://127.0.0.1:7878" (or relayUrls). */
  relayUrl?: string;
  /**
   * The base URLs of the relay's replicas (a relay run as hot standbys,
   * relay serve --ha-nats-url): the router uses one at a time and moves
   * every lane to the next when one cannot serve a stream (unreachable, or
   * any answer but 200, e.g. a standby's 503). Exclusive with relayUrl.
   */
  relayUrls?: ReadonlyArray<string>;
  /** Pools to follow: names (lane = index) or {pool, lane}. */
  pools: ReadonlyArray<string | Target>;
  /** This router's consumer instance: an unsigned integer, the same for all its lanes. */
  consumerInstance: bigint | number;
  authToken?: string;
  /** Module to instantiate (connect only; default: the committed one). */
  module?: ModuleSource;
  /** Resubscribe backoff bounds (defaults 50 ms and 5 s; full jitter). */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** A session must live this long after its snapshot to reset the backoff (default max(maxBackoffMs, 1000)). */
  healthySessionMs?: number;
  /**
   * End a session with no frame that moved its lane for this long (default
   * 10000; ≤ 0 disables). Ignored frames do not count; after the snapshot a
   * heartbeat at the lane's sequence does.
   */
  idleTimeoutMs?: number;
  /** A session's snapshot must install within this long of the stream's start (default 60000). */
  snapshotProgressTimeoutMs?: number;
  maxFrameBytes?: number;
  verificationWindow?: number;
  fetch?: typeof globalThis.fetch;
  logger?: { info?(msg: string): void; warn?(msg: string): void };
  /** Called for every assign, apply and retire (tests, audits). */
  trace?: (event: TraceEvent) => void;
}

/** Why a session ended, beside transport and HTTP errors. */
export declare class SessionError extends Error {
  readonly reason: "deactivated" | "closed" | "idle" | "protocol" | "lease_lost" | "snapshot_timeout";
}

/** Keeps a consumer's lanes converged with one relay (the Go client package, in JavaScript). */
export declare class Router {
  /** Reads the catalog, builds and configures the consumer. Does not subscribe until run(). */
  static connect(options: RouterOptions): Promise<Router>;
  constructor(consumer: Consumer, options: RouterOptions);
  readonly consumer: Consumer;
  /** The manifest the consumer was configured with, when connect() built it. */
  readonly manifest: Uint8Array | null;
  /** Follows every target until stop() or signal; resolves once every lane has retired. */
  run(options?: { signal?: AbortSignal }): Promise<void>;
  stop(): Promise<void>;
  /**
   * Resolves once every target lane holds a snapshot and its stream is live
   * (at once if so already); rejects when the router stops first, or when
   * signal aborts.
   */
  ready(options?: { signal?: AbortSignal }): Promise<void>;
  lane(lane: number): LaneInfo | null;
  querySequenceHashes(hashes: Hashes): QueryResult;
  /** The same from per-block local hashes (the events' tokens_hash values), chained inside the module. */
  queryLocalHashes(hashes: Hashes): QueryResult;
  queryTokens(tokens: Tokens, blockSize: number, salt?: bigint): QueryResult;
  contains(hash: bigint | number): number;
  laneWords(lane: number): { words: BigUint64Array; sequence: bigint };
  /** queryTokens with per-block multimodal hashes and Eagle windows (query kind 3). */
  queryTokensWith(tokens: Tokens, blockSize: number, salt?: bigint, options?: TokenQueryOptions): QueryResult;
}

export interface Digest { digest: string; source: number }
export interface Identity {
  pool: { cacheSemantics: Digest; routingScope: Digest; dcId: bigint };
  producerIncarnation: bigint;
  layoutGeneration: bigint;
  format: { version: number; seed: bigint; bucketCount: bigint; fingerprintBits: number; slotsPerBucket: number };
}
export interface Lease { consumerInstance: bigint; physicalLane: number; assignmentEpoch: bigint }

export declare const Kind: Readonly<{ SnapshotChunk: 1; Delta: 2; DrainMarker: 3; Heartbeat: 4; Close: 5 }>;
export declare const DEFAULT_MAX_FRAME_BYTES: number;

export type Frame =
  | { kind: 1; identity: Identity; identityBytes: Uint8Array; lease: Lease; sequence: bigint; chunkIndex: number; chunkCount: number; bucketOffset: bigint; words: Uint8Array }
  | { kind: 2; identity: Identity; identityBytes: Uint8Array; lease: Lease; baseSequence: bigint; sequence: bigint; images: Uint8Array }
  | { kind: 3; lease: Lease; expectedSequence: bigint }
  | { kind: 4; identity: Identity; identityBytes: Uint8Array; lease: Lease; lastSequence: bigint; unixMicros: bigint }
  | { kind: 5; reason: string; message: string };

export declare class FrameError extends Error {
  readonly code: "truncated" | "trailing_bytes" | "too_large" | "unknown_version" | "unknown_kind" | "malformed";
  readonly offset: number;
  readonly field: string;
}
/** Decodes exactly one frame body (docs/wire.md); throws FrameError. */
export declare function decodeFrame(body: Uint8Array): Frame;
/** Splits a length-prefixed stream into frame bodies. */
export declare function readFrames(chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>, maxFrameBytes?: number): AsyncGenerator<Uint8Array>;

export declare class MsgpackError extends Error {
  readonly code: "truncated" | "trailing_bytes" | "malformed";
  readonly offset: number;
}
/** Decodes exactly one msgpack value (integers as bigint). */
export declare function decodeMsgpack(bytes: Uint8Array, maxDepth?: number): unknown;

/** GET /v1/pools; 64-bit values are decimal strings. */
export declare function fetchCatalog(relayUrl: string, options?: { authToken?: string; fetch?: typeof globalThis.fetch; signal?: AbortSignal }): Promise<{ pools: any[] }>;
export interface ManifestFormat { version: number | bigint; seed: bigint; bucketCount: bigint; fingerprintBits: number | bigint; slotsPerBucket: number | bigint }
/**
 * A consumer manifest (docs/abi.md §6). `format` pins every lane (null: none,
 * a version-2 manifest); `laneFormats[i]` pins lane i. A lane pinned by
 * neither takes its format from its assignment.
 */
export interface Manifest {
  consumerInstance: bigint;
  domain: { cacheSemantics: { digest: Uint8Array; source: number }; routingScope: { digest: Uint8Array; source: number } };
  format: ManifestFormat | null;
  laneFormats?: Array<ManifestFormat | null | undefined>;
  lanes: Array<{ domain: Manifest["domain"]; dcId: bigint } | null>;
  verificationWindow: number;
}
export declare function manifestFromCatalog(catalog: { pools: any[] }, targets: Target[], options: { consumerInstance: bigint | number; verificationWindow?: number }): Manifest;
export declare function encodeManifest(manifest: Manifest): Uint8Array;
export declare function encodeAssignment(identityBytes: Uint8Array, lease: Lease): Uint8Array;

/** Hash options of a query by tokens beyond the salt (docs/abi.md §3.1). */
export interface TokenQueryOptions {
  /** mm[i]: block i's multimodal hashes (order does not matter); missing or empty: none. */
  mm?: ReadonlyArray<ReadonlyArray<bigint | number> | null | undefined>;
  /** Eagle windows: block i hashes tokens[i·bs, (i+1)·bs + 1) (hash format eagle_v1). */
  eagle?: boolean;
}
/** Encodes a request for query kind 3. */
export declare function encodeTokenQuery(tokens: Tokens, options?: TokenQueryOptions): Uint8Array;
