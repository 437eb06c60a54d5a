"""`ckptbench restore` of a kept checkpoint that was altered on disk (issue 29, items 4, 5
and 9): a manifest that lost a file's entry, manifest fields of the wrong type, a
manifest or data file replaced by a FIFO or by /dev/zero.

Never a partial restore called verified, never a traceback, never a hang or a read
without end: one line naming the manifest field or the path and what is allowed. One
real run keeps a checkpoint of the tiny workload; each test restores an altered copy.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptbench.formats.manifest import Manifest

from .helpers import WORKLOADS, Result, assert_refused, ckptbench

GiB = 1 << 30


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A target holding one checkpoint of the tiny workload, kept with --keep."""
    tmp = tmp_path_factory.mktemp("kept")
    run = ckptbench("run", str(WORKLOADS / "tiny.toml"), "--target", str(tmp / "t"), "--keep",
                    "--results", str(tmp / "r.jsonl"), timeout=300)
    assert run.rc == 0, run.err
    return tmp / "t"


def _copy(kept: Path, tmp_path: Path) -> Path:
    """A copy of the kept target; its checkpoint's directory."""
    shutil.copytree(kept, tmp_path / "t", symlinks=True)
    (ckpt,) = (tmp_path / "t").glob("run-*/checkpoint-1")
    return ckpt


