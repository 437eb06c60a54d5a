"""DCP's .metadata is unpickled with an allow-list (ckptbench/formats/safe_unpickle.py): a
checkpoint from elsewhere cannot run code on restore, even with its manifest's digest
rewritten to match. The allow-list and its refusals are tested without torch; a real
torch-dcp checkpoint, restored and then tampered with, with torch (the ``torch`` extra)."""

from __future__ import annotations

import builtins
import collections
import io
import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path, PosixPath
from typing import Any

import pytest

from ckptbench.formats.safe_unpickle import (
    ALLOWED,
    UnsafePickle,
    allowed,
    loads_metadata,
)

SOURCE = "/ckpt/checkpoint-1/dcp/.metadata"


class Calls:
    """An object whose pickle calls `fn(*args)` on load (what an attacker writes)."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def _global(module: str, name: str, protocol: int = 4) -> bytes:
    """A pickle that loads global `module`.`name` by those strings (no import here)."""
    if protocol < 4:  # GLOBAL: module and name on lines of their own
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n."
    def text(s: str) -> bytes:
        b = s.encode()
        return b"\x8c" + bytes([len(b)]) + b  # SHORT_BINUNICODE
    return b"\x80\x04" + text(module) + text(name) + b"\x93."  # STACK_GLOBAL


def _attacks(marker: Path) -> dict[str, bytes]:
    """Pickles that create `marker` when unpickled with pickle.load."""
    touch = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": pickle.dumps(Calls(os.system, touch)),
        "builtins.exec": pickle.dumps(Calls(builtins.exec, code)),
        "builtins.eval": pickle.dumps(Calls(builtins.eval, code)),
        "subprocess.Popen": pickle.dumps(Calls(subprocess.Popen, ["touch", str(marker)])),
        "subprocess.call": pickle.dumps(Calls(subprocess.call, ["touch", str(marker)])),
        # inside an allowed container, at protocol 2 and at protocol 0 (GLOBAL opcode)
        "nested": pickle.dumps(collections.OrderedDict(a=[1, Calls(os.system, touch)]),
                               protocol=2),
        "protocol 0": pickle.dumps(Calls(os.system, touch), protocol=0),
    }


def _check_refused(data: bytes, marker: Path, names: str) -> str:
    with pytest.raises(UnsafePickle) as err:
        loads_metadata(data, SOURCE)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{SOURCE}: refused to load ")
    assert names in msg
    assert not marker.exists()
    return msg


@pytest.mark.parametrize("attack", sorted(_attacks(Path("/nonexistent"))))
def test_a_pickle_that_calls_anything_off_the_list_is_refused_and_nothing_runs(
        attack: str, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    data = _attacks(marker)[attack]
    # the pickle does run code when loaded without the allow-list (checked on a copy of
    # the marker's name, so the refusal below is what keeps it from running)
    if attack in ("os.system", "builtins.exec"):
        probe = tmp_path / "probe"
        pickle.loads(_attacks(probe)[attack])
        assert probe.exists()
    module, _, name = {"nested": "os.system", "protocol 0": "os.system"}.get(
        attack, attack).rpartition(".")
    module = {"os": os.system.__module__}.get(module, module)  # posix.system on Linux
    _check_refused(data, marker, f"{module}.{name}")


@pytest.mark.parametrize(("module", "name"), [
    ("os", "system"), ("posix", "system"), ("builtins", "exec"), ("builtins", "eval"),
    ("builtins", "getattr"), ("builtins", "__import__"), ("subprocess", "Popen"),
    ("importlib", "import_module"), ("torch", "load"), ("torch", "save"),
    ("torch.serialization", "load"), ("torch._utils", "_rebuild_tensor_v2"),
    ("torch.distributed.checkpoint.metadata", "torch"),
    # dotted names, which pickle follows with getattr, out of an allowed module or class
    ("pathlib", "os.system"), ("collections", "OrderedDict.fromkeys"),
    ("torch.distributed.checkpoint.metadata", "Metadata.__init__.__globals__"),
    ("torch._utils", "torch.load"), ("torch", "Size.__class__"),
])
def test_refused_globals(module: str, name: str, tmp_path: Path) -> None:
    assert not allowed(module, name)
    for protocol in (0, 4):
        _check_refused(_global(module, name, protocol), tmp_path / "none", f"{module}.{name}")


def test_the_allow_list_is_dcps_metadata_classes_and_torch_values() -> None:
    md = "torch.distributed.checkpoint.metadata"
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING"):
        assert allowed(md, name)
    for module, name in [("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                         ("torch", "Size"), ("torch", "float32"), ("torch", "bfloat16"),
                         ("torch", "float16"), ("torch.serialization", "_get_layout"),
                         ("torch._utils", "torch.channels_last"),
                         ("collections", "OrderedDict"), ("pathlib", "PosixPath")]:
        assert allowed(module, name)
    # no builtins, no module of anything that runs code, no dotted names
    assert set(ALLOWED) == {md, "torch.distributed.checkpoint.filesystem", "torch",
                            "torch.serialization", "torch._utils", "collections", "pathlib",
                            "pathlib._local"}
    assert all("." not in n for m, names in ALLOWED.items() if m != "torch._utils"
               for n in names)


def test_an_allowed_structure_loads() -> None:
    value = collections.OrderedDict(
        state={"model.w": [0, (1, 2), None, True, 1.5, "s", b"b"]},
        path=PosixPath("/ckpt/checkpoint-1/dcp"), modules=["a", "b"], nested={"k": {3, 4}})
    for protocol in (4, 5):  # DCP's pickle.dump: the default protocol (4; 5 from Python 3.14)
        data = pickle.dumps(value, protocol=protocol)
        assert loads_metadata(data, SOURCE) == value
    # protocol 2 pickles bytes and sets through globals (_codecs.encode, builtins.set):
    # not what DCP writes, refused
    with pytest.raises(UnsafePickle, match=r"refused to load _codecs\.encode"):
        loads_metadata(pickle.dumps(value, protocol=2), SOURCE)


def test_an_allowed_name_is_resolved_not_refused() -> None:
    """A torch name on the list gets past the allow-list (without torch it then cannot be
    imported: one line, not a refusal; with torch it is the real class)."""
    data = _global("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata")
    try:
        got = loads_metadata(data, SOURCE)
    except UnsafePickle as exc:
        assert "refused" not in str(exc) and "\n" not in str(exc)
        assert "torch" in str(exc)
    else:
        assert got.__name__ == "ChunkStorageMetadata"


def test_malformed_pickles_fail_in_one_line() -> None:
    for data in (b"", b"\x80\x04garbage", pickle.dumps([1, 2])[:-3], b"Pid\n."):
        with pytest.raises(UnsafePickle) as err:
            loads_metadata(data, SOURCE)
        assert str(err.value).startswith(SOURCE) and "\n" not in str(err.value)


def test_a_name_with_a_newline_is_shown_on_one_line(tmp_path: Path) -> None:
    _check_refused(_global("os\nx", "system\nrm -rf"), tmp_path / "none", "os\\nx.system\\nrm")


# --- with torch: DCP's reader and a real checkpoint ---

@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch-dcp checkpoint of the tiny workload, kept: its checkpoint directory."""
    pytest.importorskip("torch", reason="the torch extra (pip install 'ckptbench[torch]')")
    from .conftest import TINY, ckptbench

    root = tmp_path_factory.mktemp("kept")
    r = ckptbench("run", str(TINY), "--format", "torch-dcp", "--target", str(root / "t"),
                  "--keep", "--results", str(root / "save.jsonl"))
    assert r.returncode == 0, r.stderr
    (ckpt,) = (root / "t").glob("run-*/checkpoint-*")
    return ckpt


