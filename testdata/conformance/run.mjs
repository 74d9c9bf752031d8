// Conformance runner for Node.js (≥ 20): a second host for the consumer
// module that shares no code with wasm/host. It loads the module through
// node:wasi, runs every scenario file against the ABI of docs/abi.md and
// compares each result with the file, exactly as internal/conformance does
// for the native consumer and wazero.
//
//   node testdata/conformance/run.mjs wasm/host/ckfconsumer.wasm testdata/conformance
//
// Exit status 0 when every step matches, 1 otherwise.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { WASI } from "node:wasi";

const [wasmPath, dir] = process.argv.slice(2);
if (!wasmPath || !dir) {
  console.error("usage: node run.mjs <module.wasm> <scenario dir>");
  process.exit(2);
}
const module = await WebAssembly.compile(readFileSync(wasmPath));

// Status codes used below (docs/abi.md).
const UNAVAILABLE = -30;
const RESULT_SIZE = 32, QUERY_RECORD_SIZE = 80, LANE_STATUS_SIZE = 168;

async function instantiate() {
  const wasi = new WASI({ version: "preview1", args: [], env: {}, returnOnExit: true });
  const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
  wasi.initialize(instance); // runs _initialize once: the module is a reactor
  return instance.exports;
}

// Host wrapper: one scratch buffer for inputs, one for records.
class Host {
  constructor(x) {
    this.x = x;
    this.out = x.alloc(256);
    this.cap = 0;
    this.scratch = 0;
  }
  view() { return new DataView(this.x.memory.buffer); } // re-read after every call: memory may grow
  bytes(p, n) { return new Uint8Array(this.x.memory.buffer, p, n); }
  input(n) {
    if (n > this.cap) {
      if (this.scratch) this.x.free(this.scratch);
      this.cap = Math.max(n, 4096);
      this.scratch = this.x.alloc(this.cap);
      if (this.scratch === 0) throw new Error(`alloc(${n}) refused`);
    }
    return this.scratch;
  }
  write(buf) {
    const p = this.input(buf.length);
    this.bytes(p, buf.length).set(buf);
    return p;
  }
  lastError() {
    const n = this.x.last_error(this.out, 256);
    return n > 0 ? Buffer.from(this.bytes(this.out, Math.min(n, 256))).toString() : "";
  }
}

const b64 = (s) => (s ? Buffer.from(s, "base64") : Buffer.alloc(0));
const u64 = (s) => BigInt(s ?? "0");

