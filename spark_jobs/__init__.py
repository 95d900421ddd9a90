"""PySpark data source over tiered segments, and the analytics jobs built on it."""
