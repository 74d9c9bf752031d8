// Bootstrap from a relay's catalog (GET /v1/pools, README "Bootstrap"): the
// routing domain and each pool's id a consumer manifest needs,
// and the msgpack encodings of a manifest and an assignment (docs/abi.md §6).

import { Writer } from "./msgpack.js";

const sources = { default_derived: 0, explicit: 1 };

/**
 * fetchCatalog reads GET {relayUrl}/v1/pools. Every 64-bit value in it is a
 * decimal string; they are left as strings (BigInt(s) reads one exactly).
 */
export async function fetchCatalog(relayUrl, { authToken, fetch: f = globalThis.fetch, signal } = {}) {
  relayUrl = relayUrlOf(relayUrl);
  const headers = authToken ? { authorization: `Bearer ${authToken}` } : {};
  const resp = await f(`${relayUrl.replace(/\/+$/, "")}/v1/pools`, { headers, signal });
  if (!resp.ok) throw new Error(`catalog: ${resp.status} ${resp.statusText}: ${(await resp.text()).slice(0, 1024)}`);
  return resp.json();
}

function digest(hex, source, what) {
  if (!/^[0-9a-f]{32}$/.test(hex)) throw new Error(`catalog: ${what} ${JSON.stringify(hex)} is not 32 hex digits`);
  if (!(source in sources)) throw new Error(`catalog: ${what} source ${JSON.stringify(source)}`);
  return { digest: Uint8Array.from(Buffer.from(hex, "hex")), source: sources[source] };
}

/**
 * manifestFromCatalog returns the manifest fields for lanes serving the named
 * pools of a catalog: `targets` is [{pool, lane}]. Every target must have the
 * same router_key (one routing domain) and the same query_semantics (block
 * size and hash format: a router asks one request of every lane). Formats
 * may differ: the manifest pins none (version 2), so each lane takes its
 * pool's format from its assignment and follows it across a resize.
 */
export function manifestFromCatalog(catalog, targets, { consumerInstance, verificationWindow = 2 } = {}) {
  if (!targets.length) throw new Error("catalog: no target pools");
  const byName = new Map(catalog.pools.map((p) => [p.name, p]));
  const pools = targets.map((t) => {
    const p = byName.get(t.pool);
    if (!p) throw new Error(`catalog: relay has no pool ${JSON.stringify(t.pool)}`);
    return p;
  });
  const key = pools[0].router_key, q0 = pools[0].query_semantics ?? {};
  for (const p of pools) {
    if (p.router_key !== key) {
      throw new Error(`catalog: pools ${pools[0].name} and ${p.name} cannot share a router (router_key ${key} vs ${p.router_key}: another routing domain)`);
    }
    const q = p.query_semantics ?? {};
    if (q.block_size !== q0.block_size || q.hash_format !== q0.hash_format) {
      throw new Error(`catalog: pools ${pools[0].name} and ${p.name} hash requests differently (block_size ${q0.block_size} vs ${q.block_size}, hash_format ${q0.hash_format} vs ${q.hash_format}): one router cannot ask both one request`);
    }
  }
  const id = pools[0].identity;
  const domain = {
    cacheSemantics: digest(id.cache_semantics, id.cache_semantics_source, "cache_semantics"),
    routingScope: digest(id.routing_scope, id.routing_scope_source, "routing_scope"),
  };
  const lanes = new Array(16).fill(null);
  targets.forEach((t, i) => { lanes[t.lane] = { domain, dcId: BigInt(pools[i].dc_id) }; });
  return { consumerInstance: consumerInstanceOf(consumerInstance), domain, format: null, lanes, verificationWindow };
}

const U64_MAX = (1n << 64n) - 1n;

/**
 * consumerInstanceOf checks a router's consumer instance: an unsigned 64-bit
 * integer given as a bigint or as a non-negative safe integer number. It
 * returns it as a bigint and throws a TypeError naming what it got otherwise.
 */
