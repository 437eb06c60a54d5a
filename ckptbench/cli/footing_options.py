"""The options that choose how a tiered run's levels are scaled to the job (one footing for
every tier: docs/cadence.md), declared once for `levels`, `simulate` and `report`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def footing_option_list(when: str) -> list[Callable[[Any], Any]]:
    """--footing, --node-memory-bandwidth and --node-network; `when` says when they apply
    ("With --tiers-results")."""
    return [
        click.option("--footing", metavar="stated|measured", default=None,
                     help=f"{when}: what every tier is scaled to the job by: stated figures "
                          "for the job's nodes (--node-memory-bandwidth, --node-network), or "
                          "measured: the run's own nodes (its memory copy and transport); "
                          "storage by the job model in both [default: stated; "
                          "docs/cadence.md]."),
        click.option("--node-memory-bandwidth", metavar="BW", default=None,
                     help=f"{when}, stated footing: a node's host memory bandwidth (a copy "
                          "moves at half of it), for the memory tier scaled to the job "
                          "(614.4GB/s; a bare number: GB/s) [default: 614.4GB/s, an HGX H100 "
                          "node's 2 x 8 channels of DDR5-4800; docs/cadence.md]."),
        click.option("--node-network", metavar="BW|measured", default=None,
                     help=f"{when}, stated footing: a node's network bandwidth, for the peer "
                          "tier scaled to the job (400Gb/s, 3.2Tb/s, 50GB/s; a lowercase b: "
                          "bits; measured: the run's own transport, only with --footing "
                          "measured) [default: 400Gb/s, a node's host network in NVIDIA's HGX "
                          "reference architecture; docs/cadence.md]."),
    ]
