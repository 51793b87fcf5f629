"""fairqueue: weighted fair scheduling and plan-based priority for BullMQ queues."""

from .handlers import JobContext, handler

__version__ = "0.1.0"

__all__ = ["JobContext", "handler"]
