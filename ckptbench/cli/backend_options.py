"""The backends' CLI flags, generated from their typed options, and `ckptbench backends`.

Each backend declares its options once (a dataclass, ``ckptbench.backends.options``); the
flags here are made from those declarations, so a new backend's options appear without
editing this module. A flag several backends take (``--endpoint-url``) is one flag. Which
flags the user typed is read from click's parameter sources, and the target's backend
turns them into its typed options, refusing a flag it does not take in one line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from ckptbench.backends import OTHER, Backend, BackendOptions, backend_class, registered
from ckptbench.backends.base import capabilities_of
from ckptbench.backends.options import OptionSpec


@dataclasses.dataclass(frozen=True)
class BackendFlag:
    """One generated flag: the backends that take it, with their spec and default."""

    flag: str
    takers: tuple[tuple[str, OptionSpec, Any], ...]  # (backend name, spec, default)

    @property
    def param(self) -> str:
        return "backend_" + self.flag.lstrip("-").replace("-", "_")

    def click_option(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        specs = [spec for _, spec, _ in self.takers]
        choices = sorted({c for s in specs for c in s.choices})
        minimum = min((s.minimum for s in specs if s.minimum is not None), default=None)
        kind: Any = str
        if choices:
            kind = click.Choice(choices)
        elif minimum is not None and not any(s.size for s in specs):
            kind = click.IntRange(min=minimum)
        helps = list(dict.fromkeys(spec.help for spec in specs))
        text = helps[0] if len(helps) == 1 else " ".join(
            f"{name}: {spec.help}" for name, spec, _ in self.takers)
        defaults = list(dict.fromkeys(spec.show(d) for _, spec, d in self.takers if d is not None))
        names = ", ".join(name for name, _, _ in self.takers)
        which = "backends" if len(self.takers) > 1 else "backend"
        shown = f"; default: {defaults[0]}" if len(defaults) == 1 else ""
        if all(s.switch for s in specs):
            return click.option(self.flag, self.param, is_flag=True, default=False,
                                help=f"{text} [{which}: {names}]")
        return click.option(self.flag, self.param, type=kind, default=None,
                            help=f"{text} [{which}: {names}{shown}]")


def backend_flags() -> list[BackendFlag]:
    takers: dict[str, list[tuple[str, OptionSpec, Any]]] = {}
    for cls in registered().values():
        defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)}
        for flag, (field_name, spec) in cls.Options.cli_fields().items():
            takers.setdefault(flag, []).append((cls.name, spec, defaults[field_name]))
    return [BackendFlag(flag, tuple(t)) for flag, t in takers.items()]


def backend_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with every registered backend's flags (values arrive in
    **kwargs; read what was typed with :func:`typed_backend_flags`)."""
    for flag in reversed(backend_flags()):
        func = flag.click_option()(func)
    return func


def typed_backend_flags(ctx: click.Context) -> dict[str, Any]:
    """flag -> value for the backend flags the user gave (not click's defaults)."""
    out: dict[str, Any] = {}
    for flag in backend_flags():
        source = ctx.get_parameter_source(flag.param)
        if source is not None and source is not ParameterSource.DEFAULT:
            out[flag.flag] = ctx.params[flag.param]
    return out


def options_for_target(target: str, given: dict[str, Any]) -> BackendOptions:
    """The typed options of `target`'s backend from the flags given (flag -> value)."""
    cls = backend_class(target)
    return cls.Options.from_flags(given, cls.name, target)


def _describe(scheme: str, cls: type[Backend]) -> dict[str, Any]:
    return {
        "scheme": "any other URL (fsspec)" if scheme == OTHER else
        ("a path or file://" if scheme == "file" else f"{scheme}://"),
        "backend": cls.name,
        "capabilities": capabilities_of(cls),
        "options": {flag: spec.help for flag, (_, spec) in cls.Options.cli_fields().items()},
        "about": ((sys.modules[cls.__module__].__doc__ or "").strip().splitlines() or [""])[0],
    }


@click.command("backends")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def backends_command(as_json: bool) -> None:
    """List the storage backends: target scheme, capabilities, options."""
    rows = [_describe(scheme, cls) for scheme, cls in registered().items()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        caps = ", ".join(k for k, v in row["capabilities"].items() if v) or "-"
        click.echo(f"{row['backend']:<8} {row['scheme']}: {row['about']}")
        click.echo(f"{'':<8} capabilities: {caps}")
        click.echo(f"{'':<8} options: {', '.join(row['options']) or '-'}")


COMMANDS = [backends_command]
