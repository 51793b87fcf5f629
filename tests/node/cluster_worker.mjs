// A stock BullMQ worker (concurrency 1) on a Redis Cluster, through ioredis's Cluster
// client: processes `count` jobs of `queue` (named with its hash tag, e.g. "{email}",
// exactly as fairqueue's FAIRQUEUE['QUEUES'] names it) under `prefix` and prints their
// ids, one per line, in the order it processed them.
import { Cluster } from "ioredis";

import { recordOrder } from "./record_order.mjs";

const [nodes, prefix, queue, count] = process.argv.slice(2);
const connection = new Cluster(
  nodes.split(",").map((node) => {
    const [host, port] = node.split(":");
    return { host, port: Number(port) };
  }),
  { redisOptions: { maxRetriesPerRequest: null } },
);
recordOrder(connection, prefix, queue, count, { logErrors: true });
