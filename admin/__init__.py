"""`sluice admin`: the pieces behind sluice/commands/admin.py.

- `parse`: the command line's small languages (message types, retry policies, consume-from, the
  spread of a topic's queues over brokers) → `broker.client.api` values; bad text is a ConfigError.
- `cluster`: `Cluster`, the NameServer client plus one `RemoteBroker` per broker, and the waits
  that make an admin command return only once the NameServer routes show its effect.
- `topics`, `groups`, `messages`: one async function per subcommand, returning a `Report`.
- `output`: a `Report` as an aligned table or as JSON.
"""
