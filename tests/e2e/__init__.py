"""End-to-end tests: the official RocketMQ clients against real Sluice processes (see conftest.py)."""
