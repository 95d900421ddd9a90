"""Small shared kernel: protocol codes, the error hierarchy, configuration and logging helpers.

Imports nothing outside the standard library, so every component (including a proxy process
that must not load the storage engine) can depend on it.
"""
