"""Command-line glue: parse, call the library, render. No logic that tests would need."""

from __future__ import annotations

import sys

import click

from ckptbench import __version__
from ckptbench.cli.streams import ensure_standard_streams
from ckptbench.errors import CkptbenchError
from ckptbench.runner import startup


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptbench")
def cli() -> None:
    """Checkpoint save/restore benchmark: real models, real layouts, honest numbers.

    \b
    ckptbench plan WORKLOAD             what each rank writes
    ckptbench run WORKLOAD --target DIR save and restore, measured
    ckptbench restore CHECKPOINT        restore a kept checkpoint again, measured
    ckptbench relaunch RESULTS          restore from a --keep-tiers run's tier copies
    ckptbench clean TARGET              list (--yes: remove) what ckptbench left there
    ckptbench report RESULTS            summarize a results file
    ckptbench sweep WORKLOAD --target D the same run at 1, 2, 4, 8 ranks per node
    ckptbench cadence ...               optimal checkpoint interval against MTBF
    ckptbench levels ...                multi-level cadence: memory, peers, storage
    ckptbench simulate ...              the whole run simulated: goodput and its spread
    ckptbench mlperf WORKLOAD --target D MLPerf Storage v2.0's way next to ckptbench's
    ckptbench backends                  storage backends, their capabilities and options
    """


def _register() -> None:
    # Imported here so each command lives in its own module and the group stays thin.
    from ckptbench.cli import (
        backend_options,
        cadence_cmd,
        clean_cmd,
        levels_cmd,
        mlperf_cmd,
        plan_cmd,
        relaunch_cmd,
        report_cmd,
        restore_cmd,
        run_cmd,
        sweep_cmd,
    )

    for module in (plan_cmd, run_cmd, restore_cmd, relaunch_cmd, clean_cmd, report_cmd, sweep_cmd, cadence_cmd, levels_cmd, mlperf_cmd,
                   backend_options):
        for command in module.COMMANDS:
            cli.add_command(command)
    startup.mark_imported()  # a fresh process's start and imports: part of a restart


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input is one line on stderr and exit status 2, never a traceback."""
    ensure_standard_streams()  # before anything is opened (cli/streams.py)
    _register()
    try:
        cli.main(args=argv, prog_name="ckptbench", standalone_mode=False)
    except CkptbenchError as exc:
        click.echo(f"ckptbench: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("ckptbench: aborted", err=True)
        return 130
    except click.ClickException as exc:
        # Usage errors (unknown option, missing argument, bad value): one line, exit 2.
        click.echo(f"ckptbench: error: {exc.format_message()}", err=True)
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def run_main() -> None:
    """Console-script wrapper: exit with main()'s status."""
    sys.exit(main())
