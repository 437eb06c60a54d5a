"""Sizes, rates, durations and fractions: parsing what users type, formatting what we print.

One place for units, so ``--block-size``, ``--checkpoint-size`` and the benchmarks agree:

* sizes: ``KB MB GB TB PB`` are powers of 1000, ``KiB MiB GiB TiB PiB`` powers of 1024, and
  a bare letter (``4M``, ``512K``: IOR's and fio's spelling) is binary; case does not matter.
  A bare number is in the caller's default unit (bytes for I/O sizes, GB for checkpoint
  sizes).
* rates: a size per second, ``2TB/s`` or ``2TBps`` (bare number: the default unit per s);
  a link's bandwidth (:func:`parse_bandwidth`) also takes bits: ``400Gb/s``, ``400Gbit/s``.
* durations: ``ms s min h d`` (and their spelled-out forms); a bare number is in the
  caller's default unit.

What every command prints follows one convention (:data:`CONVENTION`): sizes in binary
units (:func:`format_bytes`: ``22.47 MiB``, ``4.729 TiB``), rates in decimal units
(:func:`format_rate`: ``0.6023 GB/s``, ``1.5 TB/s``), as file systems report sizes and
storage vendors quote bandwidth. MLPerf Storage's own figure stays in its GiB/s.

Every error is a :class:`SpecError` of one line naming the option and what is allowed.
"""

from __future__ import annotations

import math
import re

from ckptbench.errors import SpecError

