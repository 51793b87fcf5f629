from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "project"
    verbose_name = "Demo project"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from fairqueue.enqueue.priority import wire_tenant_plan_lookup

        from . import signals  # noqa: F401

        # Tenants' plans (TenantPlan rows, through the cache) decide their jobs' level in
        # every process of the project: web, shell, workers, the demo's load generator.
        wire_tenant_plan_lookup()
