"""fairqueue: weighted fair scheduling and plan-based priority for BullMQ queues."""

__version__ = "0.1.0"
