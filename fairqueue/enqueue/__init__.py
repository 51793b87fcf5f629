"""The producer side: resolving a job's level (``priority``), adding it (``api``) and
the transactional outbox (``outbox``) with the loop ``fairqueue_relay`` runs (``relay``)."""
