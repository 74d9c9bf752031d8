// Test helpers: the real relay binary, built once per test process from
// this repository, a TCP proxy that can cut connections, and event posting.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

export const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const wasmPath = join(repo, "wasm", "host", "ckfconsumer.wasm");

let bins;
/** binaries builds cmd/relay and internal/cmd/nativeconsumer into a temp dir (once). */
export function binaries() {
  if (bins) return bins;
  const dir = mkdtempSync(join(tmpdir(), "ckfrelay-js-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const go = process.env.GO ?? "go";
  for (const [name, pkg] of [["relay", "./cmd/relay"], ["nativeconsumer", "./internal/cmd/nativeconsumer"]]) {
    execFileSync(go, ["build", "-o", join(dir, name), pkg], { cwd: repo, stdio: ["ignore", "inherit", "inherit"] });
  }
  bins = { dir, relay: join(dir, "relay"), nativeconsumer: join(dir, "nativeconsumer") };
  return bins;
}

/**
 * startRelay runs `relay serve` with args and resolves once it listens.
 * config, when given, is written to a file passed as --config.
 */
export async function startRelay(args, { config, listen = "127.0.0.1:0" } = {}) {
  const b = binaries();
  const argv = ["serve", "--listen", listen, "--log-level", "warn", ...args];
  if (config) {
    const p = join(b.dir, `config-${process.pid}-${Math.random().toString(36).slice(2)}.json`);
    writeFileSync(p, JSON.stringify(config));
    argv.push("--config", p);
  }
  const proc = spawn(b.relay, argv, { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  proc.stderr.on("data", (d) => { stderr += d; });
  const exited = new Promise((res) => proc.on("exit", (code, sig) => res({ code, sig })));
  const lines = createInterface({ input: proc.stdout });
  const first = await new Promise((res, rej) => {
    lines.once("line", res);
    proc.once("exit", () => rej(new Error(`relay exited before listening: ${stderr}`)));
  });
  const addr = first.replace(/^listening on /, "");
  return {
    addr, base: `http://${addr}`, proc, exited,
    stderr: () => stderr,
    async stop(signal = "SIGTERM") {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}

/** startProxy forwards TCP to target; cut() resets every open connection. */
export async function startProxy(target) {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const open = new Set();
  const server = createServer((c) => {
    const u = connect(port, host);
    const pair = [c, u];
    open.add(pair);
    c.pipe(u);
    u.pipe(c);
    const drop = () => { c.destroy(); u.destroy(); open.delete(pair); };
    c.on("error", drop); u.on("error", drop); c.on("close", drop); u.on("close", drop);
  });
  await new Promise((res) => server.listen(0, "127.0.0.1", res));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    cut() {
      const n = open.size;
      for (const [c, u] of open) { c.resetAndDestroy(); u.destroy(); }
      open.clear();
      return n;
    },
    close() { this.cut(); return new Promise((res) => server.close(res)); },
  };
}

let eventId = 0;
/**
 * postStored posts n Stored events (with the relay's write barrier,
 * ?sync=published: each answer comes once its events are on the stream) of `blocks` blocks each (no parent) and
 * returns each event's tokens_hash values: the blocks' local hashes, whose
 * chain is the canonical sequence (a query by local hashes finds them).
 */
export async function postStored(base, pool, n, blocks) {
  const out = [];
  for (let done = 0; done < n;) {
    const k = Math.min(256, n - done);
    const evs = [];
    for (let i = 0; i < k; i++) {
      const id = ++eventId;
      const hashes = [];
      const bl = [];
      for (let j = 0; j < blocks; j++) {
        const th = BigInt(id) * 1000003n + BigInt(j) + (BigInt(process.pid) << 40n);
        hashes.push(th);
        bl.push(`{"block_hash": ${(BigInt(id) << 8n) | BigInt(j)}, "tokens_hash": ${th}}`);
      }
      out.push(hashes);
      evs.push(`{"worker_id": ${id % 4}, "event": {"event_id": ${id}, "dp_rank": 0, "data": {"stored": {"parent_hash": null, "blocks": [${bl.join(",")}]}}}}`);
    }
    // sync=published: answered once the events are on the pool's stream,
    // so a hub sequence read afterwards covers them (converge relies on it).
    const resp = await fetch(`${base}/v1/pools/${pool}/events?source_epoch=1&sync=published`, {
      method: "POST", headers: { "content-type": "application/json" }, body: `[${evs.join(",")}]`,
    });
    if (resp.status !== 202) throw new Error(`post events: ${resp.status} ${await resp.text()}`);
    done += k;
  }
  return out;
}

/** hubSequence reads a pool's hub sequence from the catalog. */
export async function hubSequence(base, pool) {
  const c = await (await fetch(`${base}/v1/pools`)).json();
  return BigInt(c.pools.find((p) => p.name === pool).hub.sequence);
}

/**
 * converge waits until lane's sequence reached the pool's hub sequence
 * (bounded). The hub sequence is read once: postStored's barrier made it
 * cover every event posted before, so reaching it means holding them.
 */
export async function converge(router, base, pool, lane, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  const want = await hubSequence(base, pool);
  for (;;) {
    const li = router.lane(lane);
    if (want > 0n && li.ready && li.sequence >= want) return li.sequence;
    if (Date.now() > deadline) throw new Error(`lane ${lane} stuck at ${li.sequence} (ready ${li.ready}), relay at ${want}: ${li.lastError}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** native runs a conformance-shaped scenario on the Go consumer and returns its results. */
export function native(scenario) {
  const out = execFileSync(binaries().nativeconsumer, { input: JSON.stringify(scenario) });
  return JSON.parse(out.toString());
}
