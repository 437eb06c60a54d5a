"""`ckptbench restore CHECKPOINT`: measure the restore of a checkpoint kept with --keep again
(later, after a reboot, from other hosts, onto another restore layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ckptbench.cli.backend_options import backend_options, options_for_target, typed_backend_flags
from ckptbench.cli.run_cmd import quiet_unless_root, stopped_as
from ckptbench.cli.run_options import GroupedCommand, run_options, settings
from ckptbench.measure import measure, restore_request, run_status
from ckptbench.redact import redact
from ckptbench.report import table
from ckptbench.runner import Launcher, RunRequest, open_launcher
from ckptbench.runner.kept import split_checkpoint
from ckptbench.runner.scheduler import job_text
from ckptbench.runner.signals import say_on_signal, stop_on_signals


@click.command("restore", cls=GroupedCommand)
@click.argument("checkpoint")
@run_options("restore")
@backend_options
def restore_command(checkpoint: str, **_values: Any) -> None:
    """Restore CHECKPOINT (TARGET/RUN_ID/CHECKPOINT, kept with --keep), measured and
    verified chunk by chunk, onto its restore layout or the one given.

    Trust: the manifest's xxh3 digests catch damage, not tampering (whoever can write the
    checkpoint can rewrite them). A torch-dcp checkpoint's .metadata (a pickle) is read
    with an allow-list only, whatever its source: DCP's metadata classes, torch.Size,
    dtypes, layouts, OrderedDict, paths; any other global is refused in one line (exit 2)
    before anything in it runs. Still trusted: those classes and DCP's reads of the files
    .metadata names (torch.load, weights_only), with either --restore-plan
    (docs/formats.md)."""
    ctx = click.get_current_context()
    opts = settings(ctx, "restore")
    root, _ = split_checkpoint(checkpoint)
    backend = options_for_target(root, typed_backend_flags(ctx))
    launch = open_launcher(opts["launcher"])
    # Local restores stop on SIGTERM/SIGHUP as on Ctrl-C; MPI ranks end at once (runner.signals).
    if launch.kind != "local" and launch.root:
        say_on_signal(lambda name: f"stopped by {name}{job_text()}; the restore only read "
                                   f"{redact(checkpoint)}: nothing to clean up")
    with quiet_unless_root(launch), stop_on_signals(launch.kind == "local"):
        req = restore_request(checkpoint, opts, backend)
        path = Path(opts["results"]) if opts["results"] else \
            Path("results") / f"{req.workload.name}-restore-{req.options.run_id}.jsonl"
        _measure(launch, req, path, checkpoint, opts["json"])


def _measure(launch: Launcher, req: RunRequest, path: Path, checkpoint: str,
             as_json: bool) -> None:
    with run_status(req, "restore", launch) as status, \
            stopped_as(f"the restore of {checkpoint}", path):
        outcome = measure(req, path, launch, on_progress=status,
                          on_start=None if as_json else  # --json: the JSON alone on stdout
                          lambda: click.echo(f"restoring {checkpoint}"),
                          on_notice=lambda line: status.note(f"ckptbench: note: {line}"))
    if outcome is None:
        return
    if as_json:
        click.echo(json.dumps({"results": str(path), "summary": outcome["summary"]}, indent=2))
    else:
        width = table.output_width(False, None)
        table.render_summary(table.console_for(width), [outcome], width)
        click.echo(f"results: {path}")


COMMANDS = [restore_command]
