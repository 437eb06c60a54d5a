"""Deleting in the directories a run created, never through a link (backends/owned_dirs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptbench.backends.base import NameTaken
from ckptbench.backends.owned_dirs import make_dir, remove_recorded


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "f").write_text("keep")
    (v / "sub" / "g").write_text("keep")
    return v


def test_a_recorded_directory_loses_its_names_and_then_itself(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    run = make_dir(root / "run")
    ckpt = make_dir(root / "run" / "ckpt")
    (root / "run" / "ckpt" / "sub").mkdir()
    (root / "run" / "ckpt" / "f").write_text("x")
    (root / "run" / "ckpt" / "sub" / "g").write_text("x")
    (root / "run" / "ckpt" / "NOTES").write_text("someone else's")
    assert remove_recorded(root, [("run", run), ("ckpt", ckpt)], ["f", "sub/g"], ["sub"])
    assert sorted(p.name for p in (root / "run" / "ckpt").iterdir()) == ["NOTES"]
    (root / "run" / "ckpt" / "NOTES").unlink()
    assert remove_recorded(root, [("run", run), ("ckpt", ckpt)], [], [])
    assert not (root / "run" / "ckpt").exists()


def test_make_dir_never_reuses_nor_follows(tmp_path: Path) -> None:
    v = _victim(tmp_path)
    (tmp_path / "link").symlink_to(v)
    with pytest.raises(NameTaken):
        make_dir(tmp_path / "link")
    with pytest.raises(OSError):  # a parent swapped for a link: refused, nothing made in v
        make_dir(tmp_path / "link" / "new")
    assert sorted(p.name for p in v.iterdir()) == ["f", "sub"]


@pytest.mark.parametrize("swap", ["link", "plain", "unrecorded"])
def test_a_swapped_or_unrecorded_directory_loses_nothing(tmp_path: Path, swap: str) -> None:
    v = _victim(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    run = make_dir(root / "run")
    ckpt = make_dir(root / "run" / "ckpt")
    (root / "run" / "ckpt").rename(root / "run" / "aside")
    if swap == "link":
        (root / "run" / "ckpt").symlink_to(v)
        target = v
    else:
        target = root / "run" / "ckpt"
        (target / "sub").mkdir(parents=True)
        (target / "f").write_text("keep")
        (target / "sub" / "g").write_text("keep")
    recorded = None if swap == "unrecorded" else ckpt
    assert not remove_recorded(root, [("run", run), ("ckpt", recorded)], ["f", "sub/g"],
                               ["sub"])
    assert (target / "f").read_text() == "keep" and (target / "sub" / "g").read_text() == "keep"


def test_a_link_inside_a_recorded_directory_is_not_followed(tmp_path: Path) -> None:
    v = _victim(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    run = make_dir(root / "run")
    (root / "run" / "sub").symlink_to(v / "sub")
    assert remove_recorded(root, [("run", run)], ["sub/g", "sub"], [])
    assert (v / "sub" / "g").read_text() == "keep"  # the link itself removed, not its target
    assert not (root / "run" / "sub").exists() and not (root / "run" / "sub").is_symlink()


def test_a_record_from_another_host_matches_by_inode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    run = make_dir(root / "run")
    (root / "run" / "f").write_text("x")
    assert remove_recorded(root, [("run", (-1, run[1]))], ["f"], [])
    assert not (root / "run").exists()
    other = make_dir(root / "other")
    (root / "other" / "f").write_text("keep")
    assert not remove_recorded(root, [("other", (-1, other[1] + 1))], ["f"], [])
    assert (root / "other" / "f").read_text() == "keep"