_POWERS = ("k", "m", "g", "t", "p")
SIZE_UNITS: dict[str, int] = {
    "b": 1,
    **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate(_POWERS)},
    **{f"{p}ib": 1024 ** (i + 1) for i, p in enumerate(_POWERS)},
    **{p: 1024 ** (i + 1) for i, p in enumerate(_POWERS)},
}
DURATION_UNITS: dict[str, float] = {
    **dict.fromkeys(("ms", "msec", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_UNIT_NAMES = {"b": "bytes", "s": "seconds", "min": "minutes", "h": "hours"}
_SIZE_ALLOWED = "B, KB ... PB (powers of 1000), KiB ... PiB or K ... P (powers of 1024)"
_DURATION_ALLOWED = "ms, s, min, h, d"
_NUMBER = re.compile(r"^\s*([+-]?(?:[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?|inf))\s*([a-z/]*)\s*$",
                     re.IGNORECASE)


def _split(text: str, option: str, what: str) -> tuple[float, str]:
    match = _NUMBER.match(text)
    if not match:
        raise SpecError(f"{option} {text!r} is not {what}")
    return float(match.group(1)), match.group(2).lower()


def _unit_name(unit: str) -> str:
    return _UNIT_NAMES.get(unit.lower(), unit)


def _positive(value: float, text: str, option: str, default: str, finite: bool = True) -> None:
    if finite and math.isinf(value) and value > 0:
        raise SpecError(f"{option} {text!r}: inf is not allowed here; allowed: a finite value > 0 "
                        f"(a bare number is in {_unit_name(default)})")
    if not value > 0:
        raise SpecError(f"{option} must be > 0 (a bare number is in {_unit_name(default)}"
                        + ("; inf allowed" if not finite else "") + ")")


def _size_factor(unit: str, text: str, option: str) -> int:
    factor = SIZE_UNITS.get(unit)
    if factor is None:
        raise SpecError(f"{option} {text!r}: unknown unit {unit!r}; allowed: {_SIZE_ALLOWED}")
    return factor


def parse_size(text: str, option: str, default_unit: str = "B") -> int:
    """Bytes from '8MiB', '4M', '1048576', '5.2TB' (a bare number is in `default_unit`)."""
    value, unit = _split(text, option, "a size; allowed: a number and a unit, e.g. 8MiB, 4M, "
                                       f"5.2TB (a bare number is in {_unit_name(default_unit)})")
    factor = _size_factor(unit or default_unit.lower(), text, option)
    _positive(value, text, option, default_unit)
    nbytes = round(value * factor)
    if nbytes <= 0:
        raise SpecError(f"{option} {text!r} is less than one byte; allowed: a size > 0")
    return nbytes


def parse_rate(text: str, option: str, default_unit: str = "GB") -> float:
    """Bytes per second from '2TB/s', '800MiBps', '2.5' (a bare number: `default_unit`/s)."""
    value, unit = _split(text, option, "a rate like 2.5GB/s")
    unit = unit.removesuffix("/s").removesuffix("ps")
    factor = _size_factor(unit or default_unit.lower(), text, option)
    _positive(value, text, option, f"{default_unit}/s")
    return value * factor


_BIT_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_bandwidth(text: str, option: str, default_unit: str = "Gb") -> float:
    """Bytes per second of a link: ``400Gb/s``, ``400Gbit/s``, ``400Gbps`` (a lowercase b
    or ``bit``: bits, as networks are quoted), ``50GB/s`` (bytes: as :func:`parse_rate`);
    a bare number is in `default_unit`/s. The unit's case matters here (b is not B)."""
    allowed = (f"{option} {text!r}: allowed: a rate > 0 such as 400Gb/s, 3.2Tb/s, 50GB/s (a "
               f"lowercase b or bit: bits; B: bytes; a bare number: {default_unit}/s)")
    match = _NUMBER.match(text)
    if not match or match.group(1).lower() == "inf":
        raise SpecError(allowed)
    value = float(match.group(1))
    unit = (match.group(2).removesuffix("/s").removesuffix("ps")) or default_unit
    bits = unit[:-3] if unit.lower().endswith("bit") else unit[:-1] if unit.endswith("b") else None
    if bits is not None and bits.lower() in _BIT_PREFIX:
        rate = value * _BIT_PREFIX[bits.lower()] / 8
    elif unit.lower() in SIZE_UNITS:
        rate = value * SIZE_UNITS[unit.lower()]
    else:
        raise SpecError(allowed)
    if not 0 < rate < math.inf:
        raise SpecError(allowed)
    return rate


def parse_duration(text: str, option: str, default_unit: str = "s",
                   allow_inf: bool = False) -> float:
    """Seconds from '51', '51s', '3.1h', '30min', '1d' (a bare number is in `default_unit`);
    'inf' only where `allow_inf` (e.g. an MTBF: no failures)."""
    value, unit = _split(text, option, f"a duration like 51s, 30min or 3.1h (units: "
                                       f"{_DURATION_ALLOWED})")
    factor = DURATION_UNITS.get(unit or default_unit)
    if factor is None:
        raise SpecError(f"{option} {text!r}: unknown unit {unit!r}; allowed: {_DURATION_ALLOWED}")
    _positive(value, text, option, default_unit, finite=not allow_inf)
    return value * factor


def parse_fraction(text: str, option: str) -> float:
    """A fraction strictly between 0 and 1 from '0.95' or '95%'."""
    body = text.strip()
    percent = body.endswith("%")
    try:
        value = float(body.removesuffix("%")) / (100.0 if percent else 1.0)
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:
        raise SpecError(f"{option} {text!r} must be in (0, 1) or a percentage like 95%")
    return value


def format_size(nbytes: float, binary: bool = True) -> str:
    """'8MiB', '1.5GiB', '5.2TB': the largest unit that keeps the number at least 1."""
    base, suffix = (1024, "iB") if binary else (1000, "B")
    value, unit = float(nbytes), "B"
    for p in _POWERS:
        if abs(value) < base:
            break
        value /= base
        unit = p.upper() + suffix
    return f"{value:.4g}{unit}"


CONVENTION = "sizes in binary units (GiB = 2^30 B), rates in decimal units (GB/s = 1e9 B/s)"


def format_bytes(nbytes: float) -> str:
    """A size as printed: binary units, four significant digits, '22.47 MiB', '4.729 TiB'."""
    text = format_size(nbytes)
    number = text.rstrip("KMGTPiB")
    return f"{number} {text[len(number):]}"


def gbps(bytes_per_s: float | None) -> str:
    """A rate as a number of GB/s (1e9 B/s) for table cells headed 'GB/s'; '-' for none."""
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:.3f}"


def format_rate(bytes_per_s: float) -> str:
    """A rate as printed: decimal units, four significant digits, '0.6023 GB/s',
    '1.5 TB/s' (from 1e12 B/s)."""
    if abs(bytes_per_s) >= 1e12:
        return f"{bytes_per_s / 1e12:.4g} TB/s"
    return f"{bytes_per_s / 1e9:.4g} GB/s"


def format_duration(seconds: float) -> str:
    """'3.1 h', '30 min', '51 s'; 'never' for inf."""
    if math.isinf(seconds):
        return "never"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
