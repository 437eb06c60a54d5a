"""`ckptbench cadence`: placeholder until the cadence calculator lands."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
