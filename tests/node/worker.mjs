// A stock BullMQ worker (concurrency 1): processes `count` jobs of `queue` under
// `prefix` and prints their ids, one per line, in the order it processed them.
import IORedis from "ioredis";

import { recordOrder } from "./record_order.mjs";

const [url, prefix, queue, count] = process.argv.slice(2);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
recordOrder(connection, prefix, queue, count);
