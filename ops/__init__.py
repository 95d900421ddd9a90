"""The operations HTTP endpoint of every process (endpoint.py) and the merged one of a parent and
its children (merge.py): health, readiness, metrics, log level."""
