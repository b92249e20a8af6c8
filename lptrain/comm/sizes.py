"""Human sizes such as ``"4M"`` or ``"256K"`` (powers of 1024), for options and command lines,
and the message sizes a command steps through (``-b``, ``-e``, ``-f`` of ``lptrain-bench``
and ``lptrain-sim``)."""

from __future__ import annotations

from lptrain.comm.errors import CollectiveInputError

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def parse_size(value: int | str, what: str = "size") -> int:
    """Bytes from an int or a string like ``"64M"``; a clear error names ``what`` otherwise."""
    if isinstance(value, bool):
        raise CollectiveInputError(f"{what} must be a number of bytes such as 4194304 or '4M', got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().upper()
        number = text.rstrip("KMGIB")
        unit = text[len(number) :]
        if number and unit in _UNITS:
            try:
                return int(float(number) * _UNITS[unit])
            except ValueError:
                pass
    raise CollectiveInputError(f"{what} must be a number of bytes such as 4194304 or '4M', got {value!r}")


def format_size(nbytes: int) -> str:
    """``4194304`` -> ``"4M"``: the largest power-of-1024 unit that divides evenly."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B" if nbytes < 1024 else f"{nbytes / 1024:.1f}K"


def message_sizes(begin: int, end: int, factor: int) -> list[int]:
    """``begin``, ``begin * factor``, ... up to ``end`` bytes; a ValueError naming the option otherwise."""
    if begin < 1:
        raise ValueError(f"-b (min bytes) must be at least 1, got {begin}")
    if end < begin:
        raise ValueError(f"the size range is empty: -b {begin} is above -e {end}")
    if factor < 2:
        raise ValueError(f"-f (step factor) must be at least 2, got {factor}")
    sizes, s = [], begin
    while s <= end:
        sizes.append(s)
        s *= factor
    return sizes


def parse_size_range(begin: int | str, end: int | str, factor: int) -> tuple[int, int]:
    """``-b`` and ``-e`` as bytes, checked with ``-f`` as a range ``message_sizes`` can step through."""
    begin, end = parse_size(begin, "-b"), parse_size(end, "-e")
    message_sizes(begin, end, factor)
    return begin, end
