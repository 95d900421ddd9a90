"""The `sluice` command: composes components into processes and topologies (docs/architecture.md)."""
