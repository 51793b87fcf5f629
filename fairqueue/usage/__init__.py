"""Plans meet usage (docs/usage.md): the ledger of worker time (``ledger``), quotas
(``quotas``; ``quota_watch``, the tenants near their quota with their running attempts),
the breaker (``breaker``) and the holds they share with pauses (``holds``). Their rows are
in ``fairqueue.models``, their settings in ``fairqueue.conf``, their admin in
``fairqueue.admin``. This face imports nothing, so importing one module loads only what
it needs."""
