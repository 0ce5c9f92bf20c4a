// make bench's peer: graphile-worker (the Node.js job queue on PostgreSQL with LISTEN/NOTIFY)
// tuned as its own documentation tunes it for throughput, measured the way
// `bench/src/measures.rs` measures the engine, on the bench's own cluster, and printed as
// `name: value` lines for the harness to read. PEER_CONFIG picks the settings:
//
// - `pool`: its default worker with a concurrency equal to its pool (10 jobs at once on its
//   default pool of 10 connections), as its users run it for throughput;
// - `batched`: the settings of its performance page (worker.graphile.org/docs/performance):
//   24 jobs at once on a pool of 25, a local queue of 500 jobs fetched in batches, and job
//   completions and failures batched (`completeJobBatchDelay` and `failJobBatchDelay` 0).
//
// - peer_chains_per_s: PEER_CHAINS chains of three jobs (a enqueues b, b enqueues c), all first
//   jobs added before the worker starts; chains per second from the first job's start to the
//   last job's end, as the engine's runs per second are taken from the first step's start to
//   the last run's end.
// - peer_wake_p50_ms / peer_wake_p99_ms: PEER_WAKES jobs added one at a time 10 ms apart to the
//   idle worker; from the database clock as the adding transaction's last statement runs
//   (`clock_timestamp()` just before its COMMIT, as the engine's wake is measured) to the
//   handler's start.
//
// Environment: PEER_DATABASE_URL (an empty database), PEER_CONFIG (`pool` or `batched`),
// PEER_CHAINS (2000), PEER_WAKES (200).

import { Logger, run, runMigrations } from "graphile-worker";
import pg from "pg";

const url = process.env.PEER_DATABASE_URL;
if (!url) {
  console.error("peer: PEER_DATABASE_URL is not set");
  process.exit(2);
}
const configs = {
  pool: { label: "default worker, concurrency 10 on its pool of 10", options: { concurrency: 10, maxPoolSize: 10 } },
  batched: {
    label: "its performance page's settings: concurrency 24, pool 25, local queue 500, batched completion",
    options: {
      concurrency: 24,
      maxPoolSize: 25,
      preset: { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    },
  },
};
const config = configs[process.env.PEER_CONFIG ?? "pool"];
if (!config) {
  console.error(`peer: PEER_CONFIG must be one of ${Object.keys(configs).join(", ")}`);
  process.exit(2);
}
const chains = Number(process.env.PEER_CHAINS ?? 2000);
const wakes = Number(process.env.PEER_WAKES ?? 200);
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`peer: ${message}`);
});

let firstStart = null;
let ended = 0;
let chainsDone;
const allChains = new Promise((resolve) => (chainsDone = resolve));
const woken = new Map();
const wakeSent = new Map();
let wakeDone;
let wakeWanted = 0;

const taskList = {
  a: async (payload, helpers) => {
    firstStart ??= performance.timeOrigin + performance.now();
    await helpers.addJob("b", payload);
  },
  b: async (payload, helpers) => {
    await helpers.addJob("c", payload);
  },
  c: async () => {
    ended += 1;
    if (ended === chains) chainsDone(performance.timeOrigin + performance.now());
  },
  wake: async (payload) => {
    woken.set(payload.i, performance.timeOrigin + performance.now());
    if (woken.size === wakeWanted) wakeDone();
  },
};

const client = new pg.Client({ connectionString: url });
await client.connect();
// The worker's schema (its own migration), then every chain's first job, before it starts.
await runMigrations({ connectionString: url, logger });
await client.query("SELECT graphile_worker.add_job('a', json_build_object('n', n)) FROM generate_series(1, $1::int) n", [chains]);

const runner = await run({ connectionString: url, taskList, noHandleSignals: true, logger, ...config.options });
const last = await allChains;
const chainsPerS = chains / ((last - firstStart) / 1000);

// The idle worker: one job at a time.
const settle = (ms) => new Promise((r) => setTimeout(r, ms));
await settle(1000);
wakeWanted = wakes;
const allWoken = new Promise((resolve) => (wakeDone = resolve));
for (let i = 0; i < wakes; i++) {
  await client.query("BEGIN");
  await client.query("SELECT graphile_worker.add_job('wake', json_build_object('i', $1::int))", [i]);
  const { rows } = await client.query("SELECT extract(epoch FROM clock_timestamp()) * 1000 AS t");
  await client.query("COMMIT");
  wakeSent.set(i, Number(rows[0].t));
  await settle(10);
}
await allWoken;
const latencies = [...wakeSent].map(([i, t]) => woken.get(i) - t).sort((x, y) => x - y);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * p))];
await runner.stop();
await client.end();

const version = JSON.parse(await (await import("node:fs/promises")).readFile(new URL("./node_modules/graphile-worker/package.json", import.meta.url))).version;
console.log(`peer_version: graphile-worker ${version}, ${config.label}`);
console.log(`peer_chains_per_s: ${chainsPerS.toFixed(0)}`);
console.log(`peer_wake_p50_ms: ${pct(0.5).toFixed(2)}`);
console.log(`peer_wake_p99_ms: ${pct(0.99).toFixed(2)}`);
