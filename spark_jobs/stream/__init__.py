"""Spark Structured Streaming from Sluice's brokers (`spark.readStream.format("sluice")`; docs/spark.md)."""
