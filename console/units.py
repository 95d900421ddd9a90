"""Figures as an operator reads them: bytes in binary units, durations in the two largest units."""

from __future__ import annotations

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_STEP = 1024
_DURATION_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


def human_bytes(count: int | None) -> str:
    """1536 -> "1.5 KiB"; None (not known) -> ""."""
    if count is None:
        return ""
    value = float(count)
    for unit in _BYTE_UNITS:
        if abs(value) < _STEP or unit == _BYTE_UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= _STEP
    raise AssertionError("unreachable: the last unit returns")


def human_duration(seconds: float | None) -> str:
    """93784 -> "1d 2h"; 75 -> "1m 15s"; None (not known) -> ""."""
    if seconds is None:
        return ""
    left = max(0, int(seconds))
    parts: list[str] = []
    for unit, size in _DURATION_UNITS:
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
        if len(parts) == 2:
            break
    return " ".join(parts)
