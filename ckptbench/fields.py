"""One-line validation of what users type: table fields, option values and small files.

Every error names the field (or path) and what is allowed, so the CLI can print it as
one line and exit 2. Pure helpers: they know nothing of workloads or backends.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptbench.errors import SpecError


def allowed(values: Any) -> str:
    """The allowed values of a field, as an error line lists them."""
    return ", ".join(str(v) for v in values)


def shown(value: Any, limit: int = 60) -> str:
    """repr() of a value for an error line, cut short (names can be long or binary)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_field(table: Mapping[str, Any], section: str, key: str, default: int | None = None,
              minimum: int = 1, maximum: int | None = None) -> int:
    """`[section] key` as an integer in [minimum, maximum] (booleans are not integers)."""
    value = table.get(key, default)
    if value is None:
        raise SpecError(f"[{section}] {key} is required (an integer >= {minimum})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"[{section}] {key} = {shown(value)} must be an integer >= {minimum}")
    if value < minimum:
        raise SpecError(f"[{section}] {key} = {value} must be an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise SpecError(f"[{section}] {key} = {value} is too large; allowed: {minimum} to {maximum:,}")
    return value


def choice_field(table: Mapping[str, Any], section: str, key: str, choices: tuple[str, ...],
                 default: str) -> str:
    """`[section] key` as one of `choices`."""
    value = table.get(key, default)
    if value not in choices:
        raise SpecError(f"[{section}] {key} = {shown(value)} is not allowed; "
                        f"allowed: {allowed(choices)}")
    return str(value)


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for an error line."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def open_regular(path: str | Path, rule: str, flags: int = 0,
                 error: type[Exception] = SpecError) -> int:
    """A read-only descriptor of `path`, refused (`error`, one line ending in `rule`)
    unless it is a regular file.

    O_NONBLOCK keeps the open of a FIFO from waiting for a writer; the kind is then
    checked on the open descriptor (no race with a rename), and O_NONBLOCK is cleared
    again (it means nothing for a regular file). FileNotFoundError passes through.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {file_kind(mode)}, not a regular file; {rule}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small_bytes(path: str | Path, max_bytes: int, rule: str,
                     error: type[Exception] = SpecError) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; at most one byte more than
    the limit is read (a file that grows, or /proc, cannot fill memory)."""
    try:
        fd = open_regular(path, rule, error=error)
    except FileNotFoundError:
        raise error(f"{path}: no such file; {rule}") from None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{path}: larger than {max_bytes:,} bytes; {rule}")
    return data


def read_small_text(path: Path, max_bytes: int, what: str) -> str:
    """The text of a regular, UTF-8 file of at most `max_bytes` (`what` names it in errors)."""
    rule = f"allowed: {what} of at most {max_bytes:,} bytes"
    data = read_small_bytes(path, max_bytes, rule)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start:,} is {data[exc.start]:#04x}); "
                        f"{rule}") from None


def read_toml(path: Path, max_bytes: int, what: str) -> dict[str, Any]:
    """The tables of a small TOML file (`what` names it in errors), or one line why not."""
    text = read_small_text(path, max_bytes, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from None


# C0 controls (tab and newline too: a printed field stays on its line), DEL and C1 controls
# (U+009B is a terminal's CSI): what a terminal would act on instead of showing.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character written as an escape (``\\x1b``), so a string
    read from a file can be printed without driving the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def printable_tree(value: Any) -> Any:
    """A decoded JSON value with :func:`printable` applied to every string in it, keys
    included."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v) for v in value]
    return value


def parse_ranks(text: str, world_size: int, option: str = "--ranks") -> list[int]:
    """'0-7', '0,3', '0-3,8' -> sorted ranks; each must be < world_size."""
    ranks: set[int] = set()
    for piece in text.split(","):
        part = piece.strip()
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
            else:
                lo = hi = int(part)
        except ValueError:
            raise SpecError(
                f"{option} {text!r}: {part!r} is not a rank or range (allowed: e.g. 0-7 or 0,3)"
            ) from None
        if lo < 0 or hi < lo or hi >= world_size:
            raise SpecError(
                f"{option} {text!r}: {part!r} is outside 0-{world_size - 1} (world_size = {world_size})"
            )
        ranks.update(range(lo, hi + 1))
    return sorted(ranks)
