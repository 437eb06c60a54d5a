"""The ``torch-dcp`` format: the plan's chunks as real torch tensors, saved by DCP itself.

Optional (``pip install 'ckptbench[torch]'``): torch is imported only here, only when the
format is chosen. Each process materializes its plan ranks' chunks as CPU tensors of the
true dtype (bfloat16 included) holding exactly the raw format's bytes, gives each state-
dict key to DCP as an object that reports those chunks (global shape, offsets, sizes:
DCP's ``__create_write_items__`` / ``__create_chunk_list__`` / ``__get_tensor_shard__``
protocol, the one DTensor implements), and calls ``torch.distributed.checkpoint.save``
with DCP's own writer: ``FileSystemWriter`` for a directory (``sync_files=True``: fsync
inside the timer, ``thread_count`` = ``--threads``), ``FsspecWriter`` for any other URL
(``s3://`` through s3fs, with the run's endpoint). Several processes form a gloo process
group (a TCPStore that process 0 opens on a free port), so DCP plans, dedups and writes
its ``.metadata`` as in training. DCP's files go to ``<checkpoint>/dcp/`` because DCP's
``.metadata`` and ckptbench's manifest share a name.

What DCP is handed is what a trainer hands it: with one plan rank per process (the DCP
family), the rank's **whole** local plan -- its piece of every key of its stage,
replicated pieces (HSDP replicas, TP-replicated norms, ``step`` scalars) and empty ones
included -- in ``get_state_dict``'s nesting (``{"model": ..., "optim": {"state": ...,
"param_groups": [...]}}``, AdamW's 12 param_group entries last) and DCP's default save
planner (``flatten_state_dict=True``, as torchtitan's), so DCP's coordinator receives
every copy and its own ``dedup_save_plans`` picks each writer. The pieces the plan gives
another rank are handed as meta tensors (shape and dtype, no bytes): DCP never reads an
item it did not keep, and if its dedup keeps one the plan gives another rank, the save
fails naming it (the plan's writers are DCP's; docs/formats.md). A process running
several plan ranks (MPI with fewer processes) hands DCP the chunks its ranks write, as
the plan deduplicated them.

Timing: one op per process, ``dcp_save`` (planning collectives, writes, fsync, DCP's
metadata commit); its bytes are the plan's tensor bytes of the process's ranks. On
restore, ``dcp_load`` by every rank of the restore layout into its pieces there
(:mod:`ckptbench.formats.dcp_load`); with ``--restore-plan files`` by every process into
fresh tensors of the chunks it wrote. Digests are checked after the load (outside the
op). The whole state is generated in memory before the clock starts, as it would sit in
a trainer (``--prefill`` does not bound it). Runs must cover every plan rank: DCP refuses a
global plan whose chunks do not cover each tensor.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, ClassVar

import numpy as np

from ckptbench.backends import Backend
from ckptbench.backends.s3.options import S3Options
from ckptbench.backends.s3.transport import DCP_STORAGE
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.formats.base import (
    FileJob,
    FormatBase,
    FormatOptions,
    Group,
    PlannedRestore,
    ThreadResult,
    from_root,
    now,
)
from ckptbench.formats.codecs import CodecSpec
from ckptbench.formats.common import (
    NP_DTYPES,
    ChunkTask,
    check_tiling,
    checkpoint_of,
    chunk_bytes,
    chunk_tasks,
)
from ckptbench.formats.dcp_load import (
    MetadataGuard,
    TimedReader,
    allocate_pieces,
    check_load_processes,
    load_group,
    verify_pieces,
)
from ckptbench.formats.dcp_s3 import s3torch_storage
from ckptbench.formats.manifest import Manifest
from ckptbench.formats.verify import describe_difference, object_digest
from ckptbench.payload import digest
from ckptbench.plan import Plan
from ckptbench.plan.restore import held_pieces, restore_pieces, restore_plan_of
from ckptbench.plan.state import PARAM_GROUP_ITEMS

DCP_DIR = "dcp"
DCP_METADATA = f"{DCP_DIR}/.metadata"
# AdamW's param_group entries (torch 2.15's defaults) but `params`, which
# get_state_dict saves as the parameters' FQNs: non-tensor items every rank's plan ends
# with (plan.state.PARAM_GROUP_ITEMS; DCP's dedup weighs each 1).
ADAMW_GROUP: dict[str, Any] = {
    "lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.01, "amsgrad": False,
    "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
    "fused": None, "decoupled_weight_decay": True}


def _import_torch() -> Any:
    try:
        import torch
        import torch.distributed.checkpoint
    except ImportError as exc:
        raise SpecError(f"--format torch-dcp needs torch ({exc}); install it with "
                        "pip install 'ckptbench[torch]'; allowed without it: --format raw, zarr"
                        ) from None
    return torch


def check_plan(plan: Plan, ranks: list[int]) -> None:
    """Refuse, in one line, what DCP cannot save: no torch, a rank subset, overlaps."""
    _import_torch()
    if sorted(ranks) != list(range(plan.world_size)):
        raise SpecError("--format torch-dcp saves the whole plan (DCP checks that the chunks "
                        "cover every tensor); allowed: all ranks, no --ranks subset")
    check_tiling(plan, "torch-dcp")


def _torch_dtype(torch: Any, name: str) -> Any:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


class PlannedChunks:
    """One state-dict key as DCP sees a sharded tensor: this process's chunks of it."""

    def __init__(self, global_shape: tuple[int, ...], chunks: list[tuple[tuple[int, ...], Any]]
                 ) -> None:
        self.global_shape = global_shape
        self.chunks = chunks  # (offsets, local tensor)

    def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
        import torch
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata,
            MetadataIndex,
            TensorProperties,
        )
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        return [WriteItem(index=MetadataIndex(fqn, torch.Size(off)), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.size()),
                              properties=TensorProperties.create_from_tensor(t),
                              size=torch.Size(self.global_shape)))
                for off, t in self.chunks]

    def __create_chunk_list__(self) -> list[Any]:
        import torch
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=torch.Size(off), sizes=t.size())
                for off, t in self.chunks]

    def __get_tensor_shard__(self, index: Any) -> Any:
        found = None
        if index.index is not None and index.index < len(self.chunks) \
                and tuple(self.chunks[index.index][0]) == tuple(index.offset or ()):
            found = self.chunks[index.index][1]
        for off, t in self.chunks if found is None else ():
            if tuple(off) == tuple(index.offset or ()):
                found = t
                break
        if found is None:
            raise ValueError(f"{index.fqn}: no local chunk at offset {index.offset}")
        if found.is_meta:  # held here, but the plan has another rank write it
            raise CkptbenchError(
                f"{index.fqn} at offsets {list(index.offset or ())}: DCP's dedup_save_plans "
                "kept it on this rank, the plan on another (plan.dedup follows torch 2.15's "
                "rule; docs/formats.md)")
        return found


