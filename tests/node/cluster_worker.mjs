// A stock BullMQ worker (concurrency 1) on a Redis Cluster, through ioredis's Cluster
// client: processes `count` jobs of `queue` (named with its hash tag, e.g. "{email}",
// exactly as fairqueue's FAIRQUEUE['QUEUES'] names it) under `prefix` and prints their
// ids, one per line, in the order it processed them.
import { Worker } from "bullmq";
import { Cluster } from "ioredis";

const [nodes, prefix, queue, count] = process.argv.slice(2);
const connection = new Cluster(
  nodes.split(",").map((node) => {
    const [host, port] = node.split(":");
    return { host, port: Number(port) };
  }),
  { redisOptions: { maxRetriesPerRequest: null } },
);
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
worker.on("error", (err) => process.stderr.write(`worker error: ${err.message}\n`));
setTimeout(() => {
  process.stderr.write(`timed out after ${seen.length} of ${expected} jobs\n`);
  process.exit(1);
}, 60_000);
