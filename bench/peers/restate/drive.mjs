// Times R invocations of the `bench/run` handler (K steps each) through a
// Restate ingress, at most C in flight (a new one starts as one ends), after
// a warm-up of 5. Then the same R with 0 steps, which splits the cost of an
// invocation from that of a step. Prints one JSON line:
//
//   {"runs":R,"steps":K,"concurrency":C,"secs":…,"steps_per_s":…,
//    "wall_ms_per_step":…,            // secs / (R·K), in ms
//    "marginal_ms_per_step":…,        // (secs - secs_0_steps) / (R·K), in ms
//    "invocation_ms":{"p50":…,"p99":…},"secs_0_steps":…}
//
// Usage: node drive.mjs INGRESS_URL R K C. Exits 1, naming the invocation,
// if any answer is not 200 with K·(K-1).
const [ingress, r, k, c] = process.argv.slice(2);
const runs = Number(r);
const steps = Number(k);
const concurrency = Number(c);
for (const [name, v] of [["R", runs], ["K", steps], ["C", concurrency]]) {
  if (!Number.isInteger(v) || v < 1) {
    console.error(`${name} must be a positive integer, got ${JSON.stringify(v)}`);
    process.exit(2);
  }
}
const url = `${ingress.replace(/\/$/, "")}/bench/run`;

async function invoke(k) {
  const started = performance.now();
  const answer = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(k),
  });
  const text = await answer.text();
  if (answer.status !== 200 || Number(text) !== k * (k - 1)) {
    throw new Error(`POST ${url} with ${k} steps answered ${answer.status}: ${text.slice(0, 200)}`);
  }
  return performance.now() - started;
}

async function round(k) {
  const latencies = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(concurrency, runs) }, async () => {
      while (next < runs) {
        next += 1;
        latencies.push(await invoke(k));
      }
    }),
  );
  return { secs: (performance.now() - started) / 1000, latencies };
}

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

try {
  for (let i = 0; i < 5; i++) await invoke(steps);
  const full = await round(steps);
  const empty = await round(0);
  const sorted = full.latencies.sort((a, b) => a - b);
  const total = runs * steps;
  const round3 = (x) => Math.round(x * 1000) / 1000;
  console.log(
    JSON.stringify({
      runs,
      steps,
      concurrency,
      secs: round3(full.secs),
      steps_per_s: round3(total / full.secs),
      wall_ms_per_step: round3((1000 * full.secs) / total),
      marginal_ms_per_step: round3((1000 * (full.secs - empty.secs)) / total),
      invocation_ms: { p50: round3(percentile(sorted, 50)), p99: round3(percentile(sorted, 99)) },
      secs_0_steps: round3(empty.secs),
    }),
  );
} catch (e) {
  console.error(String(e?.message ?? e));
  process.exit(1);
}
