"""The admin dashboard: what it reads (``stats``), the history charts (``charts``, over
:mod:`fairqueue.scheduling.shares`) and its views (``views``)."""
