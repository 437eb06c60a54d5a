"""The run options' CLI flags, generated from their declarations (ckptbench.runspec), and
`--help` grouped as they are (workload, target, I/O, restore, async and tiers, output).

A declared option is one flag of each command that takes it; a bool option's flag switches
it away from its default (`--keep`, `--no-restore`). Flags default to nothing here: what the
user typed is read from click's parameter sources and laid over the declared defaults and
a [run] table by :func:`ckptbench.runspec.resolve`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import click
from click.core import ParameterSource

from ckptbench import runspec

F = Callable[..., Any]
_METAVARS = {"size": "SIZE", "duration": "DURATION", "ranks": "RANKS", "str": "TEXT",
             "float": "FLOAT"}


class GroupedOption(click.Option):
    """A click option that knows its --help group."""

    def __init__(self, *args: Any, group: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


class GroupedCommand(click.Command):
    """--help lists the options by group; backend flags go with the target's."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:
                continue
            group = (param.group if isinstance(param, GroupedOption) else "") or (
                "target" if (param.name or "").startswith("backend_") else "")
            sections.setdefault(group, []).append(record)
        for key in ("", *runspec.GROUPS):
            if sections.get(key):
                with formatter.section(runspec.GROUPS.get(key, "Options")):
                    formatter.write_dl(sections[key])


def _click_option(opt: runspec.RunOption, command: str) -> F:
    shown = opt.shown_default(command)
    unit = f" {opt.unit}" if opt.unit and opt.kind in ("int", "float") else ""
    text = opt.help + (f" [default: {shown}{unit}]"
                       if shown is not None and "[default" not in opt.help else "")
    if opt.kind == "bool":
        return click.option(opt.cli_flag, opt.name, cls=GroupedOption, group=opt.group,
                            is_flag=True, default=False, help=text)
    kind: Any = {"int": str if opt.words else int if opt.minimum is None else click.IntRange(
        min=int(opt.minimum), max=None if opt.maximum is None else int(opt.maximum)),
                 "float": float, "choice": click.Choice(opt.choices)}.get(opt.kind, str)
    return click.option(opt.cli_flag, opt.name, cls=GroupedOption, group=opt.group,
                        type=kind, default=None, help=text,
                        metavar="|".join(["N", *(w for w, _ in opt.words)])
                        if opt.kind == "int" and opt.words else _METAVARS.get(opt.kind))


def run_options(command: str) -> Callable[[F], F]:
    """Decorate `command` with the flags of every run option it takes (values arrive in
    **kwargs; read them with :func:`settings`)."""

    def decorate(func: F) -> F:
        for opt in reversed(runspec.declared(command)):
            func = _click_option(opt, command)(func)
        return func

    return decorate


def given(ctx: click.Context, command: str) -> dict[str, Any]:
    """Option name -> value for the run options typed on the command line."""
    out: dict[str, Any] = {}
    for opt in runspec.declared(command):
        source = ctx.get_parameter_source(opt.name)
        if source is not None and source is not ParameterSource.DEFAULT:
            out[opt.name] = (not opt.default) if opt.kind == "bool" else ctx.params[opt.name]
    return out


def settings(ctx: click.Context, command: str, table: Mapping[str, Any] | None = None,
             where: str = "[run]") -> dict[str, Any]:
    """`command`'s options: declared defaults, then `table`, then the command line."""
    return runspec.resolve(command, table, where, given(ctx, command))
