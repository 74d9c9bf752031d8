// Query benchmark driver for Node (internal/integration/conformance BenchmarkNodeQuery):
// installs the state in a setup file, then answers requests on stdin.
//
//   node js/bench/query.mjs <module.wasm> <setup file>
//
// The setup file is length-prefixed records (the wire stream framing):
// manifest, then per lane an assignment and a one-chunk snapshot frame, then
// the query's token ids (u32 LE) and the block size (u32 LE). Each stdin line
// "N" runs N token queries, each timed alone, and prints
// "ok <p50 ns> <p99 ns> <lane 15 depth>".
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Consumer, Outcome, readFrames, BASE_SALT } from "../src/index.js";

const [wasmPath, setupPath] = process.argv.slice(2);
const records = [];
for await (const r of readFrames([readFileSync(setupPath)], 1 << 30)) records.push(r);
const c = await Consumer.instantiate(wasmPath);
c.configure(records[0]);
const lanes = (records.length - 3) / 2;
for (let l = 0; l < lanes; l++) {
  c.assign(records[1 + 2 * l]);
  const r = c.apply(records[2 + 2 * l]);
  if (r.outcome !== Outcome.SnapshotInstalled) throw new Error(`lane ${l}: outcome ${r.outcome}`);
}
const t = records[records.length - 2];
const tokens = new Uint32Array(t.buffer.slice(t.byteOffset, t.byteOffset + t.byteLength));
const blockSize = new DataView(records.at(-1).buffer, records.at(-1).byteOffset).getUint32(0, true);
console.log("ready");

const lat = [];
for await (const line of createInterface({ input: process.stdin })) {
  const n = Number(line);
  lat.length = 0;
  let res;
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    res = c.queryTokens(tokens, blockSize, BASE_SALT);
    lat.push(Number(process.hrtime.bigint() - t0));
  }
  lat.sort((a, b) => a - b);
  console.log(`ok ${lat[lat.length >> 1]} ${lat[Math.floor(lat.length * 99 / 100)]} ${res.depths[15]}`);
}
