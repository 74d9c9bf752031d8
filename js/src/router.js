// The router side of ckfrelay in JavaScript: one consumer lane per pool,
// kept converged with a relay's frame streams. It follows the Go client
// package (client/client.go) step for step.

import { setTimeout as sleep } from "node:timers/promises";
import { getRandomValues } from "node:crypto";
import { Consumer, Outcome, FaultNames, AbiError } from "./module.js";
import { decodeFrame, readFrames, Kind, DEFAULT_MAX_FRAME_BYTES } from "./frame.js";
import { fetchCatalog, manifestFromCatalog, encodeManifest, encodeAssignment, consumerInstanceOf, relayUrlOf } from "./catalog.js";

/**
 * relayUrlsOf returns the relay's replica base URLs: options.relayUrls (a
 * relay run as a group of hot standbys lists them all; the router talks to
 * one at a time and moves to the next when one cannot serve its streams),
 * or options.relayUrl alone. Each is checked; none may appear twice.
 */
function relayUrlsOf(options) {
  const given = options?.relayUrls;
  if (given === undefined) return [relayUrlOf(options?.relayUrl)];
  if (options.relayUrl !== undefined) throw new TypeError("router: give relayUrl or relayUrls, not both");
  if (!Array.isArray(given) || given.length === 0) throw new TypeError("router: relayUrls must list at least one URL");
  const urls = given.map(relayUrlOf);
  if (new Set(urls).size !== urls.length) throw new TypeError("router: relayUrls lists a URL twice");
  return urls;
}

/** Why a session ended, beside transport and HTTP errors. */
export class SessionError extends Error {
  /**
   * protocol: the stream broke a session rule (a frame under another lease,
   * a chunk out of order, anything between a snapshot's chunks); lease_lost:
   * the consumer no longer holds the session's lease (IgnoredForeignLease on
   * its own lane, or a trap); snapshot_timeout: the snapshot did not
   * install within snapshotProgressTimeoutMs.
   * @param {"deactivated"|"closed"|"idle"|"protocol"|"lease_lost"|"snapshot_timeout"} reason
   */
  constructor(reason, message) {
    super(message);
    this.name = "SessionError";
    this.reason = reason;
  }
}

const ignored = new Set([Outcome.IgnoredForeignLease, Outcome.IgnoredStaleOrDuplicate, Outcome.AwaitingSnapshot,
  Outcome.StreamClosed, Outcome.IgnoredUnknownKind]);

const silent = { info() {}, warn() {} };

const EPOCH_RANDOM_BITS = 24n;

/**
 * nextEpoch returns a lane's next assignment epoch after last: the clock in
 * Unix nanoseconds with its low 24 bits random, never below last + 1. The
 * clock part keeps epochs growing across router restarts and within a
 * relay's max_lease_epoch_lead; the random part means one lane's epoch says
 * nothing about another's (docs/RATIONALE.md "Why are lane epochs the clock
 * with random low bits?"; the Go client's nextEpoch).
 */
export function nextEpoch(last, nowMs = Date.now()) {
  const mask = (1n << EPOCH_RANDOM_BITS) - 1n;
  const r = getRandomValues(new Uint32Array(1))[0];
  const e = ((BigInt(nowMs) * 1000000n) & ~mask) | (BigInt(r) & mask);
  return e > last ? e : last + 1n;
}

const sameLease = (a, b) => a.consumerInstance === b.consumerInstance && a.physicalLane === b.physicalLane &&
  a.assignmentEpoch === b.assignmentEpoch;
