"""What process 0 decides after a collective step (a commit, a restore, the fill-ins)
and broadcasts to every process: one typed value, so that what travels through
``Comm.bcast`` is declared, not a dict of anything."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ckptbench.errors import RunFailed
from ckptbench.runner.comm import Comm


@dataclass(frozen=True)
class Decision:
    """Whether the step succeeded everywhere; if not, the error's kind and one-line
    message. `digests`: the fill-ins' chunk digests (file index -> digests) process 0
    wrote; `durable_ns`: when an async persist's manifest commit ended."""

    ok: bool = True
    kind: str = ""
    message: str = ""
    digests: Mapping[int, list[int]] = field(default_factory=dict)
    durable_ns: int | None = None

    @classmethod
    def failed(cls, kind: str, message: str) -> Decision:
        return cls(False, kind, message)

    def durable_at(self, ns: int | None) -> Decision:
        return dataclasses.replace(self, durable_ns=ns)

    def check(self, prefix: str = "", suffix: str = "") -> None:
        """RunFailed when the step failed (its message between `prefix` and `suffix`)."""
        if not self.ok:
            raise RunFailed(f"{prefix}{self.message}{suffix}", self.kind)


def agree(comm: Comm, decision: Decision | None) -> Decision:
    """Collective: process 0's decision on every process (the others pass None);
    RunFailed everywhere if it is not ok."""
    agreed = comm.bcast(decision)
    assert agreed is not None, "process 0 decides"
    agreed.check()
    return agreed


__all__ = ["Decision", "agree"]
