"""`ckptbench clean TARGET`: list what ckptbench left on a target; `--yes` removes it."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ckptbench.backends import open_backend
from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.runner.clean import KINDS, REMOVABLE, remove, survey


@click.command("clean")
@click.argument("target")
@click.option("--yes", is_flag=True,
              help="Remove what is listed as removable [default: only list it].")
@backend_options
@click.option("--json", "as_json", is_flag=True, help="Print what was found (and removed) as JSON.")
def clean_command(target: str, yes: bool, as_json: bool, **_backend_values: Any) -> None:
    """List what ckptbench left on TARGET (a directory or s3://bucket/prefix): kept
    checkpoints, debris of interrupted runs, empty run directories; --yes removes them,
    each by the names its run recorded. A killed --keep run's committed checkpoints are
    kept (recorded as kept checkpoints). A run in progress, anything ckptbench did not
    write and any file another user owns are left alone."""
    options = options_for_target(target, typed_backend_flags(click.get_current_context()))
    backend = open_backend(target, options)
    found = survey(backend)
    if yes:
        found = remove(backend, found)
        backend.release()  # the marker and the target too, if ckptbench made it and it is empty
    if as_json:
        click.echo(json.dumps(found.record(), indent=2))
        return
    for entry in found.found:
        sign = ("removed" if entry.name in found.removed else "remove") \
            if entry.kind in REMOVABLE else "keep"
        click.echo(f"{sign:8}{entry.line()}")
    for name, uid in found.not_owned:
        click.echo(f"{'left' if yes else 'leave'} in place: {name} is owned by uid {uid}, "
                   f"not uid {os.geteuid()} running clean (clean never deletes another "
                   "user's file)")
    for name in found.left:
        click.echo(f"left in place (not written by ckptbench): {name}")
    n = len(found.removable)
    if not found.found:
        click.echo(f"{target}: nothing ckptbench wrote is left there")
    elif not yes:
        click.echo(f"dry run: nothing removed; `ckptbench clean {target} --yes` removes the "
                   f"{n} entr{'y' if n == 1 else 'ies'} marked remove" if n else
                   f"dry run: nothing to remove ({', '.join(sorted({KINDS[f.kind] for f in found.found}))})")


COMMANDS = [clean_command]
