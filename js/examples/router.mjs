// A small router: follow every pool of a relay and send each request to the
// data center holding the longest cached prefix of it.
//
//   go run ./cmd/relay serve --pool dc-a:dc=1 --pool dc-b:dc=2 &
//   node js/examples/router.mjs http://127.0.0.1:7878
import { Router, fetchCatalog, AbiError, Code } from "@ckfrelay/router";

const relayUrl = process.argv[2] ?? "http://127.0.0.1:7878";
const { pools } = await fetchCatalog(relayUrl);
// One router follows pools that agree on domain and format (same router_key).
const followed = pools.filter((p) => p.router_key === pools[0].router_key).slice(0, 16).map((p) => p.name);

const router = await Router.connect({ relayUrl, pools: followed, consumerInstance: 1 });
const running = router.run();
process.once("SIGINT", () => router.stop());

// route returns the pool to send a request (token ids) to.
function route(tokens, blockSize = 16) {
  try {
    const { depths, mask } = router.queryTokens(Uint32Array.from(tokens), blockSize);
    let best = 0;
    for (let l = 1; l < followed.length; l++) if (depths[l] > depths[best]) best = l;
    return { pool: followed[best], depth: depths[best], ready: mask };
  } catch (e) {
    if (e instanceof AbiError && e.code === Code.Unavailable) return { pool: followed[0], depth: 0, ready: 0 }; // nothing ready yet
    throw e;
  }
}

const timer = setInterval(() => {
  const lanes = followed.map((_, i) => router.lane(i));
  console.log(lanes.map((l) => `${l.pool}: ${l.ready ? "ready" : "waiting"} seq ${l.sequence} stale ${l.stalenessMs ?? "-"} ms`).join(" | "));
  console.log("route", route(Array.from({ length: 64 }, (_, i) => i)));
}, 1000);
await running;
clearInterval(timer);