def _planners() -> tuple[Any, Any]:
    """DCP's default planners, looking chunks up through PlannedChunks (DCP's own extension
    points: lookup_object / lookup_tensor)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner

    class SavePlanner(DefaultSavePlanner):  # type: ignore[misc]
        def lookup_object(self, index: Any) -> Any:
            obj = self.state_dict[index.fqn]
            if isinstance(obj, PlannedChunks):
                return obj.__get_tensor_shard__(index)
            return super().lookup_object(index)  # param_group entries

    class LoadPlanner(DefaultLoadPlanner):  # type: ignore[misc]
        def set_up_planner(self, state_dict: Any, metadata: Any = None,
                           is_coordinator: bool = False) -> None:
            # DefaultLoadPlanner first maps every state-dict value through a helper that
            # keeps only tensor types (anything else becomes None); nothing to flatten here.
            self.original_state_dict = state_dict
            self.state_dict = state_dict
            self.metadata = metadata
            self.is_coordinator = is_coordinator

        def lookup_tensor(self, index: Any) -> Any:
            return self.state_dict[index.fqn].__get_tensor_shard__(index)

    # The save planner as dcp.save makes it when given none (torchtitan's too): the state
    # dict, nested as get_state_dict's, flattened to the keys the plan names.
    return (SavePlanner(),
            LoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False))


def _nest(state: dict[str, Any], name: str, value: Any) -> None:
    """Put flattened key `name` where get_state_dict's ``{"model": {fqn: ...}, "optim":
    {"state": {fqn: {entry: ...}}}}`` holds it, so that DCP's flattening gives `name`
    back (and its ``.metadata`` the same mapping); other names stay flat. Strings are
    shared as a trainer's state dicts share them (the ``.metadata`` pickle memoizes by
    object): an optimizer entry's name (``exp_avg``) is one string everywhere, a
    parameter's FQN one string in the optimizer state and another in the model's."""
    if name.startswith("model."):
        state.setdefault("model", {})[name[len("model."):]] = value
    elif name.startswith("optim.state.") and name.count(".") >= 3:
        fqn, entry = name[len("optim.state."):].rsplit(".", 1)
        params = state.setdefault("optim", {}).setdefault("state", {})
        params.setdefault(fqn, {})[sys.intern(entry)] = value
    else:
        state[name] = value


class TorchDcpFormat(FormatBase):
    """The Format contract (save, restore, cache_keys) through DCP's own writer and reader."""

    name: ClassVar[str] = "torch-dcp"
    streams_progress: ClassVar[bool] = False  # one op per phase: not watched for stalls
    own_storage: ClassVar[bool] = True
    commits_itself: ClassVar[bool] = True  # dcp.save writes .metadata: its commit

    @classmethod
    def check(cls, plan: Plan, ranks: list[int], codec: CodecSpec) -> None:
        super().check(plan, ranks, codec)
        check_plan(plan, ranks)

    @classmethod
    def memory_bytes(cls, plan: Plan, ranks: list[int], options: FormatOptions,
                     alignment: int) -> int:
        """The ranks' whole state sits in memory, as in a trainer (--prefill does not bound
        it); on restore a rank's pieces (at most the saved chunks it reads)."""
        restore = int(restore_plan_of(plan).rank_bytes().max(initial=0))
        return (super().memory_bytes(plan, ranks, options, alignment)
                + max(plan.bytes_of_ranks(ranks), restore))

    @classmethod
    def check_restore(cls, plan: Plan, groups: list[list[int]], shift: int) -> None:
        check_load_processes(plan, groups, shift)

    def __init__(self, plan: Plan, ranks: list[int], backend: Backend, group: Group,
                 options: FormatOptions, progress: Any = None) -> None:
        super().__init__(plan, ranks, backend, group, options, progress)
        self.torch = _import_torch()
        self._pg_ready = False
        self._load_groups: dict[tuple[int, ...], Any] = {}

    # --- where DCP writes ---
    def _url(self, ckpt: str) -> tuple[str, dict[str, Any]]:
        """DCP's checkpoint path (a local path or an fsspec URL) and fsspec options."""
        root = self.backend.local_dir
        if root is not None:
            return str(root / ckpt / DCP_DIR), {}
        url = f"{self.backend.target.rstrip('/')}/{ckpt}/{DCP_DIR}"
        opts: dict[str, Any] = {}
        if url.startswith("s3://"):
            endpoint = (self.backend.endpoint_url
                        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
            if endpoint:
                opts["client_kwargs"] = {"endpoint_url": endpoint}
        return url, opts

    def _s3torchconnector(self) -> bool:
        """DCP's S3 storage from s3torchconnector (--s3-transport s3torchconnector)."""
        return isinstance(o := self.backend.options, S3Options) and o.transport == DCP_STORAGE

    def _writer(self, ckpt: str) -> Any:
        import torch.distributed.checkpoint as dcp

        if self._s3torchconnector():
            return s3torch_storage(self.backend, self._url(ckpt)[0], writer=True,
                                   threads=self.nthreads)
        path, opts = self._url(ckpt)
        if not opts and not path.count("://"):
            return dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True,
                                        thread_count=self.nthreads)
        return dcp.FsspecWriter(path, single_file_per_rank=True, sync_files=True,
                                thread_count=self.nthreads, **opts)

    def _reader(self, ckpt: str) -> Any:
        import torch.distributed.checkpoint as dcp

        if self._s3torchconnector():
            return s3torch_storage(self.backend, self._url(ckpt)[0], writer=False,
                                   threads=self.nthreads)
        path, opts = self._url(ckpt)
        if not opts and not path.count("://"):
            return dcp.FileSystemReader(path)
        return dcp.FsspecReader(path, **opts)

    def _process_group(self) -> None:
        """A gloo group over the run's processes (collective, once)."""
        if self._pg_ready or self.group.size == 1:
            return
        import torch.distributed as dist

        hosts = self.group.gather(self.group.host())
        store, address = None, None
        if self.group.rank == 0:
            assert hosts is not None
            host = "127.0.0.1" if len(set(hosts)) == 1 else self.group.host()
            store = dist.TCPStore(host, 0, self.group.size, is_master=True, wait_for_workers=False)
            address = (host, store.port)
        address = from_root(self.group, address)
        if store is None:
            store = dist.TCPStore(address[0], address[1], self.group.size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=self.group.rank,
                                world_size=self.group.size)
        self._pg_ready = True

    def _load_group(self, hosting: bool, problem: BaseException | None) -> tuple[Any, bool]:
        return load_group(self.group, hosting, problem, self._process_group, self._load_groups)

    @classmethod
    def written_names(cls, plan: Plan, groups: list[list[int]],
                      options: FormatOptions) -> list[str]:
        """DCP's files: process p writes ``__p_k.distcp`` for each of its writer threads
        (--threads per plan rank), process 0 the ``.metadata`` (through ``.metadata.tmp``)."""
        del plan
        names = [f"{DCP_DIR}/.metadata", f"{DCP_DIR}/.metadata.tmp"]
        for p, group in enumerate(groups):
            threads = max(1, options.threads) * max(1, len(group))
            names += [f"{DCP_DIR}/__{p}_{k}.distcp" for k in range(threads)]
        return names

    def cache_keys(self, jobs: list[FileJob]) -> list[str]:
        if not jobs:
            return []
        ckpt = checkpoint_of(self.plan, jobs, "torch-dcp")
        keys = [f"{ckpt}/{DCP_DIR}/__{self.group.rank}_{k}.distcp" for k in range(self.nthreads)]
        return keys + ([f"{ckpt}/{DCP_DIR}/.metadata"] if self.group.rank == 0 else [])

    # --- tensors ---
    def _state_dict(self, tasks: list[ChunkTask], fill: bool) -> tuple[dict[str, Any], list[Any]]:
        torch = self.torch
        by_key: dict[int, list[tuple[tuple[int, ...], Any]]] = {}
        arrays = []
        for t in tasks:
            key = self.plan.keys[t.key]
            if fill:
                data, d = chunk_bytes(self.gen, t, NP_DTYPES[key.dtype])
                if not data.flags.c_contiguous:  # (np.ascontiguousarray makes a 0-d array 1-d)
                    data = data.copy()
            else:
                data, d = np.empty(t.sizes, dtype=NP_DTYPES[key.dtype]), 0
            tensor = torch.from_numpy(data).view(_torch_dtype(torch, key.dtype))
            by_key.setdefault(t.key, []).append((t.offsets, tensor))
            arrays.append((t, data, d))
        state = {self.plan.keys[k].name: PlannedChunks(self.plan.keys[k].global_shape, chunks)
                 for k, chunks in by_key.items()}
        return state, arrays

    # --- save ---
    def _save_state(self, tasks: list[ChunkTask]) -> tuple[dict[str, Any], list[Any]]:
        """The state dict dcp.save gets, as a trainer's get_state_dict gives it: this
        process's pieces of every key (the chunks its ranks write, filled; with one plan
        rank of the DCP family, also the pieces it holds that another rank writes, as meta
        tensors, and its empty pieces), nested by key name, AdamW's param_group last."""
        torch, plan = self.torch, self.plan
        arrays = []
        tensors: dict[tuple[int, tuple[int, ...]], Any] = {}
        for t in tasks:
            key = plan.keys[t.key]
            data, d = chunk_bytes(self.gen, t, NP_DTYPES[key.dtype])
            if not data.flags.c_contiguous:  # (np.ascontiguousarray makes a 0-d array 1-d)
                data = data.copy()
            tensors[(t.key, t.offsets)] = torch.from_numpy(data).view(_torch_dtype(torch,
                                                                                   key.dtype))
            arrays.append((t, data, d))
        dtensor = plan.workload.parallel.layout != "megatron-deepspeed"
        if len(self.ranks) == 1 and dtensor:
            pieces = held_pieces(plan, self.ranks[0])
        else:
            pieces = sorted((t.key, t.offsets, t.sizes) for t in tasks)
        by_key: dict[int, list[tuple[tuple[int, ...], Any]]] = {}
        for k, off, sizes in pieces:
            tensor = tensors.get((k, off))
            if tensor is None:  # written by another rank (meta: no bytes), or empty
                tensor = torch.empty(sizes, dtype=_torch_dtype(torch, plan.keys[k].dtype),
                                     device="meta" if math.prod(sizes) else "cpu")
            by_key.setdefault(k, []).append((off, tensor))
        state: dict[str, Any] = {}
        fqns: list[str] = []
        for k, chunks in by_key.items():
            key = plan.keys[k]
            _nest(state, key.name, PlannedChunks(key.global_shape, chunks))
            if key.name.startswith("model."):
                fqns.append(key.name[len("model."):])
        if dtensor and plan.workload.state.optimizer == "adamw":
            group = {name: ADAMW_GROUP.get(name) for name in PARAM_GROUP_ITEMS}
            group["params"] = fqns
            state.setdefault("optim", {})["param_groups"] = [group]
        return state, arrays

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        import torch.distributed.checkpoint as dcp

        ckpt = checkpoint_of(self.plan, jobs, "torch-dcp")
        tasks = chunk_tasks(self.plan, jobs)
        state, arrays = self._save_state(tasks)
        self._process_group()
        writer = self._writer(ckpt)
        planner, _ = _planners()
        res = ThreadResult()
        total = sum(t.nbytes for t in tasks)
        self.group.barrier()
        t0 = now()
        try:
            with warnings.catch_warnings():  # object stores: the completed PUT is the sync
                warnings.filterwarnings("ignore", message="fsync not supported")
                dcp.save(state, storage_writer=writer, planner=planner)
        except BaseException as exc:
            res.error = exc
        t1 = now()
        res.op("dcp_save", jobs[0].index, total, t0, t1, {"object": f"{DCP_DIR}/"})
        self.progress(total)
        digests: dict[int, list[int]] = {job.index: [0] * len(job.regions) for job in jobs}
        for t, _data, d in arrays:
            digests[t.job.index][t.region] = d
        res.digests = digests
        if res.error is None and self.group.rank == 0:  # DCP's index, verified at restore
            try:
                res.objects = {DCP_METADATA: object_digest(
                    self.backend.get(f"{ckpt}/{DCP_METADATA}"))}
            except BaseException as exc:  # reported to the group
                res.error = exc
        return [res]

    def _check_metadata(self, ckpt: str, manifest: Manifest) -> None:
        """DCP's .metadata (the index a loader follows: dtypes, shapes, where each chunk
        lies) must be the one written."""
        key = f"{ckpt}/{DCP_METADATA}"
        try:
            data: bytes | None = self.backend.get(key)
        except FileNotFoundError:
            data = None
        manifest.check_object(DCP_METADATA, key, data)

    def _open_checkpoint(self, ckpt: str, manifest_key: str, jobs: list[FileJob]
                         ) -> tuple[Manifest, tuple[int, int]]:
        """The manifest, and DCP's .metadata checked by process 0; every process raises the
        first failure together, before DCP's collective load, so none waits in it for a
        process that gave up."""
        manifest = Manifest(manifest_key, {})
        span = (0, 0)
        problem: BaseException | None = None
        try:
            manifest, span = self.read_manifest(manifest_key, jobs)
            if self.group.rank == 0:
                self._check_metadata(ckpt, manifest)
        except BaseException as exc:  # agreed on below
            problem = exc
        problems = self.group.gather(problem)
        problem = self.group.bcast(next((p for p in problems or [] if p is not None), None))
        if problem is not None:
            raise problem
        return manifest, span

    # --- restore ---
    def restore_files(self, jobs: list[FileJob], manifest_key: str
                      ) -> tuple[list[ThreadResult], tuple[int, int]]:
        import torch.distributed.checkpoint as dcp

        self.group.barrier()
        ckpt = checkpoint_of(self.plan, jobs, "torch-dcp")
        manifest, (t0, t1) = self._open_checkpoint(ckpt, manifest_key, jobs)
        expected = manifest.files
        tasks = chunk_tasks(self.plan, jobs)
        state, arrays = self._state_dict(tasks, fill=False)
        _, planner = _planners()
        res = ThreadResult()
        total = sum(t.nbytes for t in tasks)
        guard = MetadataGuard(self._reader(ckpt))  # .metadata unpickled by the allow-list
        a = now()
        try:
            with warnings.catch_warnings():  # each process loads alone here, by design
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, storage_reader=guard.reader, planner=planner)
        except BaseException as exc:
            res.error = exc
        b = now()
        if guard.refused is not None:  # whatever DCP made of it: the one-line refusal
            res.error = guard.refused
        res.op("dcp_load", jobs[0].index, total, a, b, {"object": f"{DCP_DIR}/"})
        self.progress(total)
        if res.error is None:
            for t, data, _ in arrays:
                got = data.reshape(-1).view(np.uint8)
                if digest(got) != expected[t.job.name]["digests"][t.region]:
                    want, _ = chunk_bytes(self.gen, t, data.dtype)
                    res.mismatches.append(
                        f"chunk {self.plan.keys[t.key].name} at offsets {list(t.offsets)} "
                        f"(DCP {ckpt}/{DCP_DIR}): "
                        + describe_difference(got, np.ascontiguousarray(want).reshape(-1).view(np.uint8)))
        return [res], (t0, t1)

    # --- restore onto the restore layout (ckptbench.formats.dcp_load) ---
    def restore_planned(self, jobs: list[FileJob], manifest_key: str,
                        planned: PlannedRestore) -> list[ThreadResult]:
        """dcp.load by the restore rank this process hosts (if any), into its pieces of the
        restore layout; `jobs`: the saved chunks the plan says it reads (verified). No
        fill-ins: a torch-dcp run saves every rank."""
        import torch.distributed.checkpoint as dcp

        ranks = planned.ranks
        if len(ranks) > 1:
            raise SpecError(f"--format torch-dcp: {len(ranks)} restore ranks in one process; "
                            "allowed: one (DCP loads one rank per process)")
        ckpt = manifest_key[: len(manifest_key) - len(self.plan.manifest) - 1]
        self.group.barrier()  # the eviction's gather is over on process 0
        manifest, _ = self._open_checkpoint(ckpt, manifest_key, jobs)  # off the clock
        res = ThreadResult()
        held: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        state: dict[str, Any] = {}
        problem: BaseException | None = None
        try:
            if ranks:
                held = allocate_pieces(self.plan, restore_pieces(restore_plan_of(self.plan),
                                                                 ranks[0]))
            keys, torch = self.plan.keys, self.torch
            state = {keys[k].name: PlannedChunks(keys[k].global_shape, [(off, torch.from_numpy(
                a).view(_torch_dtype(torch, keys[k].dtype)))]) for k, (off, a) in held.items()}
        except BaseException as exc:  # agreed on in _load_group
            problem = exc
        group, no_dist = self._load_group(bool(ranks), problem)
        _, planner = _planners()
        self.group.barrier()
        if not ranks:
            return [res]
        reader = TimedReader(self._reader(ckpt))
        a = now()
        try:
            dcp.load(state, storage_reader=reader.reader, planner=planner,
                     process_group=group, no_dist=no_dist)
        except BaseException as exc:
            res.error = exc
        b = now()
        reader.count()
        res.op("dcp_load", jobs[0].index if jobs else 0, reader.read_bytes, a, b,
               {"object": f"{DCP_DIR}/", **reader.extra(a, b)}, rank=ranks[0])
        self.progress(reader.read_bytes)
        if res.error is None:
            res.mismatches = verify_pieces(self.plan, self.gen, jobs, held, manifest.files,
                                           f"DCP {ckpt}/{DCP_DIR}")
        return [res]
