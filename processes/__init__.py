"""Running Sluice processes: one component per process (runtime.py), and the pools a parent
supervises: shards of `sluice up` (shardpool.py) and proxy workers (workerpool.py)."""
