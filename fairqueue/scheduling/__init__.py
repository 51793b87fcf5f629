"""The scheduling math: plain data in, plain data out, no Django, no Redis.

``levels`` holds the level model (names, weights, numeric constants, validation);
``order`` the fair order (virtual finish tags between levels, round-robin between
tenants, the wait bound) that the add script and the pass apply.
"""
