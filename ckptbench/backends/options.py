"""Typed backend options and I/O hints.

Each backend declares its options as a frozen dataclass deriving from :class:`BackendOptions`;
a field that users may set from the command line carries an :func:`option` in its metadata
(flag, help, allowed values). From that one declaration:

* the CLI generates its flags (``ckptbench.cli.backend_options``) and says which backend
  takes which flag;
* a flag given for a backend that does not take it (``--part-size`` with a directory target)
  is refused in one line (:meth:`BackendOptions.from_flags`), as is an unknown option name
  (:meth:`BackendOptions.from_mapping`);
* values are checked when the dataclass is made (allowed values, minimum, the backend's own
  :meth:`BackendOptions.validate`), so a library caller gets the same one-line errors.

:class:`IOHints` says how the runner will drive a backend (block size, threads, striping),
as IOR's hints do: a backend sizes its pools and buffers from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Self

from ckptbench.errors import BackendError
from ckptbench.units import format_size, parse_size

_OPTION = "ckptbench.option"


@dataclass(frozen=True)
class OptionSpec:
    """How one option field is spelled on the command line and what it allows."""

    flag: str  # e.g. "--part-size"
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    size: bool = False  # a byte count: '8MiB', '4M', '1048576' (ckptbench.units)
    switch: bool = False  # an on/off flag that takes no value (default off)

    def parse(self, value: Any) -> Any:
        """A value as typed (a string for sizes) -> the field's value."""
        if self.size and isinstance(value, str):
            return parse_size(value, self.flag)
        return value

    def check(self, value: Any) -> None:
        if value is None and not self.choices:
            return  # None: the backend chooses (e.g. S3's part size per object)
        if self.switch:
            if not isinstance(value, bool):
                raise BackendError(f"{self.flag} {value!r}: allowed: true or false")
            return
        if self.choices and value not in self.choices:
            raise BackendError(f"{self.flag} {value!r} is not allowed; allowed: "
                               f"{', '.join(self.choices)}")
        if self.minimum is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise BackendError(f"{self.flag} {value!r}: allowed: an integer, "
                                   f"{self.minimum} or more")
            if value < self.minimum:
                raise BackendError(f"{self.flag} {value}: allowed: {self.minimum} or more")

    def show(self, value: Any) -> str:
        """A default as a user would type it."""
        return format_size(value) if self.size and isinstance(value, int) else str(value)


def option(flag: str, help: str, *, choices: tuple[str, ...] = (), minimum: int | None = None,
           size: bool = False, switch: bool = False) -> dict[str, OptionSpec]:
    """Field metadata for an option settable from the command line."""
    return {_OPTION: OptionSpec(flag, help, choices, minimum, size, switch)}


def option_spec(f: Any) -> OptionSpec | None:
    """The OptionSpec of a dataclass field, or None for a library-only field."""
    spec = f.metadata.get(_OPTION)
    return spec if isinstance(spec, OptionSpec) else None


@dataclass(frozen=True)
class BackendOptions:
    """A backend's options (none here: the null and memory backends take none)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            spec = option_spec(f)
            if spec is not None:
                spec.check(getattr(self, f.name))
        self.validate()

    def validate(self) -> None:
        """Rules beyond one field's allowed values (e.g. S3's part size range)."""

    @classmethod
    def cli_fields(cls) -> dict[str, tuple[str, OptionSpec]]:
        """flag -> (field name, spec), for the fields settable from the command line."""
        out: dict[str, tuple[str, OptionSpec]] = {}
        for f in fields(cls):
            spec = option_spec(f)
            if spec is not None:
                out[spec.flag] = (f.name, spec)
        return out

    @classmethod
    def from_flags(cls, given: Mapping[str, Any], backend: str, target: str) -> Self:
        """Options from the flags a user typed (flag -> value); a flag this backend does
        not take is a one-line error naming the target and the flags it does take."""
        mine = cls.cli_fields()
        values: dict[str, Any] = {}
        for flag, value in given.items():
            if flag not in mine:
                allowed = ", ".join(mine) or "none"
                raise BackendError(f"{flag} is not an option of the {backend} backend (target "
                                   f"{target}); its options: {allowed}")
            name, spec = mine[flag]
            values[name] = spec.parse(value)
        return cls(**values)

    @classmethod
    def from_mapping(cls, given: Mapping[str, Any], backend: str) -> Self:
        """Options from a mapping of field names (library callers, config files); None
        means the default; an unknown name is a one-line error."""
        known = {f.name: option_spec(f) for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in given.items():
            if name not in known:
                raise BackendError(f"{backend} backend: unknown option {name!r}; allowed: "
                                   f"{', '.join(known) or 'none'}")
            if value is not None:
                spec = known[name]
                values[name] = spec.parse(value) if spec is not None else value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IOHints:
    """How the runner drives a backend, given at construction (like IOR's hints): bytes per
    write/read call, I/O threads per process, and the workload's striping."""

    block_size: int = 8 << 20
    threads: int = 1
    stripe_size: int = 1 << 20
    stripe_count: int = 0  # 0: leave the file system's layout alone; -1: all targets
    ranks_per_host: int = 1  # ranks of this run on one host (a local launch: all of them)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.threads < 1:
            raise BackendError(f"I/O hints: block_size {self.block_size} and threads "
                               f"{self.threads}: allowed: 1 or more")
