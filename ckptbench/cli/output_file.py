"""Files the user names for output (``cadence --plot``): never overwritten, links never
followed, unless ``--force`` says to replace what is there.

The path is checked before any work, so a mistake costs nothing, and created
exclusively (O_EXCL) when written, so a file that appears in between is not
overwritten either. ``--force`` writes a new file beside it and renames it over the
path: a symbolic link there is replaced, never written through.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ckptbench.errors import SpecError

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _exists_error(path: Path, option: str) -> SpecError:
    what = "a symbolic link" if path.is_symlink() else "a file"
    return SpecError(f"{option} {path}: {what} exists there (never overwritten); "
                     "allowed: a new path, or add --force to replace it")


def check_output_path(path: Path, option: str, suffix: str, force: bool) -> None:
    """Refuse a wrong suffix, and an existing file or link unless `force`."""
    if path.suffix.lower() != suffix:
        raise SpecError(f"{option} {path}: not a {suffix} file name; allowed: a new file name"
                        f" ending in {suffix}")
    if path.is_dir() and not path.is_symlink():
        raise SpecError(f"{option} {path}: is a directory; allowed: a new file name ending in {suffix}")
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
