"""One error type for bad input, so the CLI can print one line and exit 2."""

from __future__ import annotations


class CkptbenchError(Exception):
    """Bad input or an environment problem the user can fix.

    The message is one line naming the field or path and what is allowed; the CLI
    prints it without a traceback and exits with status 2.
    """

    exit_code = 2


class SpecError(CkptbenchError):
    """A workload file or option that does not validate."""


class BackendError(CkptbenchError):
    """A target that cannot be used (missing, read-only, full, unreachable, foreign files)."""


class VerificationError(Exception):
    """Restored bytes differ from what was written: the run has failed (exit 1)."""


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) for an error to be gathered and reported."""
    if isinstance(exc, VerificationError):
        return "verification", str(exc)
    if isinstance(exc, CkptbenchError):
        return "backend", str(exc)
    if isinstance(exc, OSError):
        return "backend", f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    return "internal", f"{type(exc).__name__}: {exc}"


class RunFailed(CkptbenchError):
    """An iteration failed on some process; the message says where and why."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = 2 if kind == "backend" else 1
