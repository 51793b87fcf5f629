// The consumer of benchmarks/bench_fairness.py: one stock Node BullMQ Worker (bullmq 6.7 from
// tests/node/node_modules, no fairqueue code), `concurrency` jobs at a time, each job
// "running" `runMs` ms (or the job's own data.runMs), and failing its first
// data.failTimes attempts (benchmarks/bench_attempts.py). Prints "ready" once connected, then
// one JSON line per finished attempt: {"id", "l": data.priorityLevel, "t": data.tenantId,
// "ts": job.timestamp, "p": processedOn, "f": finishedOn, "a": attempts made before it,
// "ok": completed (true) or failed (false)}.
// SIGTERM/SIGINT: stop taking jobs, let the active ones finish, flush, exit 0.
//
//   node benchmarks/live_worker.mjs REDIS_URL PREFIX QUEUE CONCURRENCY RUN_MS
import { createRequire } from "node:module";

const require = createRequire(new URL("../tests/node/package.json", import.meta.url));
const { Worker } = require("bullmq");
const IORedis = require("ioredis");

const [url, prefix, queue, concurrency, runMs] = process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
let lines = [];

function flush(callback) {
  const chunk = lines.join("");
  lines = [];
  if (chunk) process.stdout.write(chunk, callback);
  else if (callback) callback();
}

const started = new Map();
const worker = new Worker(
  queue,
  async (job) => {
    started.set(job.id, Date.now());
    const data = job.data || {};
    await new Promise((resolve) => setTimeout(resolve, Number(data.runMs ?? runMs)));
    if ((job.attemptsMade ?? 0) < Number(data.failTimes ?? 0)) {
      throw new Error("integration down");
    }
    return null;
  },
  { connection, prefix, concurrency: Number(concurrency), autorun: false },
);

function record(job, ok) {
  if (!job) return;
  const data = job.data || {};
  const startedAt = started.get(job.id);
  started.delete(job.id);
  lines.push(
    JSON.stringify({
      id: job.id,
      l: data.priorityLevel ?? null,
      t: data.tenantId ?? null,
      ts: job.timestamp,
      p: job.processedOn ?? startedAt ?? null,
      f: job.finishedOn ?? Date.now(),
      a: (job.attemptsMade ?? 1) - 1,
      ok,
    }) + "\n",
  );
}

worker.on("completed", (job) => record(job, true));
worker.on("failed", (job) => record(job, false));
worker.on("error", (err) => process.stderr.write(`worker error: ${err}\n`));

const ticker = setInterval(() => flush(), 100);
let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  await worker.close();
  clearInterval(ticker);
  await connection.quit().catch(() => {});
  flush(() => process.exit(0));
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);

await worker.waitUntilReady();
worker.run().catch((err) => process.stderr.write(`worker stopped: ${err}\n`));
process.stdout.write("ready\n");
