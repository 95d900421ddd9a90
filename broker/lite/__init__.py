"""Lite topics: millions of light, ordered sub-channels inside a LITE bind topic (docs/lite-topics.md)."""
