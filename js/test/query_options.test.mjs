// Query by tokens with hash options (query kind 3, docs/abi.md §3.1) through
// Consumer.queryTokensWith and Router.queryTokensWith: the token_options
// conformance scenario's frames applied, its kind-3 queries asked through
// the typed methods (not queryRaw), each answer the file's.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Consumer, Router, AbiError, Code, QueryKind } from "../src/index.js";
import { repo, wasmPath } from "../testsupport/relay.mjs";

const scenario = JSON.parse(readFileSync(join(repo, "testdata", "conformance", "token_options.json"), "utf8"));
const b64 = (s) => Buffer.from(s ?? "", "base64");

test("queryTokensWith answers the token_options scenario through Consumer and Router", async () => {
  const c = await Consumer.instantiate(wasmPath);
  c.configure(b64(scenario.manifest));
  const router = new Router(c, { relayUrl: "http://127.0.0.1:1", pools: ["p0", "p1"], consumerInstance: 1 }); // never run: only its query method
  let asked = 0;
  for (const st of scenario.steps) {
    if (st.op === "assign") c.assign(b64(st.assignment));
    if (st.op === "apply") c.apply(b64(st.frame));
    if (st.op !== "query" || st.kind !== QueryKind.TokensWith) continue;
    const options = { mm: (st.mm ?? []).map((l) => (l ?? []).map(BigInt)), eagle: !!st.eagle };
    const salt = BigInt(st.salt ?? "0");
    const want = st.want;
    for (const [who, q] of [["consumer", c], ["router", router]]) {
      if (want.code < 0) {
        assert.throws(() => q.queryTokensWith(st.tokens ?? [], st.block_size ?? 0, salt, options),
          (e) => e instanceof AbiError && e.code === want.code, `${who}: ${st.note}`);
        continue;
      }
      const r = q.queryTokensWith(st.tokens ?? [], st.block_size ?? 0, salt, options);
      assert.deepEqual(r.depths, want.depths ?? new Array(16).fill(0), `${who}: ${st.note}`);
      assert.equal(r.mask, want.mask ?? 0, `${who}: ${st.note}`);
      assert.equal(r.blocks, want.blocks ?? 0, `${who}: ${st.note}`);
    }
    asked++;
  }
  assert.ok(asked >= 10, `${asked} kind-3 queries in the scenario`);
  // The namespace through the salt export equals the scenario's tenant salt.
  const tenant = scenario.steps.find((st) => st.note === "tenant, the stored images");
  assert.equal(c.salt("", "tenant-a"), BigInt(tenant.salt));
  assert.equal(c.queryRaw(QueryKind.TokensWith, new Uint8Array(15), 4).code, Code.BadArgument, "a 15-byte request");
});
