"""The broker's durable store: CommitLog segments, group commit, dispatch into RocksDB indexes.

`MessageStore` (store.py) is the façade; see docs/storage-format.md for the byte and key layouts.
"""
