"""Human-friendly sizes in recipes: byte budgets (``2GiB``) and counts (``25M``)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}
MAX_BYTES = 2**60  # 1 EiB
MAX_COUNT = 2**48  # rows or capacity of one table
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def _parse(value: Any, units: dict[str, int], what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        raise ValueError(f"{value!r} is not a whole {what}; give a whole number")
    if isinstance(value, str):
        match = _NUMBER.match(value)
        if match and match.group(2).lower() in units:
            exact = Fraction(match.group(1)) * units[match.group(2).lower()]
            if exact.denominator != 1:
                raise ValueError(f"{value!r} is {float(exact):g}, not a whole {what}; "
                                 "give a whole number")
            return int(exact)
        names = ", ".join(u for u in units if u)
        raise ValueError(f"cannot read {value!r} as a {what} (a number with an optional unit: {names})")
    raise ValueError(f"expected a {what}, got {type(value).__name__}")


def parse_bytes(value: Any) -> int:
    """``"2GiB"`` → 2147483648; plain integers are bytes."""
    return _parse(value, _BYTE_UNITS, "byte size")


def parse_count(value: Any) -> int:
    """``"25M"`` → 25000000 (decimal K/M/B suffixes); plain integers pass through."""
    return _parse(value, _COUNT_UNITS, "count")


def format_bytes(n: float) -> str:
    """Binary units with one decimal: 4509715660 → ``4.2 GiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


ByteSize = Annotated[
    int,
    BeforeValidator(parse_bytes),
    Field(ge=0, le=MAX_BYTES),
    PlainSerializer(int),
    WithJsonSchema({
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_BYTES},
            {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([KMGT]i?B|B)?\s*$"},
        ],
        "examples": ["2GiB", 500000000],
    }),
]
Count = Annotated[
    int,
    BeforeValidator(parse_count),
    Field(gt=0, le=MAX_COUNT),
    PlainSerializer(int),
    WithJsonSchema({
        "anyOf": [
            {"type": "integer", "exclusiveMinimum": 0, "maximum": MAX_COUNT},
            {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[KkMmBbGg]?\s*$"},
        ],
        "examples": ["25M", 1000],
    }),
]
