// The JavaScript router against the real relay binary (built from this
// repository): convergence, a dropped connection, a relay restart, answers
// equal to the Go consumer's on the same frames, and every frame kind the
// relay emits through the JavaScript decoder.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { Router, Consumer, AbiError, Code, Outcome, Kind, decodeFrame, readFrames, FrameError,
  fetchCatalog, manifestFromCatalog, encodeManifest, encodeAssignment } from "../src/index.js";
import { startRelay, startProxy, postStored, converge, native, wasmPath, hubSequence } from "../testsupport/relay.mjs";

const relays = [];
after(() => Promise.all(relays.map((r) => r.stop("SIGKILL"))));
async function relay(args, opts) {
  const r = await startRelay(args, opts);
  relays.push(r);
  return r;
}

const fast = { minBackoffMs: 10, maxBackoffMs: 200, module: wasmPath, consumerInstance: 77 };
const b64 = (b) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");

test("converges on two pools and answers exactly as the Go consumer on the same frames", async (t) => {
  // The pools publish only on a 300 ms timer (no event cadence): a helper
  // that read the relay's sequence before the posted events were published
  // would take the lane for converged too early, and contains() below would
  // miss the last event. postStored's ?sync=published write barrier rules it out.
  const slow = "expected=65536,cadence=1000000000,delay=300ms";
  const rl = await relay(["--pool", `dc-a:dc=1,${slow}`, "--pool", `dc-b:dc=2,${slow}`]);
  const steps = [];
  const router = await Router.connect({
    ...fast, relayUrl: rl.base, pools: ["dc-a", "dc-b"],
    trace(ev) {
      if (ev.op === "assign") steps.push({ op: "assign", assignment: b64(ev.bytes) });
      else if (ev.op === "retire") steps.push({ op: "retire", lane: ev.lane });
      else steps.push({ op: "apply", frame: b64(ev.bytes), mine: ev.result });
    },
  });
  const running = router.run();
  t.after(() => router.stop()); // a failed assertion must not leave the router resubscribing
  const a = await postStored(rl.base, "dc-a", 300, 4);
  const b = await postStored(rl.base, "dc-b", 100, 2);
  await converge(router, rl.base, "dc-a", 0);
  await converge(router, rl.base, "dc-b", 1);

  // Synchronously (no frame can arrive in between): the queries and the
  // frames that led to their answers.
  const splitAt = steps.length;
  const queries = [];
  for (const h of [a[0], a[299], b[0], b[99], [a[5][0], b[5][0]], []]) {
    queries.push({ op: "query", kind: 0, hashes: h.map(String), mine: router.consumer.queryRaw(0, h) });
  }
  for (const tokens of [Array.from({ length: 64 }, (_, i) => i), []]) {
    queries.push({ op: "query", kind: 2, tokens, block_size: 16, salt: "1337", mine: router.consumer.queryRaw(2, Uint32Array.from(tokens), 16, 1337n) });
  }
  // A one-block event's canonical hash is its tokens_hash.
  const single = await postStored(rl.base, "dc-b", 1, 1);
  await converge(router, rl.base, "dc-b", 1);
  queries.push({ op: "contains", hash: String(single[0][0]), mine: router.contains(single[0][0]) });
  queries.push({ op: "contains", hash: "12345", mine: router.contains(12345n) });
  const recorded = steps.slice();
  const li = router.lane(0);
  assert.ok(li.connected && li.ready && li.framesApplied > 0);
  assert.ok(li.stalenessMs !== null && li.stalenessMs < 10000, `staleness ${li.stalenessMs}`);

  // The queries find what each pool holds.
  assert.equal(queries[0].mine.depths[0], 4);
  assert.equal(queries[0].mine.depths[1], 0);
  assert.equal(queries[2].mine.depths[1], 2);
  assert.equal(queries[2].mine.depths[0], 0);
  assert.equal(queries.at(-2).mine, 0b10);

  // contains was asked after more frames: replay the frames recorded
  // before the queries, the queries, the later frames, then contains.
  const contains = queries.splice(-2);
  const all = [...recorded.slice(0, splitAt), ...queries, ...recorded.slice(splitAt), ...contains];
  const scenario = {
    name: "js-router", description: "frames recorded by the JavaScript router",
    manifest: b64(router.manifest), steps: all.map(({ mine, ...s }) => s),
  };
  const got = native(scenario);
  assert.equal(got.length, all.length);
  let applies = 0;
  all.forEach((st, i) => {
    const g = got[i];
    if (st.op === "apply") {
      applies++;
      assert.equal(g.outcome ?? 0, st.mine.outcome, `step ${i} outcome`);
      assert.equal(g.fault ?? 0, st.mine.fault, `step ${i} fault`);
      assert.equal(BigInt(g.sequence ?? "0"), st.mine.sequence, `step ${i} sequence`);
    } else if (st.op === "query") {
      assert.equal(g.code, st.mine.code, `step ${i} code`);
      assert.equal(g.mask ?? 0, st.mine.mask, `step ${i} mask`);
      assert.equal(g.blocks ?? 0, st.mine.blocks, `step ${i} blocks`);
      assert.deepEqual(g.depths ?? new Array(16).fill(0), st.mine.depths, `step ${i} depths`);
    } else if (st.op === "contains") {
      assert.equal(g.code, st.mine, `step ${i} contains`);
    } else {
      assert.equal(g.code, 0, `step ${i} ${st.op}`);
    }
  });
  assert.ok(applies > 2, `${applies} frames compared`);

  await router.stop();
  await running;
  assert.throws(() => router.querySequenceHashes([1n]), (e) => e instanceof AbiError && e.code === Code.Unavailable,
    "a stopped router's lanes are retired");
});

