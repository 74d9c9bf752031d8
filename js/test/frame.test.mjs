// The JavaScript msgpack and frame decoders on their own: the worked example
// of docs/wire.md, strictness (one value, no trailing bytes, bounded depth),
// and the manifest encoder against the Go encoder's bytes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { decodeFrame, readFrames, FrameError, Kind, decodeMsgpack, MsgpackError, encodeManifest, encodeAssignment } from "../src/index.js";
import { repo } from "../testsupport/relay.mjs";

// docs/wire.md §5, without the length prefix.
const golden = Buffer.from(
  "97" + "01" + "02" + "94" + "95" + "c410" + "0102030405060708090a0b0c0d0e0f10" + "01" +
  "c410" + "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf" + "00" + "07" + "cf1122334455667788" + "03" +
  "95" + "01" + "cf5deece66d1b54a33" + "cd0400" + "10" + "04" + "932a0509" + "11" + "12" +
  "c418" + "03000000cdab000000000000" + "ff0300000000000000000000", "hex");

test("the worked delta example of docs/wire.md", () => {
  assert.equal(golden.length, 102);
  const f = decodeFrame(golden);
  assert.equal(f.kind, Kind.Delta);
  assert.equal(f.identity.pool.cacheSemantics.digest, "0102030405060708090a0b0c0d0e0f10");
  assert.equal(f.identity.pool.cacheSemantics.source, 1);
  assert.equal(f.identity.pool.routingScope.source, 0);
  assert.equal(f.identity.pool.dcId, 7n);
  assert.equal(f.identity.producerIncarnation, 0x1122334455667788n);
  assert.equal(f.identity.format.seed, 0x5deece66d1b54a33n);
  assert.equal(f.identity.format.bucketCount, 1024n);
  assert.deepEqual(f.lease, { consumerInstance: 42n, physicalLane: 5, assignmentEpoch: 9n });
  assert.equal(f.baseSequence, 17n);
  assert.equal(f.sequence, 18n);
  assert.equal(f.images.length, 24);
  assert.equal(Buffer.from(f.identityBytes).toString("hex"), golden.subarray(3, 3 + f.identityBytes.length).toString("hex"));
  const drain = decodeFrame(Buffer.from("940103932a050912", "hex"));
  assert.deepEqual(drain, { kind: Kind.DrainMarker, lease: { consumerInstance: 42n, physicalLane: 5, assignmentEpoch: 9n }, expectedSequence: 18n });
});

test("a delta with the old array(6) header is rejected", () => {
  const six = Buffer.from(golden);
  six[0] = 0x96;
  assert.throws(() => decodeFrame(six), (e) => e instanceof FrameError && e.code === "trailing_bytes");
});

test("strictness: trailing bytes, truncation, reserved byte, depth, types", () => {
  const cases = [
    [Buffer.concat([golden, Buffer.of(0xc0)]), "trailing_bytes"],
    [golden.subarray(0, 50), "truncated"],
    [Buffer.of(), "truncated"],
    [Buffer.of(0x92, 0x01, 0xc1), "malformed"],
    [Buffer.of(0x92, 0x02, 0x01), "unknown_version"],
    [Buffer.of(0x92, 0x01, 0x06), "unknown_kind"],
    [Buffer.of(0x93, 0x01, 0x03, 0x00), "malformed"], // drain marker with 3 elements
    [Buffer.of(0x94, 0x01, 0x03, 0x93, 0x2a, 0xd0, 0xff, 0x09, 0x12), "malformed"], // negative lane
    [Buffer.of(0x94, 0x01, 0x03, 0x93, 0x2a, 0xcd, 0x01, 0x00, 0x09, 0x12), "malformed"], // lane 256
    [Buffer.of(0x94, 0x01, 0x05, 0xc4, 0x00, 0xa0), "malformed"], // bin reason
    [Buffer.of(0xdd, 0xff, 0xff, 0xff, 0xff), "truncated"], // huge count, nothing allocated
    [Buffer.alloc(200, 0x91), "malformed"], // nesting
  ];
  for (const [b, code] of cases) {
    assert.throws(() => decodeFrame(b), (e) => e instanceof FrameError && e.code === code, `${Buffer.from(b).toString("hex").slice(0, 24)} → ${code}`);
  }
  assert.throws(() => decodeMsgpack(Buffer.of(0x01, 0x02)), (e) => e instanceof MsgpackError && e.code === "trailing_bytes");
  assert.equal(decodeMsgpack(Buffer.of(0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)), 0xffffffffffffffffn);
  assert.equal(decodeMsgpack(Buffer.of(0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0)), -(2n ** 63n));
  assert.equal(decodeMsgpack(Buffer.of(0xc0)), null);
});

