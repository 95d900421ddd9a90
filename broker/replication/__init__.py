"""Broker groups: CommitLog replication from a primary to replicas, coordinated on etcd.

See docs/replication.md. Nothing here is loaded unless a broker is started with a group and etcd.
"""
