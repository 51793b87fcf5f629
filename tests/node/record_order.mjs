// What tests/node/worker.mjs and cluster_worker.mjs share: a stock BullMQ worker
// (concurrency 1) that processes `count` jobs of `queue` under `prefix` through
// `connection`, then prints their ids, one per line, in the order it processed them and
// exits; it fails after 60 s without them all. `logErrors` writes the worker's error
// events to stderr.
import { Worker } from "bullmq";

export function recordOrder(connection, prefix, queue, count, { logErrors = false } = {}) {
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
  if (logErrors) {
    worker.on("error", (err) => process.stderr.write(`worker error: ${err.message}\n`));
  }
  setTimeout(() => {
    process.stderr.write(`timed out after ${seen.length} of ${expected} jobs\n`);
    process.exit(1);
  }, 60_000);
}
