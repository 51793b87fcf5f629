"""The admin dashboard: what it reads (``stats``), the history it charts (``history``,
``charts``) and its views (``views``)."""
