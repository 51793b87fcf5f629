// A stock BullMQ worker (concurrency 1): processes `count` jobs of `queue` under
// `prefix` and prints their ids, one per line, in the order it processed them.
import { Worker } from "bullmq";
import IORedis from "ioredis";

const [url, prefix, queue, count] = process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const expected = Number(count);
const seen = [];

const worker = new Worker(
  queue,
  async (job) => {
    seen.push(job.id);
    if (seen.length === expected) {
      setImmediate(async () => {
        await worker.close();
        await connection.quit();
        process.stdout.write(seen.join("\n") + "\n");
        process.exit(0);
      });
    }
  },
  { connection, prefix, concurrency: 1 },
);
setTimeout(() => {
  process.stderr.write(`timed out after ${seen.length} of ${expected} jobs\n`);
  process.exit(1);
}, 60_000);