test("ready() resolves once every lane holds a snapshot, rejects when the router stops first", async () => {
  const rl = await relay(["--pool", "dc-a:dc=1,expected=4096", "--pool", "dc-b:dc=2,expected=4096"]);
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["dc-a", "dc-b"] });
  // Asked before run(): nothing can be ready yet.
  let settled = false;
  const ready = router.ready().then(() => { settled = true; });
  const aborted = new AbortController();
  const gaveUp = router.ready({ signal: aborted.signal });
  aborted.abort(new Error("caller gave up"));
  await assert.rejects(gaveUp, /caller gave up/);
  await new Promise((r) => setImmediate(r));
  assert.equal(settled, false);
  const running = router.run();
  await ready;
  for (const lane of [0, 1]) assert.ok(router.lane(lane).ready, `lane ${lane} ready`);
  assert.equal(router.consumer.stats().readyMask, 0b11);
  await router.ready(); // already ready: at once

  // queryLocalHashes: by the events' per-block tokens_hash values.
  const a = await postStored(rl.base, "dc-a", 3, 4);
  await converge(router, rl.base, "dc-a", 0);
  const q = router.queryLocalHashes(a[2]);
  assert.equal(q.mask, 0b11);
  assert.deepEqual(q.depths.slice(0, 2), [4, 0]);
  assert.equal(q.blocks, 4);
  assert.deepEqual(router.queryLocalHashes([a[2][0], 12345n]).depths.slice(0, 2), [1, 0]);

  await router.stop();
  await running;
  await assert.rejects(router.ready(), /router stopped/);

  // A router stopped while a lane still waits for its snapshot rejects the waiter.
  const lone = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["dc-a"] });
  const waiting = lone.ready();
  await lone.stop();
  await assert.rejects(waiting, /router stopped before every lane was ready/);
});

test("resubscribes with a higher epoch after a dropped connection", async () => {
  const rl = await relay(["--pool", "p:dc=1,expected=65536"]);
  const px = await startProxy(rl.addr);
  const router = await Router.connect({ ...fast, relayUrl: px.base, pools: ["p"] });
  const running = router.run();
  await postStored(rl.base, "p", 200, 4);
  await converge(router, rl.base, "p", 0);
  const before = router.lane(0);
  assert.ok(px.cut() > 0, "no proxied connection to cut");
  const hashes = await postStored(rl.base, "p", 200, 4);
  await converge(router, rl.base, "p", 0);
  const li = router.lane(0);
  assert.ok(li.resubscribes > before.resubscribes, `resubscribes ${li.resubscribes}`);
  assert.ok(li.epoch > before.epoch, "a higher epoch");
  assert.equal(router.consumer.queryLocalHashes(hashes[199]).depths[0], 4);
  await router.stop();
  await running;
  await px.close();
});

test("follows a relay restart to its new incarnation", async () => {
  const rl = await relay(["--pool", "p:dc=1,expected=65536"]);
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["p"] });
  const running = router.run();
  await postStored(rl.base, "p", 100, 4);
  await converge(router, rl.base, "p", 0);
  const inc1 = router.consumer.laneStatus(0).producerIncarnation;
  await rl.stop("SIGTERM");
  let rl2;
  for (let i = 0; !rl2 && i < 50; i++) {
    try {
      rl2 = await relay(["--pool", "p:dc=1,expected=65536"], { listen: rl.addr });
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  assert.ok(rl2, `could not restart the relay on ${rl.addr}`);
  const hashes = await postStored(rl2.base, "p", 100, 4);
  await converge(router, rl2.base, "p", 0);
  const inc2 = BigInt((await fetchCatalog(rl2.base)).pools[0].identity.producer_incarnation);
  assert.notEqual(inc2, inc1);
  assert.equal(router.consumer.laneStatus(0).producerIncarnation, inc2);
  assert.equal(router.consumer.queryLocalHashes(hashes[0]).depths[0], 4);
  await router.stop();
  await running;
});

