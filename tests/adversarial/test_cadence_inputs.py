"""`cadence` inputs and outputs: --plot never overwrites or follows a link without
--force, takes only .png, and is created exclusively; --results garbage is one line
(issue 16, items 2 and 6).

This suite (tests/adversarial) keeps the abuse cases of issue 16 so that later features
inherit them: any new output file option should get the same cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import assert_refused, ckptbench

DALY = ["cadence", "--save-seconds", "5min", "--restore-seconds", "10min", "--mtbf", "6h"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_existing_plot_file_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "existing.png"
    path.write_bytes(b"the user's picture")
    assert_refused(ckptbench(*DALY, "--plot", str(path)), "--plot", str(path), "--force")
    assert path.read_bytes() == b"the user's picture"


def test_plot_does_not_follow_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    link = tmp_path / "o.png"
    link.symlink_to(victim)
    assert_refused(ckptbench(*DALY, "--plot", str(link)), "--plot", "symbolic link", "--force")
    assert victim.read_bytes() == b"precious" and link.is_symlink()


def test_plot_does_not_create_through_a_dangling_symlink(tmp_path: Path) -> None:
    link = tmp_path / "o.png"
    link.symlink_to(tmp_path / "elsewhere.png")
    assert_refused(ckptbench(*DALY, "--plot", str(link)), "--plot", "symbolic link")
    assert not (tmp_path / "elsewhere.png").exists()


def test_force_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "existing.png"
    path.write_bytes(b"old")
    result = ckptbench(*DALY, "--plot", str(path), "--force")
    assert result.rc == 0, result.err
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.png"]  # no temp file left


def test_force_replaces_a_link_never_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    link = tmp_path / "o.png"
    link.symlink_to(victim)
    result = ckptbench(*DALY, "--plot", str(link), "--force")
    assert result.rc == 0, result.err
    assert victim.read_bytes() == b"precious"
    assert not link.is_symlink() and link.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("name", ["o.txt", "o", "o.png.txt", "o.svg"])
def test_plot_must_be_a_png_path(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    assert_refused(ckptbench(*DALY, "--plot", str(path)), "--plot", ".png")
    assert not path.exists()


def test_new_plot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "new.PNG"
    result = ckptbench(*DALY, "--plot", str(path))
    assert result.rc == 0, result.err
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_plot_into_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "o.png"
    assert_refused(ckptbench(*DALY, "--plot", str(path)), "--plot", "cannot write")


def test_plot_is_created_exclusively(tmp_path: Path) -> None:
    """A file that appears after the early check is still not overwritten: the write
    itself is O_EXCL (the race the check alone would leave open)."""
    from ckptbench.cli.output_file import check_output_path, write_output_file
    from ckptbench.errors import SpecError

    path = tmp_path / "racy.png"
    check_output_path(path, "--plot", ".png", force=False)
    path.write_bytes(b"appeared meanwhile")
    with pytest.raises(SpecError, match="exists there"):
        write_output_file(path, "--plot", False, lambda f: f.write(PNG_MAGIC))
    assert path.read_bytes() == b"appeared meanwhile"


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\xff\xfe garbage\n",
                                     b"[" * 100_000 + b"\n", b"garbage\n"],
                         ids=["binary", "not-utf8", "deeply-nested", "text"])
def test_results_garbage_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    result = ckptbench("cadence", "--results", str(path), "--checkpoint-size", "1TB",
                       "--gpus", "8", "--mtbf", "3h")
    assert_refused(result, "--results", str(path))
