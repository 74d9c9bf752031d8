// Conformance runner for Node.js (≥ 20): runs every scenario file against
// the module through js/src/module.js — the JavaScript host of the ABI that
// the js/ router client uses, sharing no code with wasm/host — and compares
// each result with the file, exactly as internal/integration/conformance does for the
// native consumer and wazero.
//
//   node testdata/conformance/run.mjs wasm/host/ckfconsumer.wasm testdata/conformance
//
// Exit status 0 when every step matches, 1 otherwise.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { Consumer, AbiError, compileModule, encodeTokenQuery } from "../../js/src/module.js";

const [wasmPath, dir] = process.argv.slice(2);
if (!wasmPath || !dir) {
  console.error("usage: node run.mjs <module.wasm> <scenario dir>");
  process.exit(2);
}
const module = await compileModule(wasmPath);

const b64 = (s) => (s ? Buffer.from(s, "base64") : Buffer.alloc(0));
const u64 = (s) => BigInt(s ?? "0");

// code runs f and returns 0, or the status code of the AbiError it threw.
function code(f) {
  try {
    f();
    return 0;
  } catch (e) {
    if (e instanceof AbiError) return e.code;
    throw e;
  }
}

function exec(c, st) {
  switch (st.op) {
    case "assign":
      return { code: code(() => c.assign(b64(st.assignment))) };
    case "retire":
      return { code: code(() => c.retire(st.lane ?? 0)) };
    case "apply": {
      let r;
      const rc = code(() => { r = c.apply(b64(st.frame)); });
      if (rc < 0) return { code: rc, outcome: 0, fault: 0, result_lane: -1, sequence: "0" };
      return { code: r.outcome, outcome: r.outcome, fault: r.fault, result_lane: r.lane, sequence: r.sequence.toString() };
    }
    case "query": {
      const kind = st.kind ?? 0;
      // Typed arrays take module.js's bulk-copy path; local hashes stay a
      // plain array of BigInt, so the element-wise path is exercised too.
      const hashes = (st.hashes ?? []).map(u64);
      const input = kind === 3 ? encodeTokenQuery(st.tokens ?? [], { mm: (st.mm ?? []).map((l) => (l ?? []).map(u64)), eagle: !!st.eagle })
        : kind === 2 ? Uint32Array.from(st.tokens ?? []) : kind === 1 ? BigUint64Array.from(hashes) : hashes;
      const { code, mask, depths, blocks } = c.queryRaw(kind, input, st.block_size ?? 0, u64(st.salt));
      return { code, mask, depths, blocks };
    }
    case "contains": {
      let mask = 0;
      const rc = code(() => { mask = c.contains(u64(st.hash)); });
      return { code: rc < 0 ? rc : mask };
    }
    case "status": {
      let s;
      const rc = code(() => { s = c.laneStatus(st.lane ?? 0); });
      if (rc < 0) return { code: rc, ready: false, assigned: false, installed: "0", last_epoch: "0", staging: false, last_outcome: 0, last_fault: 0, seed: "0", bucket_count: "0" };
      return {
        code: 0, assigned: s.assigned, ready: s.ready, staging: s.staging, last_outcome: s.lastOutcome,
        last_fault: s.lastFault, last_epoch: s.lastEpoch.toString(), installed: s.installedSequence.toString(),
        seed: s.seed.toString(), bucket_count: s.bucketCount.toString(),
      };
    }
    case "words": {
      let w;
      const rc = code(() => { w = c.laneWords(st.lane ?? 0); });
      if (rc < 0) return { code: rc, sha256: "" };
      return { code: 0, sha256: createHash("sha256").update(new Uint8Array(w.buffer, w.byteOffset, w.byteLength)).digest("hex") };
    }
  }
  throw new Error(`unknown op ${st.op}`);
}

// expected mirrors internal/integration/conformance normalize: the fields an op reports,
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
        last_epoch: w.last_epoch ?? "0", installed: w.installed ?? "0", seed: w.seed ?? "0", bucket_count: w.bucket_count ?? "0",
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
  const c = await Consumer.instantiate(module);
  try {
    c.configure(b64(sc.manifest));
  } catch (e) {
    console.log(`FAIL ${sc.name}: ${e.message}`);
    failures++;
    continue;
  }
  let bad = 0;
  sc.steps.forEach((st, i) => {
    steps++;
    const got = exec(c, st), want = expected(st);
    if (canon(got) !== canon(want)) {
      bad++;
      console.log(`FAIL ${sc.name} step ${i} (${st.op}: ${st.note ?? ""}): got ${canon(got)}, want ${canon(want)}`);
    }
  });
  const live = c.liveBuffers();
  if (live !== 2) {
    bad++;
    console.log(`FAIL ${sc.name}: ${live} live buffers after the scenario, want 2 (scratch + record)`);
  }
  failures += bad;
  console.log(`${bad ? "FAIL" : "ok  "} ${sc.name} (${sc.steps.length} steps)`);
}
console.log(`node ${process.version}: ${files.length} scenarios, ${steps} steps, ${failures} failures`);
process.exit(failures ? 1 : 0);
