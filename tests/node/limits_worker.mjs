// A stock BullMQ worker for the tenant-limit tests: runs `queue` under `prefix` with
// `concurrency` slots for `runMs`, each job taking `jobMs`; a job whose data's tenantId
// is in `failTenant` (comma-separated) throws (so BullMQ retries it while it has
// attempts left). Prints one line per attempt started:
// "start <job id> <tenantId> <attempts made> <started ms>",
// the start as BullMQ records it (processedOn: when moveToActive took it, this clock).
import { Worker } from "bullmq";
import IORedis from "ioredis";

const [url, prefix, queue, concurrency, runMs, jobMs, failTenant] = process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });

const worker = new Worker(
  queue,
  async (job) => {
    const tenant = (job.data && job.data.tenantId) || "";
    process.stdout.write(`start ${job.id} ${tenant} ${job.attemptsMade} ${job.processedOn}\n`);
    await new Promise((resolve) => setTimeout(resolve, Number(jobMs)));
    if (failTenant && failTenant.split(",").includes(tenant)) throw new Error("failing on purpose");
  },
  { connection, prefix, concurrency: Number(concurrency) },
);
worker.on("error", () => {});
setTimeout(async () => {
  await worker.close();
  await connection.quit();
  process.exit(0);
}, Number(runMs));
