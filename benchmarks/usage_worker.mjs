// The consumer of benchmarks/bench_usage.py's live scenarios: one stock Node BullMQ Worker
// (bullmq 6.7 from tests/node/node_modules, no fairqueue code) that counts its own attempts.
// Each job "runs" data.runMs ms (else RUN_MS), fails its first data.failTimes attempts,
// and fails every attempt while data.fail is set unless the file FIXED exists (the
// tenant "fixed its integration"). The lock is held LOCK_MS (BullMQ's lockDuration: how
// long a job of a killed worker stays active before the stalled check puts it back).
//
// Lines go to OUT_FILE with synchronous writes, so a worker killed -9 keeps every line it
// wrote (a pipe or a buffered stream would lose the last ones):
//   "s <job id> <tenant> <attempts made before> <ms, this worker's clock> <level>"  as the
//       processor starts an attempt (the worker's own count of attempts);
//   "e <job id> <tenant> <ok 1|0> <processedOn> <finishedOn, or the event's time for an
//       attempt retried> <ms the processor ran> <level>"  when BullMQ confirmed its end.
// Prints "ready" once connected. SIGTERM: stop taking jobs, let the active ones finish.
//
//   node benchmarks/usage_worker.mjs REDIS_URL PREFIX QUEUE CONCURRENCY RUN_MS OUT_FILE
//       LOCK_MS FIXED
import { createRequire } from "node:module";
import fs from "node:fs";

// FQBENCH_NODE_DIR: another folder holding the same package.json and its node_modules.
const require = createRequire(
  process.env.FQBENCH_NODE_DIR
    ? `${process.env.FQBENCH_NODE_DIR}/package.json`
    : new URL("../tests/node/package.json", import.meta.url),
);
const { Worker } = require("bullmq");
const IORedis = require("ioredis");

const [url, prefix, queue, concurrency, runMs, outFile, lockMs, fixedFile] =
  process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const out = fs.openSync(outFile, "a");
const ran = new Map();

function line(text) {
  fs.writeSync(out, text + "\n");
}

const worker = new Worker(
  queue,
  async (job) => {
    const data = job.data || {};
    const tenant = data.tenantId || "";
    const started = performance.now();
    const level = data.priorityLevel || "";
    line(`s ${job.id} ${tenant} ${job.attemptsMade ?? 0} ${Date.now()} ${level}`);
    await new Promise((resolve) => setTimeout(resolve, Number(data.runMs ?? runMs)));
    ran.set(job.id, performance.now() - started);
    if ((job.attemptsMade ?? 0) < Number(data.failTimes ?? 0)) {
      throw new Error("integration down");
    }
    if (data.fail && !fs.existsSync(fixedFile)) throw new Error("integration down");
    return null;
  },
  {
    connection,
    prefix,
    concurrency: Number(concurrency),
    lockDuration: Number(lockMs),
    autorun: false,
  },
);

const ended = (ok) => (job) => {
  if (!job) return;
  const tenant = (job.data && job.data.tenantId) || "";
  const level = (job.data && job.data.priorityLevel) || "";
  const processor = ran.get(job.id) ?? 0;
  ran.delete(job.id);
  const finished = job.finishedOn || Date.now();
  line(`e ${job.id} ${tenant} ${ok ? 1 : 0} ${job.processedOn} ${finished} ${processor.toFixed(3)} ${level}`);
};
worker.on("completed", ended(true));
worker.on("failed", ended(false));
worker.on("error", (err) => process.stderr.write(`worker error: ${err}\n`));

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  await worker.close();
  await connection.quit().catch(() => {});
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);

await worker.waitUntilReady();
worker.run().catch((err) => process.stderr.write(`worker stopped: ${err}\n`));
process.stdout.write("ready\n");
