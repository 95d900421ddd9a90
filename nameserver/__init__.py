"""Broker registry (which brokers exist) and topic routes (which broker holds which queues)."""
