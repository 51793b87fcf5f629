"""Tests that need no Redis: the pure scheduling math, settings, checks, models and the
docs (`make test-fast`)."""