def _copy(kept: Path, dest: Path) -> tuple[Path, Path]:
    """A copy of the kept checkpoint's run under `dest`; (its checkpoint, DCP's .metadata)."""
    run = kept.parent
    shutil.copytree(run.parent, dest / "t", symlinks=True)
    ckpt = dest / "t" / run.name / kept.name
    return ckpt, ckpt / "dcp" / ".metadata"


def _tamper(ckpt: Path, data: bytes) -> None:
    """Replace DCP's .metadata with `data` and rewrite its digest in ckptbench's manifest
    (the same size, as ckptbench pads it), as whoever can write the checkpoint can."""
    from ckptbench.formats.manifest_encoding import encode_manifest
    from ckptbench.formats.verify import object_digest

    (ckpt / "dcp" / ".metadata").write_bytes(data)
    raw = (ckpt / ".metadata").read_bytes()
    manifest = json.loads(raw.split(b"\n", 1)[0])
    manifest["objects"]["dcp/.metadata"] = object_digest(data)
    (ckpt / ".metadata").write_bytes(encode_manifest(manifest, len(raw)))


def _restore(ckpt: Path, results: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    from .conftest import ckptbench

    return ckptbench("restore", str(ckpt), "--results", str(results), *extra)


def test_every_global_of_a_real_metadata_is_allowed(kept: Path) -> None:
    import torch

    data = (kept / "dcp" / ".metadata").read_bytes()
    seen: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):  # DCP's own reading, recording what it loads
        def find_class(self, module: str, name: str) -> Any:
            seen.add((module, name))
            return super().find_class(module, name)

    plain = Recording(io.BytesIO(data)).load()
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in seen
    assert all(allowed(m, n) for m, n in seen), sorted(seen)
    md = loads_metadata(data, str(kept))
    assert md == plain
    # every dtype torch has is on the list
    dtypes = {k for k, v in vars(torch).items() if isinstance(v, torch.dtype)}
    assert all(allowed("torch", d) for d in dtypes)


