"""Tests against a real Redis through the real bullmq package, each under its own key prefix."""
