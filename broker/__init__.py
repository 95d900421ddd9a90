"""The stateful storage node: CommitLog, RocksDB indexes, and every storage-side semantic."""
