// The ABI host on its own: the module's answers to the arguments a host in
// another language passes as they are (negative i32 lanes and block sizes, a
// bogus free), as docs/abi.md promises.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Consumer, AbiError, Code, MAX_INPUT_BYTES } from "../src/index.js";
import { repo, wasmPath } from "../testsupport/relay.mjs";

const scenario = JSON.parse(readFileSync(join(repo, "testdata", "conformance", "normal_flow.json"), "utf8"));

test("signed lanes and block sizes, and last_error after a failed free", async () => {
  const c = await Consumer.instantiate(wasmPath);
  c.configure(Buffer.from(scenario.manifest, "base64"));
  for (const [name, f] of [["lane_status", () => c.laneStatus(-1)], ["lane_words", () => c.laneWords(-1)], ["retire", () => c.retire(-1)]]) {
    assert.throws(f, (e) => e instanceof AbiError && e.code === Code.WrongLane && /lane -1\b/.test(e.message), name);
  }
  for (const bs of [0, -1, -16]) {
    assert.throws(() => c.queryTokens(new Uint32Array(64), bs), (e) => e instanceof AbiError && e.code === Code.InvalidQuery, `block size ${bs}`);
  }
  assert.equal(c.x.free(c.in + 1), Code.BadArgument);
  assert.match(c.lastError(), /free/);
  assert.equal(c.liveBuffers(), 2);
});

test("inputs over the 64 MiB cap: the Go hosts' errors, before any allocation", async () => {
  const c = await Consumer.instantiate(wasmPath);
  c.configure(Buffer.from(scenario.manifest, "base64"));
  assert.throws(() => c.apply(new Uint8Array(MAX_INPUT_BYTES + 1)), (e) => e instanceof AbiError && e.code === Code.FrameTooLarge, "frame");
  assert.throws(() => c.queryTokens(new Uint32Array(MAX_INPUT_BYTES / 4 + 1), 4), (e) => e instanceof AbiError && e.code === Code.InvalidQuery, "tokens");
  assert.throws(() => c.querySequenceHashes(new BigUint64Array(MAX_INPUT_BYTES / 8 + 1)), (e) => e instanceof AbiError && e.code === Code.InvalidQuery, "hashes");
  assert.equal(c.liveBuffers(), 2, "no buffer was allocated for them");
});
