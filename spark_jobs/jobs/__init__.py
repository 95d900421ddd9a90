"""The analytics jobs over the archive: topic-stats, trace, export (each a function of a session and options)."""
