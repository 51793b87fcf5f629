"""fairqueue's admin, the module Django's autodiscovery imports: importing its two halves
registers them. ``plan_admin``: tenant plans, the subscription classifier, the audit
logs, the outbox and the console; ``usage_admin``: the usage ledger, quotas and the
breaker (docs/usage.md)."""

from fairqueue.admin import plan_admin, usage_admin  # noqa: F401
