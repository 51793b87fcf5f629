"""Django's task framework on fairqueue: the backend (``backend.FairQueueBackend``, for
``django.tasks`` and the ``django-tasks`` backport) and the payload it writes (``jobs``).

Nothing is imported here, so ``import fairqueue.tasks`` does not require a task framework.
"""
