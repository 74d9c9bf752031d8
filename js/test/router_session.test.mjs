// The JavaScript router's session rules (issue #30 items 1, 2 and 5),
// against the real relay binary with a lying middlebox in front of its
// streams (the router's fetch option): a frame under another lane's lease
// ends only the session that carried it, a lane the consumer lost is not
// ready and resubscribes, a snapshot chunk sent again ends the session, and
// so do a heartbeat between a snapshot's chunks and a snapshot that stops
// progressing (snapshotProgressTimeoutMs).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Router, readFrames } from "../src/index.js";
import { nextEpoch } from "../src/router.js";
import { startRelay, postStored, converge, wasmPath } from "../testsupport/relay.mjs";

const relays = [];
after(() => Promise.all(relays.map((r) => r.stop("SIGKILL"))));
async function relay(args, opts) {
  const r = await startRelay(args, opts);
  relays.push(r);
  return r;
}

const fast = { minBackoffMs: 10, maxBackoffMs: 200, module: wasmPath, consumerInstance: 78 };

function prefixed(body) {
  const out = new Uint8Array(4 + body.length);
  new DataView(out.buffer).setUint32(0, body.length);
  out.set(body, 4);
  return out;
}

async function until(cond, what, ms = 20000) {
  for (const deadline = Date.now() + ms; !cond();) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test("a frame under another lane's lease ends only the session that carried it", async (t) => {
  const rl = await relay(["--pool", "dc-a:dc=1,expected=4096", "--pool", "dc-b:dc=2,expected=4096"]);
  // The middlebox copies lane 1's deltas into lane 0's stream once armed.
  let armed = false;
  const stolen = [];
  const fetchThrough = async (url, init) => {
    const resp = await fetch(url, init);
    const lane = new URL(url).searchParams.get("lane");
    if (!url.includes("/stream") || resp.status !== 200) return resp;
    async function* frames() {
      for await (const body of readFrames(resp.body)) {
        const copy = body.slice();
        if (lane === "1" && armed && copy[2] === 2) stolen.push(copy); // [1, 2, …]: a delta
        yield prefixed(copy);
        if (lane === "0" && armed) while (stolen.length) yield prefixed(stolen.shift());
      }
    }
    return { status: 200, statusText: "OK", body: frames() };
  };
  // A long idle timeout: on a loaded machine lane 1 must not resubscribe for any reason but the test's.
  const router = await Router.connect({ ...fast, idleTimeoutMs: 60000, relayUrl: rl.base, pools: ["dc-a", "dc-b"], fetch: fetchThrough });
  const running = router.run();
  t.after(() => router.stop());
  await postStored(rl.base, "dc-a", 10, 2);
  await postStored(rl.base, "dc-b", 10, 2);
  await converge(router, rl.base, "dc-a", 0);
  await converge(router, rl.base, "dc-b", 1);
  const before0 = router.lane(0), before1 = router.lane(1);

  armed = true;
  let b;
  for (let i = 0; !stolen.length; i++) { // lane 1's deltas, stolen
    assert.ok(i < 100, "no delta of lane 1 to steal");
    b = await postStored(rl.base, "dc-b", 1, 2);
    await new Promise((r) => setTimeout(r, 20));
  }
  await postStored(rl.base, "dc-a", 1, 2); // lane 0's next frame carries them
  await until(() => router.lane(0).resubscribes > before0.resubscribes, "lane 0 to resubscribe");
  assert.match(router.lane(0).lastError, /under lease/, "lane 0's session ended on the foreign frame");
  armed = false;
  await converge(router, rl.base, "dc-a", 0);
  await converge(router, rl.base, "dc-b", 1);
  assert.equal(router.lane(1).resubscribes, before1.resubscribes, "lane 1 kept its session");
  assert.equal(router.consumer.queryLocalHashes(b[0]).depths[1], 2, "lane 1 holds dc-b's blocks");
  await router.stop();
  await running;
});

test("a lane the consumer lost is not ready and its session resubscribes", async (t) => {
  const rl = await relay(["--pool", "p:dc=1,expected=4096"]);
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["p"] });
  const running = router.run();
  t.after(() => router.stop());
  await postStored(rl.base, "p", 10, 2);
  await converge(router, rl.base, "p", 0);
  router.consumer.retire(0); // another holder of the consumer (or a trap) took the lane
  assert.equal(router.lane(0).ready, false, "ready asks the consumer");
  await postStored(rl.base, "p", 1, 2); // the next frame comes back IgnoredForeignLease
  await until(() => router.lane(0).resubscribes > 0, "lane 0 to resubscribe");
  assert.match(router.lane(0).lastError, /lost its lease/);
  await converge(router, rl.base, "p", 0);
  await router.stop();
  await running;
});

test("a snapshot chunk sent again ends the session instead of restarting the snapshot", async (t) => {
  const rl = await relay(["--pool", "p:dc=1,expected=262144"]); // 131,072 buckets: 5 chunks
  let sessions = 0;
  const fetchThrough = async (url, init) => {
    const resp = await fetch(url, init);
    if (!url.includes("/stream") || resp.status !== 200) return resp;
    const first = ++sessions === 1;
    async function* frames() {
      let n = 0;
      for await (const body of readFrames(resp.body)) {
        const copy = body.slice();
        yield prefixed(copy);
        if (first && n++ === 0) yield prefixed(copy); // chunk 0 again
      }
    }
    return { status: 200, statusText: "OK", body: frames() };
  };
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["p"], fetch: fetchThrough });
  const running = router.run();
  t.after(() => router.stop());
  await until(() => router.lane(0).resubscribes > 0, "lane 0 to resubscribe");
  assert.match(router.lane(0).lastError, /want chunk 1/);
  await postStored(rl.base, "p", 1, 2);
  await converge(router, rl.base, "p", 0);
  await router.stop();
  await running;
});

