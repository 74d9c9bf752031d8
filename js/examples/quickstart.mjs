// The README's quick start: follow pool dc-a of a relay on 127.0.0.1:7878 and
// ask how many leading 16-token blocks of the tokens 1..32 it holds.
//
//	node js/examples/quickstart.mjs
import { Router } from "../src/index.js";

const router = await Router.connect({
  relayUrl: process.env.RELAY_URL ?? "http://127.0.0.1:7878",
  pools: ["dc-a"],
  consumerInstance: 2,
});
router.run();
for (let i = 0; i < 100 && !router.lane(0).ready; i++) {
  await new Promise((resolve) => setTimeout(resolve, 50));
}
const tokens = Array.from({ length: 32 }, (_, i) => i + 1);
const { depths } = router.queryTokens(tokens, 16); // block size 16, default salt 1337
console.log(`dc-a holds ${depths[0]} leading blocks`);
await router.stop();
