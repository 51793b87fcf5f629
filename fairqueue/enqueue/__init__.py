"""The producer side: resolving a job's level (``priority``), adding it (``api``) and
the transactional outbox with its relay (``outbox``)."""
