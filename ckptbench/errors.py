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
