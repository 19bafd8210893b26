// The Restate side of `belay-bench --peer restate`: a TypeScript-SDK service
// `bench` whose handler `run` takes a number of steps K and makes K durable
// steps (`ctx.run`, each journaled by the Restate server before the next
// starts), returning the sum of their results (K * (K - 1)).
//
// Listens with HTTP/2 (cleartext) on 127.0.0.1:$PORT and prints
// `listening on http://127.0.0.1:PORT` once it does.
import "./polyfill.mjs"; // before the SDK
import http2 from "node:http2";
import * as restate from "@restatedev/restate-sdk";

const bench = restate.service({
  name: "bench",
  handlers: {
    run: async (ctx, steps) => {
      let total = 0;
      for (let i = 0; i < steps; i++) {
        total += await ctx.run(`step-${i}`, async () => i * 2);
      }
      return total;
    },
  },
});

const port = Number(process.env.PORT);
if (!Number.isInteger(port) || port <= 0) {
  console.error(`PORT must be a TCP port, got ${JSON.stringify(process.env.PORT)}`);
  process.exit(2);
}
const server = http2.createServer(restate.createEndpointHandler({ services: [bench] }));
server.listen(port, "127.0.0.1", () => console.log(`listening on http://127.0.0.1:${port}`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
