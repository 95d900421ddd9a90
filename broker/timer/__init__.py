"""Timer (DELAY) messages: stored once, indexed by delivery time, moved into their topic when due."""
