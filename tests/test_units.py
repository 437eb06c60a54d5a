"""ckptbench.units: one table of what users type and what it means, errors included."""

from __future__ import annotations

import math

import pytest

from ckptbench.errors import SpecError
from ckptbench.units import (
    format_bytes,
    format_duration,
    format_rate,
    format_size,
    gbps,
    parse_bandwidth,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
)

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(("text", "default", "nbytes"), [
    ("8MiB", "B", 8 * MIB),  # --block-size as documented
    ("4M", "B", 4 * MIB),  # a bare letter is binary (IOR, fio)
    ("1048576", "B", MIB),  # a bare number is in the default unit
    ("512KiB", "B", 512 * KIB),
    ("512k", "B", 512 * KIB),
    ("64mib", "B", 64 * MIB),  # case does not matter
    (" 64 MiB ", "B", 64 * MIB),
    ("1.5GiB", "B", 3 * GIB // 2),
    ("1TiB", "B", TIB),
    ("1P", "B", 1 << 50),
    ("8MB", "B", 8_000_000),  # KB, MB, ... are decimal: explicit
    ("1KB", "B", 1000),
    ("3B", "B", 3),
    ("1e3", "B", 1000),
    ("3", "GB", 3_000_000_000),  # cadence's --checkpoint-size: a bare number is GB
    ("5.2TB", "GB", 5_200_000_000_000),
    ("800GiB", "GB", 800 * GIB),
])
def test_sizes(text: str, default: str, nbytes: int) -> None:
    got = parse_size(text, "--x", default_unit=default)
    assert got == nbytes and isinstance(got, int)


@pytest.mark.parametrize(("text", "message"), [
    ("lots", "--x 'lots' is not a size"),
    ("", "is not a size"),
    ("nan", "is not a size"),
    ("8 MiB/s", "unknown unit 'mib/s'"),
    ("2 furlongs", "unknown unit 'furlongs'; allowed: B, KB"),
    ("0", "--x must be > 0 (a bare number is in bytes)"),
    ("-1MiB", "--x must be > 0"),
    ("inf", "--x 'inf': inf is not allowed here"),
    ("0.1B", "less than one byte"),
])
def test_bad_sizes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_size(text, "--x")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "rate"), [
    ("2TB/s", 2e12), ("2.5", 2.5e9), ("800MiBps", 800 * MIB), ("1GiB/s", GIB), ("10GB", 1e10),
])
def test_rates(text: str, rate: float) -> None:
    assert parse_rate(text, "--x") == pytest.approx(rate)


@pytest.mark.parametrize(("text", "message"), [
    ("fast", "--x 'fast' is not a rate"), ("2TB/h", "unknown unit"), ("0", "must be > 0"),
    ("inf", "inf is not allowed"),
])
def test_bad_rates(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_rate(text, "--x")


@pytest.mark.parametrize(("text", "unit", "seconds"), [
    ("51", "s", 51.0), ("51s", "s", 51.0), ("3.1h", "s", 3.1 * 3600), ("3.1", "h", 3.1 * 3600),
    ("30 min", "h", 1800.0), ("1.5min", "s", 90.0), ("1d", "min", 86400.0),
    ("250ms", "s", 0.25), ("2e3", "s", 2000.0), ("2 hours", "s", 7200.0), ("5", "min", 300.0),
])
def test_durations(text: str, unit: str, seconds: float) -> None:
    assert parse_duration(text, "--x", unit) == pytest.approx(seconds)


def test_infinity_only_where_allowed() -> None:
    assert parse_duration("inf", "--mtbf", "h", allow_inf=True) == math.inf
    with pytest.raises(SpecError, match="--save-seconds 'inf': inf is not allowed here; "
                                        "allowed: a finite value > 0"):
        parse_duration("inf", "--save-seconds", "s")
    with pytest.raises(SpecError, match=r"--mtbf must be > 0 .a bare number is in hours; inf"):
        parse_duration("-inf", "--mtbf", "h", allow_inf=True)


@pytest.mark.parametrize(("text", "message"), [
    ("soon", "is not a duration like 51s"), ("3 fortnights", "unknown unit 'fortnights'"),
    ("0", "--x must be > 0 (a bare number is in seconds)"), ("-2s", "must be > 0"),
])
def test_bad_durations(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_duration(text, "--x", "s")
    assert message in str(err.value)


@pytest.mark.parametrize(("text", "value"), [("95%", 0.95), ("0.9", 0.9), ("0.5%", 0.005)])
def test_fractions(text: str, value: float) -> None:
    assert parse_fraction(text, "--x") == pytest.approx(value)


@pytest.mark.parametrize("text", ["95", "0", "1", "abc", "100%", "-5%"])
def test_bad_fractions(text: str) -> None:
    with pytest.raises(SpecError, match="--x"):
        parse_fraction(text, "--x")


@pytest.mark.parametrize(("nbytes", "binary", "text"), [
    (8 * MIB, True, "8MiB"), (1536, True, "1.5KiB"), (100, True, "100B"), (TIB, True, "1TiB"),
    (5.2e12, False, "5.2TB"), (999, False, "999B"),
])
def test_format_size(nbytes: float, binary: bool, text: str) -> None:
    assert format_size(nbytes, binary) == text


@pytest.mark.parametrize(("nbytes", "text"), [
    (22.47 * MIB, "22.47 MiB"), (4.729 * TIB, "4.729 TiB"), (100, "100 B"), (5.2e12, "4.729 TiB"),
])
def test_sizes_print_in_binary_units(nbytes: float, text: str) -> None:
    assert format_bytes(nbytes) == text


@pytest.mark.parametrize(("rate", "text"), [
    (6.023e8, "0.6023 GB/s"), (3.54e7, "0.0354 GB/s"), (598.6e9, "598.6 GB/s"),
    (1.5e12, "1.5 TB/s"), (2 * GIB, "2.147 GB/s"),
])
def test_rates_print_in_decimal_units(rate: float, text: str) -> None:
    assert format_rate(rate) == text
    assert gbps(rate) == f"{rate / 1e9:.3f}" and gbps(None) == "-"


@pytest.mark.parametrize("nbytes", [1, 4096, 8 * MIB, 5 * MIB, 3 * GIB // 2, TIB, 7 << 50])
def test_format_then_parse_is_the_same_size(nbytes: int) -> None:
    assert parse_size(format_size(nbytes), "--x") == nbytes


@pytest.mark.parametrize(("seconds", "text"), [
    (math.inf, "never"), (51, "51 s"), (1800, "30 min"), (3.1 * 3600, "3.1 h"), (2 * 86400, "2 d"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("text", "rate"), [
    ("400Gb/s", 50e9), ("400Gbit/s", 50e9), ("400Gbps", 50e9), ("400", 50e9),
    ("3.2Tb/s", 400e9), ("50GB/s", 50e9), ("100MB/s", 100e6), ("1GiB/s", GIB),
])
def test_bandwidths_in_bits_or_bytes(text: str, rate: float) -> None:
    """A lowercase b (or bit) is bits, as links are quoted; B is bytes, as parse_rate."""
    assert parse_bandwidth(text, "--x") == pytest.approx(rate)


@pytest.mark.parametrize("text", ["0", "-400Gb/s", "fast", "400furlongs", "1e400Gb/s",
                                  "400Xb/s", "inf"])
def test_bad_bandwidths_are_one_line(text: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_bandwidth(text, "--x")
    assert str(err.value).startswith(f"--x {text!r}: allowed: a rate > 0")
    assert "\n" not in str(err.value)
