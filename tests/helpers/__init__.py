"""Shared test helpers (child processes, ports). Imported by tests; never collected as tests."""