test("every frame kind the relay emits decodes through the JavaScript decoder", async () => {
  const rl = await relay(["--pool", "p:dc=1,expected=4096"], { config: { heartbeat_interval: "30ms" } });
  const cat = await fetchCatalog(rl.base);
  const c = await Consumer.instantiate(wasmPath);
  c.configure(encodeManifest(manifestFromCatalog(cat, [{ pool: "p", lane: 0 }], { consumerInstance: 5 })));
  const resp = await fetch(`${rl.base}/v1/pools/p/stream?consumer=5&lane=0&epoch=1`);
  assert.equal(resp.status, 200);
  const seen = new Map();
  let posted = false, stopping = false;
  for await (const body of readFrames(resp.body)) {
    const f = decodeFrame(body);
    seen.set(f.kind, (seen.get(f.kind) ?? 0) + 1);
    if (f.kind === Kind.SnapshotChunk && f.chunkIndex === 0) {
      c.assign(encodeAssignment(f.identityBytes, { consumerInstance: 5n, physicalLane: 0, assignmentEpoch: 1n }));
    }
    // The module accepts what the JavaScript decoder accepts.
    const r = c.apply(body);
    assert.notEqual(r.outcome, Outcome.Deactivated);
    // One byte more is one value too many, for every kind.
    const longer = new Uint8Array(body.length + 1);
    longer.set(body);
    assert.throws(() => decodeFrame(longer), (e) => e instanceof FrameError && e.code === "trailing_bytes");
    assert.throws(() => c.apply(longer), (e) => e instanceof AbiError && e.code === Code.FrameTrailingBytes);
    if (!posted) {
      posted = true;
      await postStored(rl.base, "p", 20, 2);
    }
    if (!stopping && seen.has(Kind.Delta) && seen.has(Kind.Heartbeat)) {
      stopping = true;
      rl.proc.kill("SIGTERM"); // drain marker, then close
    }
    if (f.kind === Kind.Close) assert.equal(f.reason, "shutting_down");
  }
  assert.deepEqual([...seen.keys()].sort(), [1, 2, 3, 4, 5], `kinds seen: ${[...seen.entries()]}`);
  assert.ok((await hubSequence(rl.base, "p").catch(() => 1n)) > 0n);
});

test("follows pools of different sizes (formats) in one consumer, and refuses other query semantics", async (t) => {
  // Three formats: 32, 2,048 and 32,768 buckets. router_key is the domain
  // alone, so one router follows all three (a version-2 manifest, each
  // lane in its pool's format).
  const rl = await relay(["--pool", "s:dc=1,expected=64", "--pool", "m:dc=2,expected=4096", "--pool", "l:dc=3,expected=65536",
    "--pool", "x:dc=4,expected=64,block_size=32"]);
  const cat = await fetchCatalog(rl.base);
  const sizes = new Set(cat.pools.filter((p) => p.name !== "x").map((p) => p.identity.format.bucket_count));
  assert.equal(sizes.size, 3, "three bucket counts");
  const router = await Router.connect({ ...fast, relayUrl: rl.base, pools: ["s", "m", "l"] });
  const running = router.run();
  t.after(() => router.stop());
  const hs = [await postStored(rl.base, "s", 1, 2), await postStored(rl.base, "m", 1, 3), await postStored(rl.base, "l", 1, 5)];
  for (const [lane, pool] of ["s", "m", "l"].entries()) await converge(router, rl.base, pool, lane);
  assert.equal(router.consumer.stats().groups, 3, "one format group a pool");
  for (let lane = 0; lane < 3; lane++) {
    const st = router.consumer.laneStatus(lane);
    assert.equal(String(st.bucketCount), cat.pools[lane].identity.format.bucket_count, `lane ${lane}'s own bucket count`);
    const r = router.consumer.queryLocalHashes(hs[lane][0]);
    assert.deepEqual(r.depths.slice(0, 3), [0, 1, 2].map((l) => (l === lane ? hs[lane][0].length : 0)), `lane ${lane}'s request`);
    assert.equal(router.laneWords(lane).words.length, Number(st.bucketCount));
  }
  await router.stop();
  await running;
  // Pools hashed with another block size cannot be asked one request.
  assert.throws(() => manifestFromCatalog(cat, [{ pool: "s", lane: 0 }, { pool: "x", lane: 1 }], { consumerInstance: 1 }), /block_size/);
});
