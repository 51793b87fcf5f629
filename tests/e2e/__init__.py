"""End to end: a browser, Node workers, a Redis Cluster, Sentinel, fault injection, the
demo, the wheel in a fresh project."""
