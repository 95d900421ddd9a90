"""The operator's console: `sluice console` and `sluice up --console-port` (docs/console.md)."""