// A middlebox that passes a snapshot's chunk 0 and swallows the rest of the
// first session's chunks, passing every other frame.
function swallowChunksAfterFirst() {
  let sessions = 0;
  return async (url, init) => {
    const resp = await fetch(url, init);
    if (!url.includes("/stream") || resp.status !== 200) return resp;
    const first = ++sessions === 1;
    async function* frames() {
      let chunks = 0;
      for await (const body of readFrames(resp.body)) {
        const copy = body.slice();
        if (first && copy[2] === 1 && chunks++ > 0) continue; // [1, 1, …]: a snapshot chunk after chunk 0
        yield prefixed(copy);
      }
    }
    return { status: 200, statusText: "OK", body: frames() };
  };
}

test("a heartbeat between a snapshot's chunks ends the session", async (t) => {
  const rl = await relay(["--pool", "p:dc=1,expected=262144"], { config: { heartbeat_interval: "50ms" } }); // 5 chunks
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["p"], fetch: swallowChunksAfterFirst() });
  const running = router.run();
  t.after(() => router.stop());
  await until(() => router.lane(0).resubscribes > 0, "lane 0 to resubscribe");
  assert.match(router.lane(0).lastError, /kind 4 frame inside the session's snapshot/);
  await postStored(rl.base, "p", 1, 2);
  await converge(router, rl.base, "p", 0);
  await router.stop();
  await running;
});

test("a snapshot that stops progressing ends the session at snapshotProgressTimeoutMs", async (t) => {
  const rl = await relay(["--pool", "p:dc=1,expected=262144"], { config: { heartbeat_interval: "1h" } });
  // Only chunk 0 arrives, then nothing: no heartbeat (1 h), no more chunks.
  const router = await Router.connect({ ...fast, idleTimeoutMs: 0, snapshotProgressTimeoutMs: 300, relayUrl: rl.base,
    pools: ["p"], fetch: swallowChunksAfterFirst() });
  const running = router.run();
  t.after(() => router.stop());
  await until(() => router.lane(0).resubscribes > 0, "lane 0 to resubscribe");
  assert.match(router.lane(0).lastError, /snapshot not installed 300 ms after the stream opened/);
  assert.equal(router.lane(0).ready, false);
  await postStored(rl.base, "p", 1, 2);
  await converge(router, rl.base, "p", 0);
  await router.stop();
  await running;
});

test("lane epochs drawn at one instant differ in their random low bits and grow", () => {
  const now = 1_800_000_000_123;
  const mask = (1n << 24n) - 1n;
  const seen = new Set();
  for (let i = 0; i < 1000; i++) {
    const e = nextEpoch(0n, now);
    assert.equal(e & ~mask, (BigInt(now) * 1000000n) & ~mask, "the clock's high bits");
    seen.add(e);
  }
  assert.ok(seen.size > 990, `${seen.size} distinct epochs of 1000`);
  const last = (BigInt(now) * 1000000n) | mask;
  assert.equal(nextEpoch(last, now), last + 1n, "never at or below the last");
});

test("a router given a relay's replicas moves its lanes from a standby answering 503 to the next", async (t) => {
  const rl = await relay(["--pool", "dc-a:dc=1,expected=4096"]);
  // The standby: it lists the pool (its catalog is the relay's) but serves
  // no stream, answering as a relay standing by does (SPEC §11).
  const standby = "http://standby.invalid:7878";
  const asked = [];
  const fetchThrough = async (url, init) => {
    const stream = url.includes("/stream");
    if (url.startsWith(standby)) {
      if (!stream) return fetch(rl.base + url.slice(standby.length), init);
      asked.push("standby");
      return new Response(JSON.stringify({ error: { code: "not_leader", message: "stands by" }, leader: { node: "a", url: rl.base } }),
        { status: 503, statusText: "Service Unavailable", headers: { "Ckfrelay-Leader": rl.base } });
    }
    if (stream) asked.push("leader");
    return fetch(url, init);
  };
  const router = await Router.connect({ ...fast, relayUrls: [standby, rl.base], pools: ["dc-a"], fetch: fetchThrough });
  assert.equal(router.relayUrl, standby, "starts at the first replica");
  const running = router.run();
  t.after(() => router.stop());
  await postStored(rl.base, "dc-a", 10, 2);
  await converge(router, rl.base, "dc-a", 0);
  assert.equal(asked[0], "standby");
  assert.ok(asked.includes("leader"), "never asked the next replica");
  assert.equal(router.relayUrl, rl.base);
  await router.stop();
  await running;
});

test("relayUrls is checked before any request", () => {
  const base = { pools: ["p"], consumerInstance: 1 };
  assert.throws(() => new Router({}, { ...base, relayUrls: [] }), /at least one/);
  assert.throws(() => new Router({}, { ...base, relayUrls: ["http://a:1", "http://a:1/"] }), /twice/);
  assert.throws(() => new Router({}, { ...base, relayUrls: ["http://a:1"], relayUrl: "http://b:1" }), /not both/);
  assert.throws(() => new Router({}, { ...base, relayUrls: ["a:1"] }), /no scheme/);
  assert.equal(new Router({}, { ...base, relayUrls: ["http://a:1/", "http://b:1"] }).relayUrl, "http://a:1");
});