def _edit(ckpt: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Change the manifest's JSON, keeping its size (the padding absorbs the change) and
    its size field (unless the edit changes it)."""
    path = ckpt / ".metadata"
    data = path.read_bytes()
    manifest = Manifest.decode(data).fields
    edit(manifest)
    body = json.dumps(manifest).encode()
    assert len(body) < len(data)
    path.write_bytes(body + b"\n" + bytes(len(data) - len(body) - 1))


def _restore(ckpt: Path, tmp_path: Path, *args: str, memory_limit: int | None = None) -> Result:
    return ckptbench("restore", str(ckpt), "--results", str(tmp_path / "rr.jsonl"), *args,
                     cwd=tmp_path, timeout=120, memory_limit=memory_limit)


def test_the_kept_checkpoint_restores(kept: Path, tmp_path: Path) -> None:
    ckpt = _copy(kept, tmp_path)
    result = _restore(ckpt, tmp_path)
    assert result.rc == 0, result.err
    assert "ranks=4/4" in " ".join(result.out.split())


@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_a_manifest_that_lost_a_files_entry_is_not_restored(kept: Path, tmp_path: Path,
                                                            which: int) -> None:
    """Removing one file's entry (the manifest's size kept) restored 3 of 4 ranks and
    said "verified"."""
    ckpt = _copy(kept, tmp_path)
    gone: list[str] = []

    def drop(m: dict[str, Any]) -> None:
        name = sorted(m["files"])[which]
        gone.append(name)
        del m["files"][name]

    _edit(ckpt, drop)
    result = _restore(ckpt, tmp_path)
    assert_refused(result, ".metadata: no entry for ", gone[0], "altered manifest")
    assert not (tmp_path / "rr.jsonl").exists()


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m[field] = value
    return edit


def _entry(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["files"][sorted(m["files"])[0]] = value
    return edit


def _entry_path(m: dict[str, Any]) -> None:
    m["files"][sorted(m["files"])[0]]["path"] = ["a"]


def _drop(field: str) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        del m[field]
    return edit


def _spec(section: str, field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["workload_spec"][section][field] = value
    return edit


def _description(m: dict[str, Any]) -> None:
    m["workload_spec"]["description"] = ["a", 1]


def _section(section: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        m["workload_spec"][section] = value
    return edit


@pytest.mark.parametrize("edit, needles", [
    # tracebacks before: ValueError, AttributeError ('list' has no 'items'; 'str' has no 'get')
    (_set("seed", "abc"), ["seed is 'abc'", "allowed: an integer >= 0"]),
    (_set("files", [1, 2]), ["files is [1, 2]", "allowed: an object of file entries"]),
    (_entry("x"), ["__0_0.distcp' is 'x'", "allowed: an object with its rank"]),
    (_entry_path, ["__0_0.distcp' is not a file of its workload's plan"]),
    (_set("iteration", "x"), ["iteration is 'x'", "allowed: an integer >= 1"]),
    # "ValueError: bogus", exit 1
    (_set("payload", "bogus"), ["payload is 'bogus'", "allowed: random, realistic"]),
    # "schema 'ckptbench.manifest/1' is not 'ckptbench.manifest/1'"
    (_drop("files"), ["files is missing", "allowed: an object of file entries"]),
    (_drop("ranks"), ["ranks is missing", "the ranks that wrote"]),
    (_set("ranks", [0, 1, 2, 3, 4]), ["rank 4 is not a rank of its workload's plan"]),
    (_set("size", "x"), ["its size field is 'x'"]),
    # "[parallel] world_size = ..." without saying where it came from
    (_spec("parallel", "world_size", 10**9), [".metadata: workload_spec: [parallel] world_size"
                                              " = 1000000000 is too large"]),
    (_description, [".metadata: workload_spec: [workload] description = ['a', 1]",
                    "allowed: a string"]),
    # accepted before: the restore layout dropped without a word
    (_section("restore", "x"), [".metadata: workload_spec: [restore] = 'x'; allowed: a table"]),
    (_section("parallel", [8]), [".metadata: workload_spec: [parallel] = [8]; allowed: a table"]),
], ids=["seed", "files-list", "entry-string", "entry-path", "iteration", "payload", "no-files", "no-ranks",
        "rank-outside", "size", "world-size", "description", "restore-string", "parallel-list"])
def test_manifest_fields_of_the_wrong_type_are_one_line(kept: Path, tmp_path: Path,
                                                        edit: Callable[[dict[str, Any]], None],
                                                        needles: list[str]) -> None:
    ckpt = _copy(kept, tmp_path)
    _edit(ckpt, edit)
    result = _restore(ckpt, tmp_path)
    if "size field" in needles[0]:  # a damaged checkpoint: a failed restore (exit 1)
        lines = result.err.strip().splitlines()
        assert result.rc == 1 and "Traceback" not in result.err and len(lines) == 1, result.err
        assert needles[0] in lines[0] and ".metadata" in lines[0]
        return
    line = assert_refused(result, *needles)
    assert ".metadata" in line and "Error:" not in line


def test_a_manifest_chunk_that_differs_from_the_plan_fails_the_restore(kept: Path,
                                                                       tmp_path: Path) -> None:
    """The entry's chunk list must hold every chunk the restore reads, where its digest
    is: a chunk moved in the manifest fails verification, naming the chunk."""
    ckpt = _copy(kept, tmp_path)

    def move(m: dict[str, Any]) -> None:
        m["files"][sorted(m["files"])[0]]["chunks"][3][1] += 4

    _edit(ckpt, move)
    result = _restore(ckpt, tmp_path)
    lines = result.err.strip().splitlines()
    assert result.rc == 1 and "Traceback" not in result.err, result.err
    assert len(lines) == 1 and "does not list chunk " in lines[0], result.err
    records = [json.loads(x) for x in (tmp_path / "rr.jsonl").read_text().splitlines()]
    errors = [r for r in records if r["type"] == "error"]
    assert errors and errors[0]["kind"] == "verification"
    phases = [r for r in records if r["type"] == "phase"]
    assert phases and not phases[0]["verified"]


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("name", [".metadata", "__1_0.distcp"])
@pytest.mark.parametrize("replace, kind", [(_fifo, "is a FIFO"),
                                           (_dev_zero, "is a character device")],
                         ids=["fifo", "dev-zero"])
def test_a_file_that_is_not_a_regular_file_is_refused_without_reading(
        kept: Path, tmp_path: Path, name: str, replace: Callable[[Path], None],
        kind: str) -> None:
    """A FIFO blocked the restore forever; /dev/zero as the manifest grew 7.5 GB in 12 s.
    Under a 2 GiB address-space limit: the refusal comes before any reading."""
    ckpt = _copy(kept, tmp_path)
    replace(ckpt / name)
    result = _restore(ckpt, tmp_path, memory_limit=2 * GiB)
    line = assert_refused(result, f"checkpoint-1/{name}: {kind}, not a regular file")
    assert "MemoryError" not in line
    if name != ".metadata":  # a data file: the restore ran and failed, with an error record
        records = [json.loads(x) for x in (tmp_path / "rr.jsonl").read_text().splitlines()]
        assert [r["kind"] for r in records if r["type"] == "error"] == ["backend"]


def test_a_manifest_read_stops_at_its_limits(tmp_path: Path) -> None:
    """A manifest whose JSON line never ends, or that never ends at all (an object store
    serving something else), is refused at a stated limit, not read on."""
    from ckptbench.backends.local import LocalBackend, LocalOptions
    from ckptbench.errors import VerificationError
    from ckptbench.formats.manifest import read_manifest_bytes

    backend = LocalBackend(str(tmp_path), LocalOptions())
    (tmp_path / "line").write_bytes(b"{" + b" " * (3 << 20))
    (tmp_path / "long").write_bytes(b"{}\n" + b"\0" * (5 << 20))
    with pytest.raises(VerificationError, match=r"line: its JSON line does not end within "
                                                r"1,048,576 bytes"):
        read_manifest_bytes(backend, "line", 1 << 20, limits=(8 << 20, 1 << 20))
    with pytest.raises(VerificationError, match=r"long: larger than 4,194,304 bytes"):
        read_manifest_bytes(backend, "long", 1 << 20, limits=(4 << 20, 1 << 20))
    assert read_manifest_bytes(backend, "long", 1 << 20) == (b"{}", 3 + (5 << 20))


def test_a_renamed_run_directory_is_called_renamed_not_an_altered_manifest(
        kept: Path, tmp_path: Path) -> None:
    ckpt = _copy(kept, tmp_path)
    run_dir = ckpt.parent
    renamed = run_dir.with_name("run-renamed")
    run_dir.rename(renamed)
    result = _restore(renamed / ckpt.name, tmp_path)
    line = assert_refused(result, f"names its files under '{run_dir.name}/checkpoint-1', not "
                                  "'run-renamed/checkpoint-1'", "renamed or moved")
    assert "altered" not in line
