"""Files the user names for output (``report --html``, the PNGs of ``report --plots``,
``cadence --plot``, ``sweep --plot``): never overwritten, links never followed, unless
``--force`` says to replace what is there; never an input of the same command, even with
``--force``. (``--results`` files are created the same way by records.JsonlSink: O_EXCL,
no ``--force``.)

The path is checked before any work, so a mistake costs nothing, and created
exclusively (O_EXCL|O_NOFOLLOW) when written, so a file that appears in between is not
overwritten either. ``--force`` writes a new file beside it and renames it over the
path: a symbolic link there is replaced, never written through.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ckptbench.errors import SpecError

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _exists_error(path: Path, option: str) -> SpecError:
    what = "a symbolic link" if path.is_symlink() else "a file"
    return SpecError(f"{option} {path}: {what} exists there (never overwritten); "
                     "allowed: a new path, or add --force to replace it")


def _same(path: Path, other: Path) -> bool:
    """`path` is `other` (the same file, through a link or a hard link, or the same name)."""
    try:
        return os.path.samefile(path, other)
    except OSError:
        return os.path.realpath(path) == os.path.realpath(other)


def check_output_path(path: Path, option: str, suffix: str | None, force: bool,
                      inputs: Sequence[Path] = ()) -> None:
    """Refuse a wrong suffix (when one is required), an input of the command, and an
    existing file or link unless `force`."""
    if suffix is not None and path.suffix.lower() != suffix:
        raise SpecError(f"{option} {path}: not a {suffix} file name; allowed: a new file name"
                        f" ending in {suffix}")
    if path.is_dir() and not path.is_symlink():
        raise SpecError(f"{option} {path}: is a directory; allowed: a new file name"
                        + (f" ending in {suffix}" if suffix else ""))
    for source in inputs:
        if _same(path, Path(source)):
            raise SpecError(f"{option} {path}: is {source}, an input of this command (never "
                            "overwritten, even with --force); allowed: a new path")
    if not force and (path.is_symlink() or path.exists()):
        raise _exists_error(path, option)


def write_output_file(path: Path, option: str, force: bool,
                      write: Callable[[BinaryIO], None]) -> None:
    """Create `path` exclusively (or, with `force`, replace it) with what `write` writes."""
    target = path.with_name(f".{path.name}.{os.getpid()}.tmp") if force else path
    try:
        fd = os.open(target, _NEW, 0o666)
    except FileExistsError:
        raise _exists_error(target, option) from None
    except OSError as exc:
        raise SpecError(f"{option} {path}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        if force:
            os.replace(target, path)
    except OSError as exc:
        target.unlink(missing_ok=True)  # ours: created above
        raise SpecError(f"{option} {path}: cannot write ({exc.strerror})") from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, option: str, force: bool, data: bytes) -> None:
    """write_output_file for bytes already in memory."""
    def write(f: BinaryIO) -> None:
        f.write(data)

    write_output_file(path, option, force, write)


def save_figure(fig: Any, path: Path, force: bool = False, option: str = "--plot") -> None:
    """Write a matplotlib figure to a new file (`force`: replacing what is at `path`;
    one-line error if it cannot), then free it."""
    import matplotlib.pyplot as plt

    title = " / ".join(t for t in (ax.get_title() for ax in fig.axes) if t)
    try:
        write_output_file(path, option, force,
                          lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight",
                                                metadata={"Title": title.replace("\n", ", ")}))
    finally:
        plt.close(fig)