const leaseText = (l) => `${l.consumerInstance}/${l.physicalLane}/${l.assignmentEpoch}`;

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
    const urls = relayUrlsOf(options); // before any request
    consumerInstanceOf(options.consumerInstance);
    const targets = normalizeTargets(options.pools);
    // Any replica's catalog will do (a standby lists the pool too): the
    // first that answers.
    let cat, lastErr;
    for (const u of urls) {
      try {
        cat = await fetchCatalog(u, options);
        break;
      } catch (e) {
        lastErr = e;
      }
    }
    if (!cat) throw lastErr;
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
    /** The relay's replicas and the one every lane uses now (see failed). */
    this.replicas = { urls: relayUrlsOf(options), cur: 0 };
    this.authToken = options.authToken;
    this.consumerInstance = consumerInstanceOf(options.consumerInstance);
    this.minBackoffMs = options.minBackoffMs > 0 ? options.minBackoffMs : 50;
    this.maxBackoffMs = options.maxBackoffMs >= this.minBackoffMs ? options.maxBackoffMs : Math.max(5000, this.minBackoffMs);
    this.healthySessionMs = options.healthySessionMs > 0 ? options.healthySessionMs : Math.max(this.maxBackoffMs, 1000);
    this.idleTimeoutMs = options.idleTimeoutMs ?? 10000;
    this.snapshotProgressTimeoutMs = options.snapshotProgressTimeoutMs > 0 ? options.snapshotProgressTimeoutMs : 60000;
    this.maxFrameBytes = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.fetch = options.fetch ?? globalThis.fetch;
    this.log = options.logger ?? silent;
    this.trace = options.trace; // (event) => void: every assign, apply and retire, for tests and audits
    this.info = new Array(16).fill(null);
    /** The running session per lane: {ac, lease, assigned, installed}; null when none. */
    this.live = new Array(16).fill(null);
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

  /** relayUrl is the base URL of the replica the lanes use now. */
  get relayUrl() { return this.replicas.urls[this.replicas.cur]; }

  // failed moves past the replica at index i (it refused or could not
  // serve a stream: unreachable, a standby answering 503, not ready),
  // unless another lane already moved: then the one in use is newer than
  // the one that failed. The Go client's replicas.failed, same rule.
  failed(i) {
    if (this.replicas.cur === i) this.replicas.cur = (i + 1) % this.replicas.urls.length;
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

  allReady() { return this.targets.every((t) => this.isReady(t.lane)); }

  // isReady asks the consumer, never a recorded flag: a lane the consumer
  // lost (retired, trapped) is not ready even before its session notices.
  isReady(lane) {
    const s = this.live[lane];
    if (!s?.installed) return false;
    try {
      const st = this.consumer.laneStatus(lane);
      return st.ready && st.assigned && st.leaseEpoch === s.lease.assignmentEpoch &&
        st.leaseConsumer === s.lease.consumerInstance && st.leaseLane === s.lease.physicalLane;
    } catch {
      return false;
    }
  }

  // endLostSessions ends every running session whose lease the consumer no
  // longer holds (after a trap, every one): called after any consumer error.
  endLostSessions() {
    for (let lane = 0; lane < 16; lane++) {
      const s = this.live[lane];
      if (!s?.assigned) continue;
      let held = false;
      try {
        const st = this.consumer.laneStatus(lane);
        held = st.assigned && st.leaseEpoch === s.lease.assignmentEpoch && st.leaseConsumer === s.lease.consumerInstance;
      } catch { /* a trapped instance holds nothing */ }
      if (!held) s.ac.abort(new SessionError("lease_lost", `lane ${lane} lost its lease ${leaseText(s.lease)} in the consumer`));
    }
  }

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
    return { ...li, ready: this.isReady(i), stalenessMs: li.lastFrame ? Date.now() - li.lastFrame : null };
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
      epoch = nextEpoch(epoch);
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

  // session opens one stream and applies its frames until something ends
  // it, with the Go client's Session rules: every frame that names a lease
  // names the session's own; the stream starts with chunk 0 of its one
  // snapshot, whose chunks come in order with nothing between them; an
  // IgnoredForeignLease under the session's own lease means the lane is
  // lost. The idle timer restarts only on frames that moved the lane, and
  // the snapshot must install within snapshotProgressTimeoutMs.
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
    const progress = setTimeout(() => ac.abort(new SessionError("snapshot_timeout",
      `snapshot not installed ${this.snapshotProgressTimeoutMs} ms after the stream opened`)), this.snapshotProgressTimeoutMs);
    const lease = { consumerInstance: this.consumerInstance, physicalLane: t.lane, assignmentEpoch: epoch };
    const live = { ac, lease, assigned: false, installed: false };
    let installedAt = 0;
    try {
      arm();
      const at = this.replicas.cur;
      const url = `${this.relayUrl}/v1/pools/${encodeURIComponent(t.pool)}/stream?consumer=${this.consumerInstance}&lane=${t.lane}&epoch=${epoch}`;
      const headers = this.authToken ? { authorization: `Bearer ${this.authToken}` } : {};
      let resp;
      try {
        resp = await this.fetch(url, { headers, signal: ac.signal });
      } catch (e) {
        if (!stop.aborted) this.failed(at);
        throw e;
      }
      if (resp.status !== 200) {
        this.failed(at);
        const body = (await resp.text()).slice(0, 1024).trim();
        return { installedAt, error: new Error(`router: ${resp.status} ${resp.statusText}: ${body}`) };
      }
      this.live[t.lane] = live;
      let next = 0, snapSeq = 0n, chunks = 0; // the snapshot's next chunk, sequence and count
      for await (const body of readFrames(resp.body, this.maxFrameBytes)) {
        let f;
        try {
          f = decodeFrame(body);
        } catch (e) {
          // A kind this version does not know goes to the consumer, which
          // ignores it (a newer relay may add kinds); anything else ends it.
          if (e?.code !== "unknown_kind" || !live.assigned) throw e;
          f = null;
        }
        if (f) {
          if (f.kind === Kind.Close) {
            if (!live.assigned) throw new SessionError("protocol", "stream must start with a snapshot chunk, got a close frame");
          } else {
            if (!sameLease(f.lease, lease)) {
              throw new SessionError("protocol", `a kind ${f.kind} frame under lease ${leaseText(f.lease)} on the session of ${leaseText(lease)}`);
            }
            if (f.kind !== Kind.SnapshotChunk) {
              if (!live.installed) throw new SessionError("protocol", `a kind ${f.kind} frame inside the session's snapshot (chunk ${next} of ${chunks} next)`);
            } else if (live.installed) {
              throw new SessionError("protocol", `snapshot chunk ${f.chunkIndex} of ${f.chunkCount} at sequence ${f.sequence} after the session's snapshot`);
            } else if (f.chunkIndex !== next) {
              throw new SessionError("protocol", `snapshot chunk ${f.chunkIndex}, want chunk ${next}`);
            } else if (next > 0 && (f.sequence !== snapSeq || f.chunkCount !== chunks)) {
              throw new SessionError("protocol", `snapshot chunk ${f.chunkIndex} of ${f.chunkCount} at sequence ${f.sequence} continues chunk ${next - 1} of ${chunks} at sequence ${snapSeq}`);
            } else {
              snapSeq = f.sequence;
              chunks = f.chunkCount;
            }
          }
          if (!live.assigned) {
            const a = encodeAssignment(f.identityBytes, lease);
            this.consumer.assign(a);
            this.trace?.({ op: "assign", lane: t.lane, bytes: a });
            live.assigned = true;
            li.connected = true;
            li.epoch = epoch;
          }
        }
        let res;
        try {
          res = this.consumer.apply(body);
        } catch (e) {
          // A trap leaves no lane assigned: end every session that lost its lease.
          if (!(e instanceof AbiError)) this.endLostSessions();
          throw e;
        } finally {
          li.lastFrame = Date.now();
        }
        this.trace?.({ op: "apply", lane: t.lane, bytes: body, result: res });
        const moved = !ignored.has(res.outcome);
        if (moved) {
          li.framesApplied++;
          arm();
        }
        if (res.lane === t.lane) li.sequence = res.sequence;
        if (res.outcome === Outcome.SnapshotChunkAccepted) next++;
        if (res.outcome === Outcome.SnapshotInstalled) {
          live.installed = true;
          clearTimeout(progress);
          li.ready = true;
          if (!installedAt) installedAt = li.lastFrame;
          this.settle();
        }
        if (res.outcome === Outcome.IgnoredForeignLease) {
          throw new SessionError("lease_lost", `lane ${t.lane} lost its lease ${leaseText(lease)} in the consumer`);
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
      if (this.live[t.lane] === live) this.live[t.lane] = null;
      clearTimeout(idle);
      clearTimeout(progress);
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