test("readFrames splits a stream cut anywhere, and rejects a frame above the limit", async () => {
  const one = Buffer.concat([Buffer.of(0, 0, 0, golden.length), golden]);
  const stream = Buffer.concat([one, one, one]);
  for (const size of [1, 3, 5, 101, 106, stream.length]) {
    const chunks = [];
    for (let i = 0; i < stream.length; i += size) chunks.push(stream.subarray(i, i + size));
    const got = [];
    for await (const body of readFrames(chunks)) got.push(Buffer.from(body).toString("hex"));
    assert.deepEqual(got, new Array(3).fill(golden.toString("hex")), `chunks of ${size}`);
  }
  await assert.rejects(async () => { for await (const _ of readFrames([one], 101)); }, (e) => e.code === "too_large");
  await assert.rejects(async () => { for await (const _ of readFrames([one.subarray(0, 50)])); }, (e) => e.code === "truncated");
  await assert.rejects(async () => { for await (const _ of readFrames([Buffer.alloc(4)])); }, (e) => e.code === "malformed");
});

test("encodeManifest and encodeAssignment write the Go encoder's bytes", () => {
  const dir = join(repo, "testdata", "conformance");
  let checked = 0;
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".json"))) {
    const sc = JSON.parse(readFileSync(join(dir, file), "utf8"));
    const bytes = Buffer.from(sc.manifest, "base64");
    // Version 1 or 2 (per-lane formats: format may be nil, lane_formats follows).
    const [, instance, domain, format, lanes, window, laneFormats] = decodeMsgpack(bytes);
    const digest = (b, s) => ({ digest: b, source: Number(s) });
    const d = { cacheSemantics: digest(domain[0], domain[1]), routingScope: digest(domain[2], domain[3]) };
    const fmt = (f) => f && { version: f[0], seed: f[1], bucketCount: f[2], fingerprintBits: f[3], slotsPerBucket: f[4] };
    const m = {
      consumerInstance: instance, domain: d, verificationWindow: Number(window), format: fmt(format),
      lanes: lanes.map((p) => p && { domain: { cacheSemantics: digest(p[0], p[1]), routingScope: digest(p[2], p[3]) }, dcId: p[4] }),
      laneFormats: laneFormats?.map(fmt),
    };
    assert.equal(Buffer.from(encodeManifest(m)).toString("hex"), bytes.toString("hex"), file);
    for (const st of sc.steps.filter((s) => s.op === "assign")) {
      const a = Buffer.from(st.assignment, "base64");
      const [identity, lease] = decodeMsgpack(a);
      void identity;
      // The identity is everything between the outer header and the lease.
      const leaseBytes = 1 + lease.reduce((n, v) => n + (v < 128n ? 1 : v < 256n ? 2 : v < 65536n ? 3 : v < 2n ** 32n ? 5 : 9), 0);
      const idBytes = a.subarray(1, a.length - leaseBytes);
      const got = encodeAssignment(idBytes, { consumerInstance: lease[0], physicalLane: Number(lease[1]), assignmentEpoch: lease[2] });
      assert.equal(Buffer.from(got).toString("hex"), a.toString("hex"), `${file} assignment`);
      checked++;
    }
  }
  assert.ok(checked > 10, `${checked} assignments`);
});

test("mutated frames either decode or fail with a FrameError, never anything else", () => {
  // A small deterministic fuzz: flip, insert and delete bytes of valid frames.
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
  const seeds = [golden, Buffer.from("940103932a050912", "hex"), Buffer.from("940105ad7368757474696e675f646f776ea3627965", "hex")];
  let decoded = 0;
  for (let i = 0; i < 20000; i++) {
    const b = Buffer.from(seeds[rnd(seeds.length)]);
    const m = Buffer.from(b);
    let x = m;
    switch (rnd(3)) {
      case 0: x[rnd(x.length)] = rnd(256); break;
      case 1: { const at = rnd(x.length); x = Buffer.concat([x.subarray(0, at), Buffer.of(rnd(256)), x.subarray(at)]); break; }
      case 2: { const at = rnd(x.length); x = Buffer.concat([x.subarray(0, at), x.subarray(at + 1)]); break; }
    }
    try {
      decodeFrame(x);
      decoded++;
    } catch (e) {
      assert.ok(e instanceof FrameError, `${x.toString("hex")}: ${e}`);
    }
  }
  assert.ok(decoded > 0);
});
