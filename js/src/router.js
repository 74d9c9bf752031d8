// The router side of ckfrelay in JavaScript: one consumer lane per pool,
// kept converged with a relay's frame streams. It follows the Go client
// package (client/client.go) step for step.

import { setTimeout as sleep } from "node:timers/promises";
import { Consumer, Outcome, FaultNames } from "./module.js";
import { decodeFrame, readFrames, Kind, DEFAULT_MAX_FRAME_BYTES } from "./frame.js";
import { fetchCatalog, manifestFromCatalog, encodeManifest, encodeAssignment, consumerInstanceOf, relayUrlOf } from "./catalog.js";

/** Why a session ended, beside transport and HTTP errors. */
export class SessionError extends Error {
  /** @param {"deactivated"|"closed"|"idle"|"protocol"} reason */
  constructor(reason, message) {
    super(message);
    this.name = "SessionError";
    this.reason = reason;
  }
}

const ignored = new Set([Outcome.IgnoredForeignLease, Outcome.IgnoredStaleOrDuplicate, Outcome.AwaitingSnapshot,
  Outcome.StreamClosed, Outcome.IgnoredUnknownKind]);

const silent = { info() {}, warn() {} };

/**
 * Router keeps a consumer's lanes converged with one relay. On any
 * deactivation, close frame, disconnect, idle timeout or identity change a
 * lane retires, then resubscribes with a higher assignment epoch after a
 * full-jitter exponential backoff that resets only after a session stayed up
 * healthySessionMs past its snapshot.
 */
export class Router {
  /**
   * connect bootstraps from the relay's catalog: it reads the domain, format
   * and pool ids of the targets, instantiates the module and configures it.
   * It does not subscribe until run().
   */
  static async connect(options) {
    relayUrlOf(options?.relayUrl); // before any request
    consumerInstanceOf(options.consumerInstance);
    const targets = normalizeTargets(options.pools);
    const cat = await fetchCatalog(options.relayUrl, options);
    const manifest = manifestFromCatalog(cat, targets, options);
    const consumer = await Consumer.instantiate(options.module);
    const bytes = encodeManifest(manifest);
    consumer.configure(bytes);
    const r = new Router(consumer, { ...options, pools: targets });
    r.manifest = bytes;
    return r;
  }

  /** @param {Consumer} consumer a configured consumer whose manifest gives each target pool its lane */
  constructor(consumer, options) {
    this.consumer = consumer;
    this.targets = normalizeTargets(options.pools);
    this.relayUrl = relayUrlOf(options.relayUrl);
    this.authToken = options.authToken;
    this.consumerInstance = consumerInstanceOf(options.consumerInstance);
    this.minBackoffMs = options.minBackoffMs > 0 ? options.minBackoffMs : 50;
    this.maxBackoffMs = options.maxBackoffMs >= this.minBackoffMs ? options.maxBackoffMs : Math.max(5000, this.minBackoffMs);
    this.healthySessionMs = options.healthySessionMs > 0 ? options.healthySessionMs : Math.max(this.maxBackoffMs, 1000);
    this.idleTimeoutMs = options.idleTimeoutMs ?? 10000;
    this.maxFrameBytes = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.log = options.logger ?? silent;
    this.trace = options.trace; // (event) => void: every assign, apply and retire, for tests and audits
    this.info = new Array(16).fill(null);
    for (const t of this.targets) {
      this.info[t.lane] = { pool: t.pool, connected: false, ready: false, epoch: 0n, sequence: 0n, lastFrame: 0,
        resubscribes: 0, framesApplied: 0, lastError: "" };
    }
    this.stopper = null;
    this.running = null;
    this.stopped = false;
    /** ready() waiters: {resolve, reject}, settled when every lane is ready or the router stops. */
    this.waiters = new Set();
    /** The manifest bytes the consumer was configured with, when connect() built it. */
    this.manifest = null;
  }

  /** run follows every target until stop() or signal; it resolves when every lane has retired. */
  run({ signal } = {}) {
    if (this.running) return this.running;
    this.stopper = new AbortController();
    if (signal) {
      if (signal.aborted) this.stopper.abort(signal.reason);
      else signal.addEventListener("abort", () => this.stopper.abort(signal.reason), { once: true });
    }
    this.stopper.signal.addEventListener("abort", () => this.halt(this.stopper.signal.reason), { once: true });
    if (this.stopper.signal.aborted) this.halt(this.stopper.signal.reason);
    this.running = Promise.all(this.targets.map((t) => this.follow(t, this.stopper.signal))).then(() => {});
    return this.running;
  }

