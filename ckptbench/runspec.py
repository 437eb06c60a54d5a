"""Run options, declared once.

Each option of a measured run (`run`, `restore`, `sweep`, `mlperf`) is one
:class:`RunOption`: its name (the key of a ``[run]`` table and of the results file's
``run_options``), type, default, unit, help, group and the commands that take it. From that
one declaration the CLI generates its flags (grouped in ``--help``), a benchmark file's
``[run]`` table is checked, :func:`ckptbench.measure.build_request` turns the values into
the runner's options, and the results file records them, so ``run --replay`` can run the
same thing again.

Values resolve in one order: the declared default (per command), then the ``[run]`` table,
then what the command line gives. Every value passes :meth:`RunOption.parse`, so a ``[run]``
key and a flag get the same one-line errors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench.errors import SpecError
from ckptbench.fields import allowed, read_toml, shown
from ckptbench.formats import FORMATS
from ckptbench.jobmodel import MIN_SAMPLES
from ckptbench.mlperf import CHECKPOINTS
from ckptbench.payload import MODES as PAYLOADS
from ckptbench.runner.options import MODES
from ckptbench.runner.sequence import SEQUENCES
from ckptbench.runner.threads import MAX_INTRA_OP_THREADS
from ckptbench.runner.training import KERNELS
from ckptbench.spec import MAX_WORKLOAD_FILE_BYTES
from ckptbench.tierspec import DEFAULT_MEMORY_DIR, PLACEMENTS, TRANSPORTS
from ckptbench.units import format_size, parse_duration, parse_size

# Groups of --help, in the order printed.
GROUPS: dict[str, str] = {
    "workload": "Workload", "target": "Target", "io": "I/O", "restore": "Restore",
    "async": "Async and tiers", "output": "Output"}
COMMANDS = ("run", "restore", "sweep", "mlperf")
KINDS = ("str", "int", "float", "bool", "size", "duration", "choice", "ranks")
RESTORE_PLANS = ("dcp", "files")
LAUNCHERS = ("auto", "local", "mpi")
# Checkpoints one run saves and restores: far above what any benchmark needs (MLPerf's
# CLOSED runs take 10), so a typo (1000000000000) is refused, not started as a run of years.
MAX_ITERATIONS = 1_000_000
# tier option -> the workload's [tiers] key it overrides; together (no field each) they
# make RunOptions.tiers (ckptbench.tierspec.tiers_with_flags, in measure.build_request)
TIER_KEYS = {"tiers": "use", "memory_dir": "memory_dir", "memory_budget": "memory_budget",
             "peer_replicas": "peer_replicas", "peer_placement": "placement",
             "ranks_per_node": "ranks_per_node", "storage_every": "storage_every",
             "peer_transport": "peer_transport", "keep_tiers": "keep"}


@dataclass(frozen=True)
class RunOption:
    """One run option. `field`: the RunOptions field it sets ('loop.kernel' for the
    training loop's; '' when the request uses it otherwise). `request`: False for what
    only the command uses (where results go, how they print): not recorded. A bool
    option's flag switches it away from its default (`--no-restore`)."""

    name: str
    help: str
    group: str
    commands: tuple[str, ...] = ("run",)
    default: Any = None  # None: decided later (the workload's, the format's)
    kind: str = "str"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""  # bytes, s
    flag: str = ""  # default: --name-with-dashes
    field: str = ""
    per_command: tuple[tuple[str, Any], ...] = ()  # defaults that differ by command
    words: tuple[tuple[str, Any], ...] = ()  # words taken for a value ('off' -> 0.0)
    request: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.group not in GROUPS:
            raise ValueError(f"run option {self.name}: kind {self.kind!r}, group {self.group!r}")
        if not set(self.commands) <= set(COMMANDS):
            raise ValueError(f"run option {self.name}: commands {self.commands}")

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def default_for(self, command: str) -> Any:
        return dict(self.per_command).get(command, self.default)

    def shown_default(self, command: str) -> str | None:
        """The default as a user would type it, or None when there is none to show."""
        value = self.default_for(command)
        if value is None or self.kind == "bool":
            return None
        return format_size(value) if self.kind == "size" and isinstance(value, int) else str(value)

    def parse(self, value: Any, where: str) -> Any:
        """A value as typed, as a TOML table or a results file holds it -> the option's
        value (None: unset); `where` names it in the one-line error."""
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lower() in dict(self.words):
            return dict(self.words)[value.strip().lower()]
        rule = _RULES[self.kind](self)
        try:
            parsed = _PARSERS[self.kind](self, value, where)
        except SpecError:
            raise
        except (TypeError, ValueError):
            parsed = _BAD
        if parsed is _BAD:
            raise SpecError(f"{where} = {shown(value)} is not allowed; allowed: {rule}")
        return parsed


_BAD = object()


def _number(option: RunOption, value: Any, integer: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _BAD
    if integer and not isinstance(value, int):
        return _BAD
    if integer and not math.isfinite(value):
        return _BAD
    if option.minimum is not None and value < option.minimum:  # nan, inf: the user's checks
        return _BAD
    if option.maximum is not None and value > option.maximum:
        return _BAD
    return value


def _integer(option: RunOption, value: Any) -> Any:
    """An integer; as text too where the option also takes words (its flag is text)."""
    if isinstance(value, str) and option.words:
        text = value.strip()
        if not text.lstrip("+-").isdigit() or not text.isascii():
            return _BAD
        value = int(text)
    return _number(option, value, integer=True)


def _amount(option: RunOption, value: Any, where: str) -> Any:
    """A size or a duration: a number (bytes, seconds) or text with its unit."""
    if isinstance(value, str):
        return parse_size(value, where) if option.kind == "size" else float(
            parse_duration(value, where))
    parsed = _number(option, value, integer=option.kind == "size")
    return parsed if parsed is _BAD or option.kind == "size" else float(parsed)


def _ranks(value: Any) -> Any:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
        return list(value)
    return _BAD


_PARSERS: dict[str, Any] = {
    "str": lambda o, v, w: v if isinstance(v, str) else _BAD,
    "int": lambda o, v, w: _integer(o, v),
    "float": lambda o, v, w: _number(o, v, integer=False) if _number(o, v, False) is _BAD
    else float(v),
    "bool": lambda o, v, w: v if isinstance(v, bool) else _BAD,
    "size": _amount,
    "duration": _amount,
    "choice": lambda o, v, w: v if isinstance(v, str) and v in o.choices else _BAD,
    "ranks": lambda o, v, w: _ranks(v),
}


def _bound(value: float) -> str:
    """A bound as written in the rules: 1024, 3600, 1,000,000 (never 1e+06)."""
    return f"{value:,.0f}" if value >= 10_000 and float(value).is_integer() else f"{value:g}"


def _at_least(o: RunOption) -> str:
    return ("" if o.minimum is None else f", {_bound(o.minimum)} or more") + (
        "" if o.maximum is None else f", at most {_bound(o.maximum)}")


_RULES: dict[str, Any] = {
    "str": lambda o: "a string",
    "int": lambda o: "an integer" + _at_least(o) + "".join(f", or {w}" for w, _ in o.words),
    "float": lambda o: "a number" + _at_least(o),
    "bool": lambda o: "true or false",
    "size": lambda o: "a size (bytes, or e.g. '8MiB')" + "".join(f", {w}" for w, _ in o.words),
    "duration": lambda o: "a duration (seconds, or e.g. '30s', '10min')"
    + "".join(f", {w}" for w, _ in o.words),
    "choice": lambda o: allowed(o.choices),
    "ranks": lambda o: "plan ranks, e.g. '0-7' or '0,2,4' (or a list of integers)",
}

_COUNTS = {"sweep": MIN_SAMPLES, "mlperf": CHECKPOINTS}


def _options() -> tuple[RunOption, ...]:
    o = RunOption
    measured = ("run", "restore", "sweep", "mlperf")
    return (
        # workload
        o("scale", "Divide every model dimension by F (keeps the layout): for small machines.",
          "workload", ("run", "sweep", "mlperf"), 1, "int", minimum=1),
        o("ranks", "Run a subset of the plan's ranks, e.g. 0-7 (MLPerf subset mode).",
          "workload", ("run", "mlperf"), None, "ranks"),
        o("format", "raw: the plan's files; zarr: zarr v3 sharded arrays; torch-dcp: DCP's "
          "writer (needs torch); torch-save: DLIO's torch.save files.", "workload",
          ("run",), "raw", "choice", tuple(FORMATS), field="format"),
        o("codec", "zarr only: none, zstd[:level=N], lz4[:acceleration=N], blosc[:cname=C,"
          "clevel=N,shuffle=byte|bit|none]; any takes inner_chunks=N (inner chunks per shard).",
          "workload", ("run",), "none"),
        o("payload", "random: incompressible; realistic: values shaped like trained "
          "weights/moments.", "workload", ("run", "sweep"), "random", "choice", PAYLOADS,
          field="payload"),
        o("seed", "Payload seed (0 or more): the same seed writes the same bytes.",
          "workload", ("run",), 0, "int", minimum=0, field="seed"),
        # target
        o("target", "Where checkpoints go: a directory, file://..., s3://bucket/prefix, or an "
          "fsspec URL.", "target", ("run", "sweep", "mlperf"), "ckptbench-data"),
        o("keep", "Keep the checkpoints written (default: delete them).", "target",
          default=False, kind="bool", field="keep"),
        o("clean_debris", "Remove what interrupted runs left on the target (only the names "
          "each run recorded; without it, it is reported).", "target", default=False,
          kind="bool", field="clean_debris"),
        o("stall_timeout", "Fail the run when a rank moves no byte for this long while saving "
          "or restoring, or stays stopped (SIGSTOP) this long (e.g. 30s, 10min; off: never). "
          "Raise it for very slow storage.", "target", ("run", "restore"), "120s", "duration",
          unit="s", words=(("off", 0.0),), field="stall_timeout"),
        o("launcher", "auto: MPI ranks when started by mpirun/srun (needs mpi4py), else local "
          "processes.", "target", ("run", "restore", "sweep", "mlperf"), "auto", "choice", LAUNCHERS,
          request=False),
        # I/O
        o("iterations", "Checkpoints saved and restored (mlperf, CLOSED: 10; sweep: per point, "
          f"the job model's spread needs 5); at most {MAX_ITERATIONS:,}.", "io", measured, 1,
          "int", minimum=1, maximum=MAX_ITERATIONS, per_command=tuple(_COUNTS.items()),
          field="iterations"),
        o("threads", "I/O threads per rank [default: the workload's checkpoint.threads].",
          "io", ("run", "restore", "sweep"), None, "int", minimum=1),
        o("intra_op_threads", "torch's intra-op threads per rank process (torch.set_num_threads, "
          "OMP_NUM_THREADS), recorded per rank; auto: as torchrun, 1 when a node runs several "
          "processes, else the process's cores. raw and zarr ignore it.", "io",
          ("run", "restore"), "auto", "int", minimum=1, maximum=MAX_INTRA_OP_THREADS,
          words=(("auto", "auto"),)),
        o("block_size", "Bytes per write/read call.", "io", measured, "8MiB", "size",
          unit="bytes", field="block_size"),
        o("prefill", "Payload generated per rank before the clock starts (bounds memory).",
          "io", ("run",), "64MiB", "size", unit="bytes", field="prefill_bytes"),
        o("cache", "auto: evict the checkpoint from caches before restoring; none: read what "
          "the page cache holds (as DLIO does in one invocation).", "io", measured, "auto",
          "choice", ("auto", "none"), field="cache"),
        o("sequence", "interleaved: each checkpoint written and read in turn; "
          "writes-then-reads: all written, then read in that order (MLPerf v2.0; they are all "
          "on the target at once).", "io", ("run", "mlperf"), "interleaved", "choice",
          SEQUENCES, per_command=(("mlperf", "writes-then-reads"),), field="sequence"),
        # restore
        o("restore", "Measure saves only ([run] restore = false).", "restore",
          default=True, kind="bool", flag="--no-restore", field="restore"),
        o("verify", "Diagnostic (--format raw): restores read every byte without checking it; "
          "the results record them as unverified ([run] verify = false).", "restore", default=True,
          kind="bool", flag="--no-verify", field="verify"),
        o("restore_plan", "dcp: each rank of the restore layout reads what DCP's load planner "
          "gives it (replicas, resharding); files: each rank reads back its own files "
          "[default: dcp with --format raw or torch-dcp, else files].", "restore",
          ("run", "restore"), None, "choice", RESTORE_PLANS, per_command=(("restore", "dcp"),)),
        o("restore_world_size", "Restart on N ranks (the restore layout's world_size).",
          "restore", ("run", "restore"), None, "int", minimum=1),
        o("restore_layout", "Restore layout keys (world_size, tp, pp, dp_replicate, ep), e.g. "
          "world_size=6,tp=2 [default: the workload's [restore], else its [parallel]].",
          "restore", ("run", "restore")),
        o("restore_shift", "Rank r restores the files of rank r+N (IOR -C): no rank reads its "
          "own cache [default: 0; under MPI on several nodes the plan ranks per node].",
          "restore", ("run", "restore"), None, "int"),
        # async
        o("mode", "sync: save, then restore. async: a training loop checkpoints every "
          "--steps-per-checkpoint steps (ITERATIONS checkpoints): blocking snapshot, "
          "background persist, interference with the steps.", "async", default="sync",
          kind="choice", choices=MODES, field="mode"),
        o("step_seconds", "async: one training step's compute, calibrated on this machine.",
          "async", default=1.0, kind="float", unit="s", field="loop.step_seconds"),
        o("steps_per_checkpoint", "async: steps between checkpoints.", "async", default=10,
          kind="int", minimum=1, field="loop.steps_per_checkpoint"),
        o("staging_memory", "async: staging memory per process for the snapshot, e.g. 512MiB "
          "(state: as much as the state); less makes the loop wait for the pieces that do "
          "not fit.", "async", default="state", kind="size", unit="bytes",
          words=(("state", 0),), field="loop.staging_bytes"),
        o("step_kernel", "async: the step's work: memory (a STREAM triad), matmul; auto: "
          "matmul on a GPU, memory on the host.", "async", default="auto", kind="choice",
          choices=KERNELS, field="loop.kernel"),
        o("state_device", "async: where the state lives; cuda: torch CUDA tensors, pinned "
          "staging, device-to-host snapshots (auto: when torch has CUDA).", "async",
          default="auto", kind="choice", choices=("auto", "host", "cuda"), field="loop.device"),
        # recovery tiers (ckptbench.tierspec; unset: the workload's [tiers] key of the name)
        o("tiers", "Recovery tiers, e.g. memory,peer,storage: memory (a node-local copy in "
          "--memory-dir), peer (replicas on other nodes), storage (TARGET, every "
          "--storage-every-th checkpoint) [default: the workload's [tiers] use; none: storage "
          "alone].", "async"),
        o("memory_dir", "tiers: where the node-local copies live [default: the workload's, "
          f"else {DEFAULT_MEMORY_DIR}].", "async"),
        o("memory_budget", "tiers: host memory the copies may hold per node, e.g. 64GiB "
          "[default: what --memory-dir has free].", "async", kind="size", unit="bytes"),
        o("peer_replicas", "tiers: replicas of each node's copy on other nodes [default: 1].",
          "async", kind="int", minimum=1),
        o("peer_placement", "tiers: ring (node n -> n+1..n+k) or clique (groups of k+1 nodes) "
          "[default: ring].", "async", kind="choice", choices=PLACEMENTS),
        o("peer_transport", "tiers: how replicas travel: auto (MPI point-to-point under "
          "mpirun/srun, else TCP) or tcp (TCP sockets under any launcher) [default: auto].",
          "async", kind="choice", choices=TRANSPORTS),
        o("ranks_per_node", "tiers: processes per node (nodes emulated on one host) [default: "
          "0, the launcher's hosts].", "async", kind="int", minimum=0),
        o("storage_every", "tiers: save every N-th checkpoint to TARGET [default: 1].",
          "async", kind="int", minimum=1),
        o("keep_tiers", "tiers: leave the memory and peer copies when the run ends or dies, "
          "for `ckptbench relaunch RESULTS` (which restores from them and removes them).",
          "async", default=False, kind="bool"),
        # output
        o("results", "Results file (JSON Lines) [default: results/<workload>-<run id>.jsonl].",
          "output", ("run", "restore", "mlperf"), request=False),
        o("json", "Print the summary as JSON, alone on stdout (progress and banner: stderr).",
          "output", measured, False, "bool", request=False),
        o("wide", "Tables as wide as they need (logs, pipes read later), never split.",
          "output", default=False, kind="bool", request=False),
        o("width", "Fit tables in this many columns [default: the terminal's, 80 in a pipe].",
          "output", default=None, kind="int", minimum=40, request=False),
    )


OPTIONS: list[RunOption] = list(_options())  # a plugin or a test may append one


def declared(command: str) -> list[RunOption]:
    """The run options `command` takes, in declaration order."""
    return [o for o in OPTIONS if command in o.commands]


def option(name: str) -> RunOption:
    return next(o for o in OPTIONS if o.name == name)


def defaults(command: str) -> dict[str, Any]:
    """Every option of `command` at its declared default (parsed)."""
    return {o.name: o.parse(o.default_for(command), o.cli_flag) for o in declared(command)}


def resolve(command: str, table: Mapping[str, Any] | None = None, where: str = "[run]",
            given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`command`'s options: its defaults, then `table` (a [run] table, or the options a
    results file records; `where` names it in errors, e.g. 'bench.toml: [run]'), then
    `given` (option name -> value from the command line). A key no run option has, or one
    this command does not take, is one line naming it."""
    mine = {o.name: o for o in declared(command)}
    values = defaults(command)
    for key, value in (table or {}).items():
        label = f"{where} {key}"
        if key not in mine:
            known = {o.name for o in OPTIONS}
            why = (f"`ckptbench {command}` does not take it" if key in known else
                   "no such run option")
            raise SpecError(f"{label}: {why}; allowed: {allowed(sorted(mine))}")
        values[key] = mine[key].parse(value, label)
    for key, value in (given or {}).items():
        values[key] = mine[key].parse(value, mine[key].cli_flag)
    return values


def request_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The options a run request is made of (those the results file records)."""
    return {k: v for k, v in settings.items() if k not in _OUTPUT}


_OUTPUT = {o.name for o in OPTIONS if not o.request}


@dataclass(frozen=True)
class BenchmarkFile:
    """A TOML file's workload and [run] table. A file with [model] is the workload itself;
    a benchmark file holds `[run]` alone, with `workload = "path"` (relative to it); the
    workload file's own [run] keys apply under the benchmark file's."""

    workload: Path
    table: dict[str, Any]
    path: Path


def read_benchmark_file(path: str | Path, _chain: tuple[Path, ...] = ()) -> BenchmarkFile:
    """The workload and [run] table of a workload or benchmark file. A benchmark file
    that names itself, or a cycle of them (A -> B -> A), is one line naming the cycle."""
    path = Path(path)
    data = read_toml(path, MAX_WORKLOAD_FILE_BYTES, "a UTF-8 TOML workload file")
    table = data.get("run", {})
    if not isinstance(table, dict):
        raise SpecError(f"{path}: [run] must be a table")
    table = dict(table)
    workload = table.pop("workload", None)
    if "model" in data:
        if workload is not None:
            raise SpecError(f"{path}: [run] workload: not allowed in a workload file (it has "
                            "[model]); allowed: in a file that holds [run] alone")
        return BenchmarkFile(path, table, path)
    if not isinstance(workload, str) or not workload:
        raise SpecError(f"{path}: [run] workload = {shown(workload)}: a file without [model] "
                        "is a benchmark file; allowed: [run] workload = \"path/to/workload.toml\"")
    extra = sorted(set(data) - {"run"})
    if extra:
        raise SpecError(f"{path}: unknown table [{extra[0]}]; allowed in a benchmark file: [run]")
    chain = (*_chain, path)
    named = path.parent / workload
    if any(_same_file(named, seen) for seen in chain):
        cycle = " -> ".join(os.path.normpath(p) for p in (*chain, named))
        raise SpecError(f"{chain[0]}: [run] workload makes a cycle of benchmark files: "
                        f"{cycle}; allowed: a workload file (with [model])")
    if _chain:  # a benchmark file named by one: refused there, without reading on
        return BenchmarkFile(named, table, path)
    inner = read_benchmark_file(named, chain)
    if inner.path != inner.workload:
        raise SpecError(f"{path}: [run] workload = {workload!r} is a benchmark file too; "
                        "allowed: a workload file (with [model])")
    return BenchmarkFile(inner.workload, {**inner.table, **table}, path)


def _same_file(a: Path, b: Path) -> bool:
    """`a` and `b` are one file (through links too), or the same name when either is gone."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
