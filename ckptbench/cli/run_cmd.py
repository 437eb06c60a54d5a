"""`ckptbench run` and `ckptbench report`."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
