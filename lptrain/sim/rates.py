"""Link rates as people write them: ``tc``'s notation (``200mbit``, ``1gbit``) and fractions.

``lptrain-sim predict --link 200mbit --uplink 1/2`` and a declared topology
(``racks:2@0.5``) say an uplink either as a rate or as a fraction of a port, because that
ratio, not the rate, is what decides between a ring and a chain; the port's own rate only
sets the time of one byte. Plain numbers, no torch.
"""

from __future__ import annotations

import re

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*$", re.IGNORECASE)
_FRACTION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(?:/\s*([0-9]*\.?[0-9]+))?\s*$")


def parse_rate(text: str, what: str) -> float:
    """Bytes per second from ``tc``'s notation (``200mbit``, ``1gbit``, ``500kbit``)."""
    match = _RATE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"{what} must be a rate such as 200mbit, 1gbit or 500kbit (units: {', '.join(_RATE_UNITS)}), got {text!r}"
        )
    return float(match.group(1)) * _RATE_UNITS[unit] / 8


def parse_fraction(text: str, what: str) -> float:
    """A positive number written ``0.5`` or ``1/2``."""
    match = _FRACTION.match(str(text))
    value = None
    if match:
        top, bottom = float(match.group(1)), float(match.group(2) or 1)
        value = top / bottom if bottom > 0 else None
    if not value or value <= 0:
        raise ValueError(f"{what} must be a positive fraction of a port such as 0.5 or 1/2, got {text!r}")
    return value


def uplink_rate(text: str, port_bytes_per_s: float, what: str = "--uplink") -> float:
    """Bytes per second of an uplink given as a rate (``100mbit``) or as a fraction of
    a port of ``port_bytes_per_s`` (``0.5``, ``1/2``)."""
    for parse in (parse_rate, parse_fraction):
        try:
            value = parse(text, what)
        except ValueError:
            continue
        return value if parse is parse_rate else value * port_bytes_per_s
    raise ValueError(
        f"{what} must be a rate such as 100mbit or a positive fraction of a port such as 1/2, got {text!r}"
    )


def format_rate(bytes_per_s: float) -> str:
    """``24.9 MB/s`` or ``1.20 GB/s``."""
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"