  /** stop ends every session, retires every lane and resolves when done. */
  async stop() {
    this.stopper?.abort(new Error("router stopped"));
    this.halt(new Error("router stopped"));
    await this.running;
  }

  /**
   * ready resolves once every target lane holds a snapshot and its stream
   * is live (at once when that is already so). It rejects when the router
   * stops first (stop(), or run's signal), or when signal aborts.
   */
  ready({ signal } = {}) {
    if (this.stopped) return Promise.reject(new Error("router stopped before every lane was ready"));
    if (this.allReady()) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const w = { resolve, reject, signal, onAbort: null };
      if (signal) {
        w.onAbort = () => { this.waiters.delete(w); reject(signal.reason); };
        signal.addEventListener("abort", w.onAbort, { once: true });
      }
      this.waiters.add(w);
    });
  }

  allReady() { return this.targets.every((t) => this.info[t.lane].ready); }

  // settle resolves every ready() waiter once all lanes are ready.
  settle() {
    if (!this.waiters.size || !this.allReady()) return;
    for (const w of this.waiters) {
      w.signal?.removeEventListener("abort", w.onAbort);
      w.resolve();
    }
    this.waiters.clear();
  }

  // halt marks the router stopped and rejects every ready() waiter.
  halt(reason) {
    if (this.stopped) return;
    this.stopped = true;
    for (const w of this.waiters) {
      w.signal?.removeEventListener("abort", w.onAbort);
      w.reject(new Error(`router stopped before every lane was ready: ${reason?.message ?? reason}`));
    }
    this.waiters.clear();
  }

  /** lane returns a copy of a lane's state with its staleness (ms since its last frame; null: never). */
  lane(i) {
    const li = this.info[i];
    if (!li) return null;
    return { ...li, stalenessMs: li.lastFrame ? Date.now() - li.lastFrame : null };
  }

  /** querySequenceHashes: per ready lane, leading blocks of a request's canonical hashes held. */
  querySequenceHashes(hashes) { return this.consumer.querySequenceHashes(hashes); }
  /** queryLocalHashes: the same from per-block local hashes (tokens_hash), chained inside the module. */
  queryLocalHashes(hashes) { return this.consumer.queryLocalHashes(hashes); }
  /** queryTokens: the same by token ids (complete blocks of blockSize, salted). */
  queryTokens(tokens, blockSize, salt) { return this.consumer.queryTokens(tokens, blockSize, salt); }
  /** contains: the mask of ready lanes holding one canonical sequence hash. */
  contains(hash) { return this.consumer.contains(hash); }
  /** queryTokensWith: queryTokens with {mm, eagle} hash options (Consumer.queryTokensWith). */
  queryTokensWith(tokens, blockSize, salt, options) { return this.consumer.queryTokensWith(tokens, blockSize, salt, options); }
  /** laneWords: a ready lane's bucket words and the sequence they are at. */
  laneWords(lane) { return { words: this.consumer.laneWords(lane), sequence: this.info[lane]?.sequence ?? 0n }; }

  async follow(t, stop) {
    let epoch = 0n, failures = 0;
    const li = this.info[t.lane];
    while (!stop.aborted) {
      // Epochs grow across sessions and across router restarts with the same
      // consumer instance: the clock in ns, never less than last + 1.
      const now = BigInt(Date.now()) * 1000000n;
      epoch = epoch + 1n > now ? epoch + 1n : now;
      const { installedAt, error } = await this.session(t, epoch, stop);
      const lived = installedAt ? Date.now() - installedAt : -1;
      const stopping = stop.aborted;
      // A lane nobody maintains must not answer: retire it even when stopping.
      try {
        this.consumer.retire(t.lane);
        this.trace?.({ op: "retire", lane: t.lane });
      } catch { /* not assigned yet */ }
      li.connected = li.ready = false;
      if (stopping) return;
      li.resubscribes++;
      if (error) li.lastError = error.message;
      this.log.info?.(`lane ${t.lane} (${t.pool}) resubscribing: ${error?.message}`);
      if (lived >= 0 && lived >= this.healthySessionMs) failures = 0;
      const ceil = failures < 30 ? Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** failures) : this.maxBackoffMs;
      failures++;
      try {
        await sleep(Math.random() * ceil, undefined, { signal: stop });
      } catch {
        return;
      }
    }
  }

  // session opens one stream, assigns the lane from the first snapshot
  // chunk's identity and applies frames until something ends it.
  async session(t, epoch, stop) {
    const li = this.info[t.lane];
    const ac = new AbortController();
    const onStop = () => ac.abort(stop.reason);
    stop.addEventListener("abort", onStop, { once: true });
    let idle = null;
    const arm = () => {
      if (this.idleTimeoutMs <= 0) return;
      clearTimeout(idle);
      idle = setTimeout(() => ac.abort(new SessionError("idle", `no frame for ${this.idleTimeoutMs} ms`)), this.idleTimeoutMs);
    };
    let installedAt = 0;
    try {
      arm();
      const url = `${this.relayUrl}/v1/pools/${encodeURIComponent(t.pool)}/stream?consumer=${this.consumerInstance}&lane=${t.lane}&epoch=${epoch}`;
      const headers = this.authToken ? { authorization: `Bearer ${this.authToken}` } : {};
      const resp = await this.fetch(url, { headers, signal: ac.signal });
      if (resp.status !== 200) {
        const body = (await resp.text()).slice(0, 1024).trim();
        return { installedAt, error: new Error(`router: ${resp.status} ${resp.statusText}: ${body}`) };
      }
      const lease = { consumerInstance: this.consumerInstance, physicalLane: t.lane, assignmentEpoch: epoch };
      let first = true;
      for await (const body of readFrames(resp.body, this.maxFrameBytes)) {
        arm();
        if (first) {
          first = false;
          const f = decodeFrame(body);
          if (f.kind !== Kind.SnapshotChunk) throw new SessionError("protocol", `stream must start with a snapshot chunk, got kind ${f.kind}`);
          const l = f.lease;
          if (l.consumerInstance !== lease.consumerInstance || l.physicalLane !== lease.physicalLane || l.assignmentEpoch !== lease.assignmentEpoch) {
            throw new SessionError("protocol", `snapshot under lease ${l.consumerInstance}/${l.physicalLane}/${l.assignmentEpoch}, asked for ${lease.consumerInstance}/${lease.physicalLane}/${lease.assignmentEpoch}`);
          }
          const a = encodeAssignment(f.identityBytes, lease);
          this.consumer.assign(a);
          this.trace?.({ op: "assign", lane: t.lane, bytes: a });
          li.connected = true;
          li.epoch = epoch;
        }
        let res;
        try {
          res = this.consumer.apply(body);
        } finally {
          li.lastFrame = Date.now();
        }
        this.trace?.({ op: "apply", lane: t.lane, bytes: body, result: res });
        if (!ignored.has(res.outcome)) li.framesApplied++;
        if (res.lane === t.lane) li.sequence = res.sequence;
        if (res.outcome === Outcome.SnapshotInstalled) {
          li.ready = true;
          if (!installedAt) installedAt = li.lastFrame;
          this.settle();
        }
        if (res.outcome === Outcome.Deactivated || res.outcome === Outcome.RetrySnapshot) {
          throw new SessionError("deactivated", `lane deactivated: ${FaultNames[res.fault] ?? res.fault}`);
        }
        if (res.outcome === Outcome.StreamClosed) throw new SessionError("closed", "stream closed by relay");
      }
      return { installedAt, error: new Error("router: stream ended") };
    } catch (e) {
      const reason = ac.signal.aborted ? ac.signal.reason : null;
      return { installedAt, error: reason instanceof SessionError ? reason : e };
    } finally {
      clearTimeout(idle);
      stop.removeEventListener("abort", onStop);
      ac.abort(); // release the connection
    }
  }
}

function normalizeTargets(pools) {
  if (!Array.isArray(pools) || !pools.length) throw new Error("router: at least one target pool is required");
  const t = pools.map((p, i) => (typeof p === "string" ? { pool: p, lane: i } : { pool: p.pool, lane: p.lane }));
  const seen = new Set();
  for (const x of t) {
    if (!x.pool || !Number.isInteger(x.lane) || x.lane < 0 || x.lane > 15 || seen.has(x.lane)) {
      throw new Error(`router: target ${JSON.stringify(x)}: lanes must be distinct in 0..15 and pools named`);
    }
    seen.add(x.lane);
  }
  return t;
}