function exec(h, st) {
  const x = h.x;
  switch (st.op) {
    case "assign": {
      const a = b64(st.assignment);
      return { code: x.assign(h.write(a), a.length) };
    }
    case "retire":
      return { code: x.retire(st.lane ?? 0) };
    case "apply": {
      const f = b64(st.frame);
      const code = x.apply(h.write(f), f.length);
      if (code < 0) return { code, outcome: 0, fault: 0, result_lane: -1, sequence: "0" };
      x.last_result(h.out);
      const v = h.view();
      return {
        code, outcome: v.getUint8(h.out + 4), fault: v.getUint8(h.out + 5),
        result_lane: v.getInt8(h.out + 6), sequence: v.getBigUint64(h.out + 8, true).toString(),
      };
    }
    case "query": {
      const kind = st.kind ?? 0;
      let p, count;
      if (kind === 2) {
        const t = st.tokens ?? [];
        count = t.length;
        p = h.input(4 * count);
        const v = h.view();
        t.forEach((tok, i) => v.setUint32(p + 4 * i, tok, true));
      } else {
        const hs = st.hashes ?? [];
        count = hs.length;
        p = h.input(8 * count);
        const v = h.view();
        hs.forEach((s, i) => v.setBigUint64(p + 8 * i, u64(s), true));
      }
      const code = x.query(kind, p, count, st.block_size ?? 0, u64(st.salt), h.out);
      const r = { code, mask: 0, depths: new Array(16).fill(0), blocks: 0 };
      if (code >= 0 || code === UNAVAILABLE) {
        const v = h.view();
        for (let l = 0; l < 16; l++) r.depths[l] = v.getUint32(h.out + 4 * l, true);
        r.mask = v.getUint32(h.out + 64, true);
        r.blocks = v.getUint32(h.out + 68, true);
      }
      return r;
    }
    case "contains":
      return { code: x.contains(u64(st.hash)) };
    case "status": {
      const code = x.lane_status(st.lane ?? 0, h.out);
      const r = { code, ready: false, assigned: false, installed: "0", last_epoch: "0", staging: false, last_outcome: 0, last_fault: 0 };
      if (code < 0) return r;
      const v = h.view(), o = h.out;
      return {
        code, assigned: v.getUint8(o + 1) !== 0, ready: v.getUint8(o + 2) !== 0,
        staging: v.getUint8(o + 4) !== 0, last_outcome: v.getUint8(o + 5), last_fault: v.getUint8(o + 6),
        last_epoch: v.getBigUint64(o + 24, true).toString(), installed: v.getBigUint64(o + 32, true).toString(),
      };
    }
    case "words": {
      // Ask for the size first through stats (bucket_count at offset 0).
      x.stats(h.out);
      const n = Number(h.view().getBigUint64(h.out, true)) * 8;
      const p = h.input(n);
      const code = x.lane_words(st.lane ?? 0, p, n);
      if (code < 0) return { code, sha256: "" };
      return { code: 0, sha256: createHash("sha256").update(h.bytes(p, n)).digest("hex") };
    }
  }
  throw new Error(`unknown op ${st.op}`);
}

// expected mirrors internal/conformance normalize: the fields an op reports,
// with JSON's omitted fields as zero values.
function expected(st) {
  const w = st.want ?? {};
  const code = w.code ?? 0;
  switch (st.op) {
    case "apply":
      return { code, outcome: w.outcome ?? 0, fault: w.fault ?? 0, result_lane: w.result_lane ?? 0, sequence: w.sequence ?? "0" };
    case "query":
      return { code, mask: w.mask ?? 0, depths: w.depths ?? new Array(16).fill(0), blocks: w.blocks ?? 0 };
    case "status":
      return {
        code, assigned: w.assigned ?? false, ready: w.ready ?? false, staging: w.staging ?? false,
        last_outcome: w.last_outcome ?? 0, last_fault: w.last_fault ?? 0,
        last_epoch: w.last_epoch ?? "0", installed: w.installed ?? "0",
      };
    case "words":
      return { code, sha256: w.sha256 ?? "" };
  }
  return { code };
}

const canon = (o) => JSON.stringify(Object.keys(o).sort().map((k) => [k, o[k]]));

let failures = 0, steps = 0;
const files = readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
for (const file of files) {
  const sc = JSON.parse(readFileSync(join(dir, file), "utf8"));
  const h = new Host(await instantiate());
  const m = b64(sc.manifest);
  const rc = h.x.configure(h.write(m), m.length);
  if (rc !== 0) {
    console.log(`FAIL ${sc.name}: configure returned ${rc}: ${h.lastError()}`);
    failures++;
    continue;
  }
  let bad = 0;
  sc.steps.forEach((st, i) => {
    steps++;
    const got = exec(h, st), want = expected(st);
    if (canon(got) !== canon(want)) {
      bad++;
      console.log(`FAIL ${sc.name} step ${i} (${st.op}: ${st.note ?? ""}): got ${canon(got)}, want ${canon(want)}`);
    }
  });
  const live = h.x.live_buffers();
  if (live !== 2) {
    bad++;
    console.log(`FAIL ${sc.name}: ${live} live buffers after the scenario, want 2 (scratch + record)`);
  }
  failures += bad;
  console.log(`${bad ? "FAIL" : "ok  "} ${sc.name} (${sc.steps.length} steps)`);
}
console.log(`node ${process.version}: ${files.length} scenarios, ${steps} steps, ${failures} failures`);
process.exit(failures ? 1 : 0);
