"""Directories a run created on a file system, and deleting in them without following a
link: the one way ckptbench deletes files there.

A run's directories live in a target other users may write to. Between the run creating
a directory and its cleanup, the directory can be replaced by a symbolic link to someone
else's files, or by a plain directory holding files of the same names. Paths are
therefore never deleted by name from the top: each directory on the way is opened
relative to the one before it (``openat``) with ``O_NOFOLLOW``, the run's own directories
are checked against the device and inode recorded when they were created, and the files
are unlinked relative to the directory's descriptor (``unlinkat``), which acts on that
directory whatever its path leads to by then.

The target's run directory and the memory tier's (runner.tier_store) follow the same rule,
with these helpers: made exclusively (:func:`make_dir`, :func:`make_dir_in`), identified
when made, and reached later only through :func:`open_recorded`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ckptbench.backends.base import Identity, NameTaken

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_OWN = _DIR | os.O_NOFOLLOW


class NotMade(OSError):
    """A directory the run made is no longer at its name: a link, another directory or
    something else is there, or nothing. Nothing there is followed, written or deleted.
    An OSError: where a failed file operation is handled, so is this."""

    def __init__(self, path: Path | str, why: str) -> None:
        self.shown, self.why = str(path), why
        super().__init__(f"{path}: not the directory this run made ({why}); refused: "
                         "nothing there is followed, written or deleted")

    def __reduce__(self) -> tuple[type[NotMade], tuple[str, str]]:
        return type(self), (self.shown, self.why)


def identity_of(fd: int) -> Identity:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def same(found: Identity, recorded: Identity) -> bool:
    """The directory found is the one recorded: same inode, and same device unless the
    record's device is unknown (-1: recorded on another host, where a network file
    system's device number differs; its inode numbers do not)."""
    return found[1] == recorded[1] and (recorded[0] < 0 or found[0] == recorded[0])


def make_dir(path: Path) -> Identity:
    """Create directory `path` exclusively, in its parent opened without following a link
    (its parents made first when missing); its identity. NameTaken when the name exists
    (a directory, a file or a link: never reused, never followed)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    parent = os.open(path.parent, _OWN)
    try:
        return make_dir_in(parent, path.name, path)
    finally:
        os.close(parent)


def make_dir_in(parent: int, name: str, shown: Path, mode: int = 0o777) -> Identity:
    """Create directory `name` exclusively in the directory open as `parent` (`shown`: its
    path, for the error); its identity. NameTaken when the name exists (a directory, a
    file or a link: never reused, never followed)."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        raise NameTaken(f"{shown}: already exists; ckptbench never reuses a directory") from None
    fd = os.open(name, _OWN, dir_fd=parent)
    try:
        return identity_of(fd)
    finally:
        os.close(fd)


def open_recorded(parent: int, name: str, recorded: Identity, shown: Path | str) -> int:
    """Directory `name` in the directory open as `parent`, opened without following a
    link, and only if it is the one `recorded` (`shown`: its path, for the error); else
    NotMade naming it. Close the descriptor returned."""
    fd = open_dir_in(parent, name, shown)
    if not same(identity_of(fd), recorded):
        os.close(fd)
        raise NotMade(shown, "another directory in its place")
    return fd


def open_dir_in(parent: int, name: str, shown: Path | str) -> int:
    """Directory `name` in the directory open as `parent`, opened without following a link
    (`shown`: its path); NotMade naming what is there instead: a link, something other than
    a directory, or nothing ("gone")."""
    try:
        return os.open(name, _OWN, dir_fd=parent)
    except FileNotFoundError:
        raise NotMade(shown, "gone") from None
    except OSError as exc:
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        raise NotMade(shown, "a link" if link or exc.errno == errno.ELOOP else
                      exc.strerror or "not a directory") from None


def unlink_own(parent: int, name: str) -> bool:
    """Remove `name` (a file or a link, never followed) from the directory open as
    `parent` if this process's user owns it: another user's file is never deleted.
    Whether it was removed (False: absent, a directory, or not ours)."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    return True


def _open_in(fd: int, rel: str) -> int:
    """Directory `rel` ('a/b') under `fd`, each step opened without following a link."""
    fds: list[int] = []
    try:
        for part in rel.split("/"):
            fds.append(os.open(part, _OWN, dir_fd=fds[-1] if fds else fd))
        return fds.pop()
    finally:
        for opened in fds:
            os.close(opened)


def _at(fd: int, rel: str, act: str) -> None:
    """unlink (act 'file') or rmdir (act 'dir') `rel` under `fd`; failures left alone."""
    head, _, name = rel.rpartition("/")
    with contextlib.suppress(OSError):
        where = _open_in(fd, head) if head else fd
        try:
            if act == "file":
                os.unlink(name, dir_fd=where)
            else:
                os.rmdir(name, dir_fd=where)
        finally:
            if where != fd:
                os.close(where)


def remove_recorded(root: Path, chain: Sequence[tuple[str, Identity | None]],
                    names: Sequence[str], dirs: Sequence[str]) -> bool:
    """Delete `names` in the directory `chain` leads to from `root`, then `dirs` in it
    and the directory itself when empty; only if every step of `chain` is a directory
    (never a link) with the identity recorded for it (the last step must have one). False:
    nothing was deleted (a step missing, swapped, or the last never recorded)."""
    if not chain or chain[-1][1] is None:
        return False
    fds: list[int] = []
    try:
        fds.append(os.open(root, _DIR))
        for name, ident in chain:
            fds.append(os.open(name, _OWN, dir_fd=fds[-1]))
            if ident is not None and not same(identity_of(fds[-1]), ident):
                return False
        here = fds[-1]
        for name in names:
            _at(here, name, "file")
        for d in dirs:
            _at(here, d, "dir")
        with contextlib.suppress(OSError):  # still ours under that name, and empty
            last = os.open(chain[-1][0], _OWN, dir_fd=fds[-2])
            try:
                still = identity_of(last) == identity_of(here)  # both found here
            finally:
                os.close(last)
            if still:
                os.rmdir(chain[-1][0], dir_fd=fds[-2])
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)
