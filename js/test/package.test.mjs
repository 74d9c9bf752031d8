// The package as npm users get it: its declarations type-check under a
// Node-only and a DOM TypeScript config with the pinned typescript
// devDependency, the tarball carries what the README links to, and bad
// options are refused with a clear message before any request.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import * as api from "../src/index.js";
import { Router } from "../src/index.js";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
const require = createRequire(join(pkgDir, "package.json"));
const tsc = join(pkgDir, "node_modules", "typescript", "bin", "tsc");
const hasNpm = spawnSync("npm", ["--version"], { stdio: "ignore" }).status === 0;

for (const config of ["tsconfig.node.json", "tsconfig.dom.json"]) {
  test(`index.d.ts type-checks under test/types/${config}`, (t) => {
    if (!existsSync(tsc)) return t.skip("typescript is not installed: run `npm ci` in js/ (make js-test does)");
    // The devDependency is pinned exactly; a stale node_modules is not it.
    assert.equal(require("typescript/package.json").version, pkg.devDependencies.typescript,
      "node_modules holds another typescript than package.json pins: run `npm ci` in js/");
    const r = spawnSync(process.execPath, [tsc, "--noEmit", "-p", join("test", "types", config)], { cwd: pkgDir, encoding: "utf8" });
    assert.equal(r.status, 0, `tsc --noEmit -p test/types/${config}:\n${r.stdout}${r.stderr}`);
  });
}

test("test/types/usage.ts imports every runtime export", () => {
  const src = readFileSync(join(pkgDir, "test", "types", "usage.ts"), "utf8");
  const m = /import\s*\{([^}]*)\}\s*from\s*"@ckfrelay\/router"/.exec(src);
  assert.ok(m, "usage.ts has no value import from @ckfrelay/router");
  const imported = new Set(m[1].split(",").map((s) => s.trim()).filter(Boolean));
  assert.deepEqual(Object.keys(api).filter((k) => !imported.has(k)), [], "exports usage.ts does not type-check");
});

test("the tarball carries the examples, the module and every file README.md links to", (t) => {
  if (!hasNpm) return t.skip("npm not found");
  const out = execFileSync("npm", ["pack", "--dry-run", "--json"], { cwd: pkgDir, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
  const files = new Set(JSON.parse(out)[0].files.map((f) => f.path));
  for (const want of ["examples/router.mjs", "ckfconsumer.wasm", "src/index.js", "src/index.d.ts", "README.md", "package.json"]) {
    assert.ok(files.has(want), `${want} is not packed: ${[...files].join(", ")}`);
  }
  const readme = readFileSync(join(pkgDir, "README.md"), "utf8");
  const links = [...readme.matchAll(/\]\(([^)\s]+)\)/g)].map((x) => x[1]).filter((u) => !/^[a-z][a-z0-9+.-]*:|^#/i.test(u));
  assert.ok(links.length > 0, "README.md has no relative link: the check would check nothing");
  for (const link of links) {
    const path = normalize(decodeURIComponent(link.split("#")[0])).replace(/\\/g, "/");
    assert.ok(files.has(path), `README.md links to ${link}, which is not in the package (${[...files].join(", ")})`);
  }
});

test("a consumerInstance that is not an unsigned 64-bit integer is refused with a clear message", async () => {
  const base = { relayUrl: "http://127.0.0.1:9", pools: ["p"] };
  const fetch = () => assert.fail("no request may be made with a bad consumerInstance");
  for (const [v, got] of [[{ id: 1 }, 'got Object {"id":1}'], ["7", 'got string "7"'], [-1, "got number -1"],
    [1.5, "got number 1.5"], [1n << 64n, "got bigint 18446744073709551616"], [undefined, "got undefined"], [null, "got null"]]) {
    await assert.rejects(Router.connect({ ...base, fetch, consumerInstance: v }), (e) => {
      assert.ok(e instanceof TypeError, `${e}`);
      assert.equal(e.message, `router: consumerInstance must be an unsigned 64-bit integer (a bigint, or a non-negative safe integer number), ${got}`);
      return true;
    });
    assert.throws(() => new Router({}, { ...base, consumerInstance: v }), /router: consumerInstance must be an unsigned 64-bit integer/);
  }
  // What is valid stays valid, up to 2^64-1.
  for (const v of [0, 1, Number.MAX_SAFE_INTEGER, 0n, (1n << 64n) - 1n]) {
    assert.equal(new Router({}, { ...base, consumerInstance: v }).consumerInstance, BigInt(v));
  }
});

test("a relay URL without a scheme is refused with what to write instead", async () => {
  const fetch = () => assert.fail("no request may be made with a bad relayUrl");
  for (const [url, want] of [["127.0.0.1:7878", 'write "http://127.0.0.1:7878"'], ["localhost:7878", 'write "http://localhost:7878"'],
    ["nats://127.0.0.1:4222", "is not an http(s) URL"], ["http://", "is not an http(s) URL"], [undefined, "relayUrl is required"]]) {
    await assert.rejects(Router.connect({ relayUrl: url, pools: ["p"], consumerInstance: 1, fetch }), (e) => {
      assert.ok(e instanceof TypeError, `${e}`);
      assert.ok(e.message.includes(want), `${url}: ${e.message}`);
      return true;
    });
  }
  assert.equal(new Router({}, { relayUrl: "http://127.0.0.1:7878//", pools: ["p"], consumerInstance: 1 }).relayUrl, "http://127.0.0.1:7878");
});
