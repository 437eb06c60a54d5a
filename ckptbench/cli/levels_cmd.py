"""`ckptbench levels`: the multi-level cadence (node memory, peers, storage) against
failure classes that each take some copies with them."""

from __future__ import annotations

import json

import click

from ckptbench.cadence import classes as fc
from ckptbench.cadence import multilevel as ml
from ckptbench.errors import SpecError
from ckptbench.units import format_duration, parse_duration


def _level(text: str) -> tuple[ml.Level, str]:
    parts = text.split(":")
    if len(parts) != 4 or not parts[0].strip():
        raise SpecError(f"--level {text!r}: allowed: NAME:SAVE:RESTORE:SCOPE, e.g. "
                        f"memory:2s:20s:process (scope {'|'.join(fc.SCOPES)})")
    name = parts[0].strip()
    save = parse_duration(parts[1], f"--level {name} SAVE", "s")
    restore = parse_duration(parts[2], f"--level {name} RESTORE", "s")
    return ml.Level(name, save, restore), parts[3].strip()


def _schedule(text: str, levels: int) -> ml.Schedule:
    """DUR[:V1,V2,...]: compute between checkpoints, and counts per level below the top."""
    head, _, tail = text.partition(":")
    compute = parse_duration(head, "--schedule", "min")
    try:
        counts = tuple(int(v) for v in tail.split(",")) if tail else ()
    except ValueError:
        raise SpecError(f"--schedule {text!r}: allowed: DUR[:V1,V2,...], e.g. 5min:6,4 "
                        "(level-k checkpoints before each level-(k+1) one)") from None
    if len(counts) != levels - 1:
        raise SpecError(f"--schedule {text!r}: {len(counts)} counts given; allowed: one per "
                        f"level below the top ({levels - 1})")
    return ml.Schedule(compute, counts)


def _describe(o: ml.Optimum, levels: tuple[ml.Level, ...]) -> str:
    text = f"a checkpoint every {format_duration(o.schedule.compute_s)} of compute"
    steps = [f"{v} {lower.name} then 1 {upper.name}" for lower, upper, v in
             zip(levels, levels[1:], o.schedule.counts, strict=False)]
    return text + (": " + "; ".join(steps) if steps else f" ({levels[0].name})")


_EPILOG = "\n".join(["\b", "Failure class presets:"] + [
    f"  {name:<8} {source}" for name, (source, _) in fc.CLASS_PRESETS.items()] + [
    "", "\b", "Example:",
    "  ckptbench levels --level memory:3s:30s:process --level peer:5s:90s:node \\",
    "      --level storage:60s:15min:job --failure-classes llama3 --gpus 16384",
    "", "See docs/cadence.md (multi-level cadence)."])


@click.command("levels", epilog=_EPILOG)
@click.option("--level", "level_texts", multiple=True, required=True,
              metavar="NAME:SAVE:RESTORE:SCOPE",
              help="A checkpoint level, cheapest first: blocking save and restore time (bare "
                   "number: seconds) and the widest failure scope its copy survives "
                   f"({', '.join(fc.SCOPES)}). Repeatable.")
@click.option("--failure-classes", "preset", metavar="PRESET",
              help=f"Failure classes with their scopes: {', '.join(fc.CLASS_PRESETS)}.")
@click.option("--failure-class", "class_texts", multiple=True, metavar="NAME:SCOPE:RATE[:UNIT]",
              help="A failure class: its scope, rate per unit-hour, unit gpu|host|job "
                   "(default gpu). Repeatable; adds to --failure-classes.")
@click.option("--gpus", type=int, required=True, help="GPUs of the job.")
@click.option("--gpus-per-node", type=int, default=8, show_default=True,
              help="GPUs per host, for per-host failure rates.")
@click.option("--schedule", "schedule_text", metavar="DUR[:V1,...]",
              help="A schedule to evaluate: compute between checkpoints (bare number: minutes) "
                   "and, per level below the top, its checkpoints before the next level's.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def levels_command(level_texts: tuple[str, ...], preset: str | None,
                   class_texts: tuple[str, ...], gpus: int, gpus_per_node: int,
                   schedule_text: str | None, as_json: bool) -> None:
    """Multi-level checkpoint cadence (LLNL SCR's model): the schedule that maximizes
    efficiency when cheap copies survive some failures and storage survives all."""
    parsed = [_level(t) for t in level_texts]
    levels = tuple(lv for lv, _ in parsed)
    classes = fc.classes_from(preset, [fc.parse_class(t) for t in class_texts])
    rates = fc.severity_rates([s for _, s in parsed], classes, gpus, gpus_per_node)
    named = _schedule(schedule_text, len(levels)) if schedule_text else None
    result = ml.answer(levels, rates, named)
    if as_json:
        click.echo(json.dumps({"gpus": gpus, **result.to_dict()}, indent=2))
        return
    for (level, scope), rate in zip(parsed, rates, strict=True):
        click.echo(f"{level.name:<10} save {format_duration(level.save_s):>8}  restore "
                   f"{format_duration(level.restore_s):>8}  survives {scope:<7}  "
                   f"{rate * 86400:8.3g} failures/day need it")
    best, alone = result.best, result.last_level_only
    click.echo(f"optimum: {_describe(best, levels)} -> efficiency {100 * best.efficiency:.2f} %")
    if len(levels) > 1:
        click.echo(f"{levels[-1].name} alone: every {format_duration(alone.schedule.compute_s)}"
                   f" -> efficiency {100 * alone.efficiency:.2f} %")
    if result.named is not None:
        click.echo(f"your schedule: {_describe(result.named, levels)} -> efficiency "
                   f"{100 * result.named.efficiency:.2f} %")


COMMANDS = [levels_command]
