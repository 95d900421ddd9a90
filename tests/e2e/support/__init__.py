"""Helpers of the end-to-end tests; importable only where the official client is loaded (tests/e2e)."""