def test_all_torch_values_and_dataclasses_round_trip() -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunks = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 3]))]
    md = Metadata(
        state_dict_metadata={
            f"w.{dt}.{mf}": TensorStorageMetadata(
                TensorProperties(dtype=dt, layout=lay, memory_format=mf), torch.Size([2, 3]),
                chunks)
            for dt in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64)
            for lay in (torch.strided, torch.sparse_coo)
            for mf in (torch.contiguous_format, torch.channels_last)}
        | {"optim.param_groups.0.lr": BytesStorageMetadata()},
        planner_data={"w": ("model", "w")},
        storage_data={MetadataIndex("w", [0, 0]): _StorageInfo("__0_0.distcp", 0, 10)},
        storage_meta=StorageMeta(checkpoint_id=Path("/ckpt"), save_id="s", load_id="l"))
    data = pickle.dumps(md)
    assert loads_metadata(data, SOURCE) == md
    assert loads_metadata(pickle.dumps({"f": torch.channels_last, "l": torch.sparse_csr}),
                          SOURCE) == {"f": torch.channels_last, "l": torch.sparse_csr}


def test_dcps_reader_reads_metadata_through_the_allow_list(kept: Path, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from ckptbench.errors import CkptbenchError
    from ckptbench.formats.dcp_load import MetadataGuard, TimedReader

    ckpt, meta = _copy(kept, tmp_path)
    reader = TimedReader(dcp.FileSystemReader(ckpt / "dcp")).reader
    md = reader.read_metadata()
    assert md.state_dict_metadata and md.storage_meta.load_id == reader.load_id
    assert isinstance(dcp.FsspecReader(str(ckpt / "dcp")), dcp.FileSystemReader)
    MetadataGuard(dcp.FsspecReader(str(ckpt / "dcp"))).reader.read_metadata()
    # a pickle of allowed classes only, but not DCP's Metadata
    meta.write_bytes(pickle.dumps(collections.OrderedDict(a=1)))
    guard = MetadataGuard(dcp.FileSystemReader(ckpt / "dcp"))
    try:
        guard.reader.read_metadata()
    except Exception as exc:  # what DCP's fallback to per-rank metadata catches
        raise AssertionError(f"caught by DCP's except Exception: {exc!r}") from None
    except BaseException:  # what DCP's collectives wrap and pass on
        pass
    else:
        raise AssertionError("read")
    with pytest.raises(UnsafePickle, match=r"holds a OrderedDict, not DCP's Metadata"):
        guard.check()
    with pytest.raises(CkptbenchError, match="FileSystemReader"):
        MetadataGuard(object())


def test_a_real_checkpoint_restores_and_a_tampered_one_runs_nothing(kept: Path,
                                                                    tmp_path: Path) -> None:
    good = _restore(kept, tmp_path / "good.jsonl")
    assert good.returncode == 0, good.stderr
    marker = tmp_path / "PWNED"
    ckpt, meta = _copy(kept, tmp_path)
    _tamper(ckpt, pickle.dumps(Calls(os.system, f"touch {marker}")))
    r = _restore(ckpt, tmp_path / "evil.jsonl")
    assert not marker.exists()
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"{meta}: refused to load {os.system.__module__}.system" in lines[0]
    # the same through builtins.exec, in a run's restore record too
    _tamper(ckpt, pickle.dumps(Calls(builtins.exec, f"open({str(marker)!r}, 'w')")))
    r = _restore(ckpt, tmp_path / "exec.jsonl")
    assert r.returncode == 2 and not marker.exists(), r.stderr
    assert "refused to load builtins.exec" in r.stderr
    from ckptbench.records import read_records

    errors = [x for x in read_records(tmp_path / "exec.jsonl") if x["type"] == "error"]
    assert errors and errors[0]["kind"] == "backend"
    assert errors[0]["message"].startswith(f"{meta}: refused to load builtins.exec")


def test_a_tampered_checkpoint_restored_file_by_file_runs_nothing(kept: Path,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    ckpt, _ = _copy(kept, tmp_path)
    _tamper(ckpt, pickle.dumps(Calls(os.system, f"touch {marker}")))
    r = _restore(ckpt, tmp_path / "files.jsonl", "--restore-plan", "files")
    assert not marker.exists()
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
