// Type-checked, never run (test/types.test.mjs runs `tsc --noEmit -p` with
// tsconfig.node.json and tsconfig.dom.json): it uses every export of
// @ckfrelay/router, so a declaration that needs a lib the program lacks, or
// that drifts from the runtime exports' names, fails the test.
import {
  Router, SessionError, Consumer, AbiError, compileModule, Outcome, FaultNames, Code, QueryKind, BASE_SALT, MAX_INPUT_BYTES, encodeTokenQuery,
  decodeFrame, readFrames, FrameError, Kind, DEFAULT_MAX_FRAME_BYTES,
  fetchCatalog, manifestFromCatalog, encodeManifest, encodeAssignment, decodeMsgpack, MsgpackError,
} from "@ckfrelay/router";
import type {
  LaneInfo, QueryResult, RawQueryResult, ApplyResult, LaneStatus, Stats, ModuleSource, WasmModule, Hashes, Tokens,
  Target, TraceEvent, RouterOptions, Digest, Identity, Lease, Frame, Manifest, TokenQueryOptions,
} from "@ckfrelay/router";

export async function everything(): Promise<void> {
  const trace = (ev: TraceEvent): void => { void ev.op; void ev.lane; void ev.bytes; void ev.result; };
  const opts: RouterOptions = {
    relayUrl: "http://127.0.0.1:7878", pools: ["dc-a", { pool: "dc-b", lane: 1 } satisfies Target],
    consumerInstance: 1n, authToken: "t", minBackoffMs: 10, maxBackoffMs: 100, healthySessionMs: 1000,
    idleTimeoutMs: 10000, snapshotProgressTimeoutMs: 60000, maxFrameBytes: DEFAULT_MAX_FRAME_BYTES, verificationWindow: 2, fetch: globalThis.fetch,
    logger: { info: (m: string) => void m, warn: (m: string) => void m }, trace,
  };
  const router: Router = await Router.connect(opts);
  const running: Promise<void> = router.run({ signal: AbortSignal.timeout(1000) });
  await router.ready();
  await router.ready({ signal: AbortSignal.timeout(1000) });
  const li: LaneInfo | null = router.lane(0);
  const staleness: number | null | undefined = li?.stalenessMs;
  void staleness;
  const hashes: Hashes = new BigUint64Array([1n, 2n]);
  const tokens: Tokens = Uint32Array.from([1, 2, 3]);
  const q: QueryResult[] = [
    router.querySequenceHashes(hashes), router.queryLocalHashes([1n, 2]), router.queryTokens(tokens, 16, BASE_SALT),
    router.queryTokens([1, 2], 16),
    router.queryTokensWith([1, 2], 2, BASE_SALT, { mm: [[7n], []], eagle: false } satisfies TokenQueryOptions),
  ];
  const depth: number = q[0].depths[0] + q[1].mask + q[2].blocks + q[3].probes;
  void depth;
  const mask: number = router.contains(1n);
  void mask;
  const lw: { words: BigUint64Array; sequence: bigint } = router.laneWords(0);
  void lw;
  const manifest: Uint8Array | null = router.manifest;
  void manifest;
  await router.stop();
  await running;

  const src: ModuleSource = new URL("file:///ckfconsumer.wasm");
  const mod: WasmModule = await compileModule(src);
  const c: Consumer = await Consumer.instantiate(mod);
  await Consumer.instantiate();
  await Consumer.instantiate(new Uint8Array(0));
  await Consumer.instantiate("ckfconsumer.wasm");
  const r2 = new Router(c, opts);
  void r2.consumer;

  const cat = await fetchCatalog("http://127.0.0.1:7878", { authToken: "t", fetch: globalThis.fetch, signal: AbortSignal.timeout(10) });
  const m: Manifest = manifestFromCatalog(cat, [{ pool: "dc-a", lane: 0 }], { consumerInstance: 1, verificationWindow: 2 });
  c.configure(encodeManifest(m));
  const lease: Lease = { consumerInstance: 1n, physicalLane: 0, assignmentEpoch: 1n };
  const body = new Uint8Array(0);
  const f: Frame = decodeFrame(body);
  if (f.kind === Kind.SnapshotChunk) {
    const id: Identity = f.identity;
    const d: Digest = id.pool.cacheSemantics;
    void d;
    c.assign(encodeAssignment(f.identityBytes, lease));
  } else if (f.kind === Kind.Close) {
    const reason: string = f.reason;
    void reason;
  }
  const ar: ApplyResult = c.apply(body);
  const outcome: boolean = ar.outcome === Outcome.Applied || ar.outcome === Outcome.SnapshotInstalled;
  void outcome;
  const fault: string | undefined = FaultNames[ar.fault];
  void fault;
  const raw: RawQueryResult = c.queryRaw(QueryKind.Tokens, tokens, 16, 1337n);
  void raw.code;
  void c.querySequenceHashes(hashes), c.queryLocalHashes(hashes), c.queryTokens(tokens, 16), c.contains(3);
  void c.queryTokensWith(tokens, 16, BASE_SALT, { eagle: true });
  const encoded: Uint8Array = encodeTokenQuery([1, 2, 3], { mm: [[1n]] });
  void encoded;
  const ls: LaneStatus = c.laneStatus(0);
  const st: Stats = c.stats();
  void ls.installedSequence, st.readyMask, c.laneWords(0), c.salt("lora", "ns"), c.lastError(), c.liveBuffers();
  c.retire(0);
  for await (const fb of readFrames([body], DEFAULT_MAX_FRAME_BYTES)) void fb;
  const v: unknown = decodeMsgpack(body, 8);
  void v;

  for (const e of [new Error("x")] as unknown[]) {
    if (e instanceof AbiError) { const n: number = e.code; const s: string = e.codeName + e.op; void n, s; }
    if (e instanceof AbiError && e.code === Code.Unavailable) continue;
    if (e instanceof FrameError) { const code: FrameError["code"] = e.code; void code, e.offset, e.field; }
    if (e instanceof MsgpackError) { void e.code, e.offset; }
    if (e instanceof SessionError) { const why: "deactivated" | "closed" | "idle" | "protocol" | "lease_lost" | "snapshot_timeout" = e.reason; void why; }
  }
}
