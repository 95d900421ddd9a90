"""Tells clients which proxy endpoints to use, per namespace, zone and network."""
