"""The scheduling math: plain data in, plain data out, no Django, no Redis.

``levels`` holds the level model (names, weights, numeric constants, validation);
``order`` the fair order (virtual finish tags between levels, round-robin between
tenants, the wait bound) that the add script and the pass apply; ``limits`` tenant limits
and the release decision; ``attempts`` what a page of BullMQ's events stream records;
``shares`` what the dashboard's history shows (served against entitled shares, waits).
"""
