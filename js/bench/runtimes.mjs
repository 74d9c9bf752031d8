// Four-runtime benchmark driver for Node (internal/integration/wasmtime
// BenchmarkRuntimes): installs the state of a setup file, then runs timed
// operations requested on stdin.
//
//   node js/bench/runtimes.mjs <module.wasm> <setup file>
//
// The setup file is length-prefixed records (the wire stream framing):
// manifest; per lane 0..15 an assignment and a one-chunk snapshot frame; the
// request's token ids (u32 LE); the block size (u32 LE); the request's
// sequence hashes (u64 LE); and two u32 LE byte offsets: where lane 0's
// assignment and snapshot frame hold their assignment epoch (a one-byte
// msgpack fixint, so epochs 1..127 are written in place).
//
// Each stdin line "<op> <depth> <n>" runs n operations, each timed alone, and
// prints "ok <p50 ns> <p99 ns> <lane 15 depth>"; ops are tokens and seq
// (queries of the first depth blocks), contains (the first sequence hash),
// install (a whole snapshot on lane 0
// under a new epoch; the assign is outside the timing) and instantiate
// (instantiate a compiled module, _initialize, configure).
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Consumer, Outcome, compileModule, readFrames, BASE_SALT } from "../src/index.js";

const [wasmPath, setupPath] = process.argv.slice(2);
const records = [];
for await (const r of readFrames([readFileSync(setupPath)], 1 << 30)) records.push(r);
const module = await compileModule(wasmPath);
const manifest = records[0];
const lanes = 16;
const assign = (l) => records[1 + 2 * l], frame = (l) => records[2 + 2 * l];
let i = 1 + 2 * lanes;
const t = records[i++];
const tokens = new Uint32Array(t.buffer.slice(t.byteOffset, t.byteOffset + t.byteLength));
const blockSize = new DataView(records[i].buffer, records[i++].byteOffset).getUint32(0, true);
const s = records[i++];
const seq = new BigUint64Array(s.buffer.slice(s.byteOffset, s.byteOffset + s.byteLength));
const offs = new DataView(records[i].buffer, records[i].byteOffset);
const assignEpochAt = offs.getUint32(0, true), frameEpochAt = offs.getUint32(4, true);

async function fresh(n) {
  const c = await Consumer.instantiate(module);
  c.configure(manifest);
  for (let l = 0; l < n; l++) {
    c.assign(assign(l));
    const r = c.apply(frame(l));
    if (r.outcome !== Outcome.SnapshotInstalled) throw new Error(`lane ${l}: outcome ${r.outcome}`);
  }
  return c;
}

const c = await fresh(lanes);
// The install consumer, warmed by one install (its table's pages committed),
// as the Go side does before timing; and one instance made and dropped.
let ic = await fresh(1), epoch = 1;
await fresh(0);
console.log("ready");

const lat = [];
const ns = (t0) => Number(process.hrtime.bigint() - t0);
for await (const line of createInterface({ input: process.stdin })) {
  const [op, d, n] = line.split(" ");
  const depth = Number(d);
  lat.length = 0;
  let res = { depths: [] };
  if (op === "tokens" || op === "seq") {
    const input = op === "tokens" ? tokens.subarray(0, depth * blockSize) : seq.subarray(0, depth);
    for (let k = 0; k < Number(n); k++) {
      const t0 = process.hrtime.bigint();
      res = op === "tokens" ? c.queryTokens(input, blockSize, BASE_SALT) : c.querySequenceHashes(input);
      lat.push(ns(t0));
    }
  } else if (op === "contains") {
    for (let k = 0; k < Number(n); k++) {
      const t0 = process.hrtime.bigint();
      const m = c.contains(seq[0]);
      lat.push(ns(t0));
      if (m !== 0xffff) throw new Error(`contains: mask ${m}`);
    }
  } else if (op === "install") {
    const a = assign(0), f = frame(0);
    for (let k = 0; k < Number(n); k++) {
      if (++epoch > 127) {
        ic = await fresh(1);
        epoch = 2;
      }
      a[assignEpochAt] = epoch;
      f[frameEpochAt] = epoch;
      ic.assign(a);
      const t0 = process.hrtime.bigint();
      const r = ic.apply(f);
      lat.push(ns(t0));
      if (r.outcome !== Outcome.SnapshotInstalled) throw new Error(`install epoch ${epoch}: outcome ${r.outcome}`);
    }
  } else if (op === "instantiate") {
    for (let k = 0; k < Number(n); k++) {
      const t0 = process.hrtime.bigint();
      const x = await Consumer.instantiate(module);
      x.configure(manifest);
      lat.push(ns(t0));
    }
  } else {
    throw new Error(`unknown op ${op}`);
  }
  lat.sort((a, b) => a - b);
  console.log(`ok ${lat[lat.length >> 1]} ${lat[Math.floor(lat.length * 99 / 100)]} ${res.depths[15] ?? 0}`);
}