export function consumerInstanceOf(v) {
  if ((typeof v === "bigint" && v >= 0n && v <= U64_MAX) || (Number.isSafeInteger(v) && v >= 0)) return BigInt(v);
  let got;
  if (typeof v === "bigint" || typeof v === "number") got = `${typeof v} ${v}`;
  else if (v === null || v === undefined) got = String(v);
  else if (typeof v === "object") {
    let text;
    try { text = JSON.stringify(v); } catch { text = undefined; }
    got = `${v.constructor?.name ?? "object"} ${text ?? ""}`.trim();
  } else got = `${typeof v} ${JSON.stringify(v)}`;
  if (got.length > 80) got = got.slice(0, 77) + "...";
  return bad(`consumerInstance must be an unsigned 64-bit integer (a bigint, or a non-negative safe integer number), got ${got}`);
}

/**
 * relayUrlOf checks a relay base URL: http:// or https:// with a host. It
 * returns it without trailing slashes, and throws a TypeError that says what
 * to write instead (for "127.0.0.1:7878": add "http://").
 */
export function relayUrlOf(s) {
  if (typeof s !== "string" || s === "") return bad("relayUrl is required");
  if (!s.includes("://")) return bad(`relayUrl ${JSON.stringify(s)} has no scheme: write "http://${s}" (or https://)`);
  let u;
  try { u = new URL(s); } catch { u = undefined; }
  if (!u || (u.protocol !== "http:" && u.protocol !== "https:") || u.host === "") {
    return bad(`relayUrl ${JSON.stringify(s)} is not an http(s) URL with a host, e.g. "http://127.0.0.1:7878"`);
  }
  return s.replace(/\/+$/, "");
}

function bad(msg) { throw new TypeError(`router: ${msg}`); }

function writeDigest(w, d) {
  return w.bin(d.digest).uint(d.source);
}

function writePool(w, p) {
  w.array(5);
  writeDigest(w, p.domain.cacheSemantics);
  writeDigest(w, p.domain.routingScope);
  return w.uint(p.dcId);
}

function writeFormat(w, f) {
  return w.array(5).uint(f.version).uint(f.seed).uint(f.bucketCount).uint(f.fingerprintBits).uint(f.slotsPerBucket);
}

/**
 * encodeManifest returns the msgpack manifest of docs/abi.md §6: version 1
 * when m.format pins every lane and no lane has its own (m.laneFormats),
 * version 2 otherwise — m.format null pins none, m.laneFormats[i] pins lane
 * i, and a lane pinned by neither takes its assignment's format.
 */
export function encodeManifest(m) {
  const laneFormats = m.laneFormats ?? [];
  const v2 = !m.format || laneFormats.some((f) => f);
  const w = new Writer().array(v2 ? 7 : 6).uint(v2 ? 2 : 1).uint(m.consumerInstance).array(4);
  writeDigest(w, m.domain.cacheSemantics);
  writeDigest(w, m.domain.routingScope);
  if (m.format) writeFormat(w, m.format);
  else w.nil();
  w.array(16);
  for (let i = 0; i < 16; i++) {
    if (m.lanes[i]) writePool(w, m.lanes[i]);
    else w.nil();
  }
  w.uint(m.verificationWindow);
  if (v2) {
    w.array(16);
    for (let i = 0; i < 16; i++) {
      if (laneFormats[i]) writeFormat(w, laneFormats[i]);
      else w.nil();
    }
  }
  return w.bytes();
}

/**
 * encodeAssignment returns the msgpack (identity, lease) of docs/abi.md §6.
 * identityBytes is the identity exactly as a frame carries it (decodeFrame's
 * identityBytes): byte for byte the encoding assign takes.
 */
export function encodeAssignment(identityBytes, lease) {
  return new Writer().array(2).raw(identityBytes).array(3)
    .uint(lease.consumerInstance).uint(lease.physicalLane).uint(lease.assignmentEpoch).bytes();
}
