// A stock BullMQ worker for the usage ledger's tests: runs `queue` under `prefix` with
// `concurrency` slots for `runMs`, each job taking `jobMs`; a job whose data's tenantId
// is in `failTenant` (comma-separated) throws. Prints one line per attempt started,
// "start <job id> <tenantId>", and one when BullMQ confirmed its end (the worker's
// completed/failed event): "end <job id> <tenantId> <ok 1|0> <ms from taking the job
// (processedOn) to its end as BullMQ recorded it (finishedOn; an attempt retried has
// none: when its processor threw, the moment BullMQ's finishedOn stands for), this
// worker's clock> <ms the processor ran>".
import { Worker } from "bullmq";
import IORedis from "ioredis";

const [url, prefix, queue, concurrency, runMs, jobMs, failTenant] = process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const failing = (failTenant || "").split(",").filter(Boolean);
const ran = new Map();
const threwAt = new Map();

const worker = new Worker(
  queue,
  async (job) => {
    const tenant = (job.data && job.data.tenantId) || "";
    const started = performance.now();
    process.stdout.write(`start ${job.id} ${tenant}\n`);
    await new Promise((resolve) => setTimeout(resolve, Number(jobMs)));
    ran.set(job.id, performance.now() - started);
    if (failing.includes(tenant)) {
      threwAt.set(job.id, Date.now());
      throw new Error("failing on purpose");
    }
  },
  { connection, prefix, concurrency: Number(concurrency) },
);
const ended = (ok) => (job) => {
  const tenant = (job.data && job.data.tenantId) || "";
  const processor = ran.get(job.id) || 0;
  const end = job.finishedOn || threwAt.get(job.id) || Date.now();
  ran.delete(job.id);
  threwAt.delete(job.id);
  process.stdout.write(
    `end ${job.id} ${tenant} ${ok ? 1 : 0} ${end - job.processedOn} ${processor.toFixed(3)}\n`,
  );
};
worker.on("completed", ended(true));
worker.on("failed", ended(false));
worker.on("error", () => {});
setTimeout(async () => {
  await worker.close();
  await connection.quit();
  process.exit(0);
}, Number(runMs));
