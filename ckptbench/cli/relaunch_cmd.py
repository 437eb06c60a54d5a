"""`ckptbench relaunch RESULTS`: restore from the tier copies a `--keep-tiers` run left."""

from __future__ import annotations

from pathlib import Path

import click

from ckptbench.records import JsonlSink
from ckptbench.runner.tier_relaunch import discard, load_kept, refuse_live, relaunch


@click.command("relaunch")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--replaced-node", "replaced", type=int, multiple=True,
              help="A node replaced since the run (its copies are not read: its ranks fetch "
                   "from peers); repeat for more [default: none].")
@click.option("--out", "out", type=click.Path(path_type=Path),
              help="Results file for the relaunch's records [default: RESULTS with "
                   "-relaunch before .jsonl].")
@click.option("--discard", "only_discard", is_flag=True,
              help="Remove the run's kept copies by name without restoring.")
def relaunch_command(results: Path, replaced: tuple[int, ...], out: Path | None,
                     only_discard: bool) -> None:
    """Restore the newest checkpoint every shard is fully held for from the memory and
    peer copies a `run --keep-tiers` left (it died, or ended), verify every byte against
    the save's digests, record which tier served each process, then remove the copies.
    A run still in progress (its process alive, or on another host its lease fresh, as
    `ckptbench clean` tells) is refused: wait for it to end, or kill it first."""
    kept = load_kept(results)
    refuse_live(kept)  # a run in progress: its copies are its own (as `clean` judges it)
    if only_discard:
        discard(kept)
        click.echo(f"removed the tier copies of run {kept.run_id}")
        return
    path = out or results.with_name(results.stem + "-relaunch.jsonl")
    sink = JsonlSink(path)
    sink.open()  # an existing file is refused before any copy is read
    try:
        recs = relaunch(kept, set(replaced))
        sink.write_all(recs)
    except BaseException:
        sink.close()
        if not sink.records:
            path.unlink(missing_ok=True)  # made above, empty: nothing to keep
        raise
    sink.close()
    discard(kept)  # restored and recorded: the copies go, by name
    for r in recs:
        click.echo(f"checkpoint {r['iteration']}: process {r['process']} (node {r['node']}): "
                   f"{r['tier']} from node {r['from_node']}, {r['bytes']} bytes verified")
    if recs and recs[0]["not_held"]:
        click.echo(f"not held (cut off in flight), not restored: checkpoint(s) "
                   f"{', '.join(map(str, recs[0]['not_held']))}")


COMMANDS = [relaunch_command]
