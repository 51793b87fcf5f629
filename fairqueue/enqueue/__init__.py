"""The producer side: the entry points (``api``), what a call may ask for (``options``),
resolving a call and preparing its jobs (``calls``, with a job's level from
``priority``), the audit trail (``audit``), the durable path (``durable``) and the
transactional outbox (``outbox``) with the loop ``fairqueue_relay`` runs (``relay``)."""
