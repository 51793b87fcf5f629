"""Running jobs: the ``@handler`` registry (``handlers``) and the worker loop
(``runner``) that ``manage.py fairqueue_worker`` starts."""
