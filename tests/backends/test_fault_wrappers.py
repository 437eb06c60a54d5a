"""The fault wrappers (ckptbench.testing.faults) forward every method of the Backend core
and of each capability the backend inside has, written out and typed: a method added to
Backend, WriteHandle or a capability protocol that no wrapper forwards fails here, rather
than running Backend's default on the wrapper. A wrapped local backend passes the
conformance suite."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptbench.backends import base
from ckptbench.backends.base import Backend, SharedFileWrites, WriteHandle, capabilities_of
from ckptbench.backends.local import LocalBackend, LocalOptions
from ckptbench.backends.memory import MemoryBackend
from ckptbench.testing import faults, forwarding
from ckptbench.testing.conformance import BackendConformance
from ckptbench.testing.forwarding import (
    CAPABILITY_FORWARDERS,
    ForwardingBackend,
    ForwardingWriteHandle,
)

CLASS_FACTS = {"name", "Options", "capabilities", "alignment"}  # data, not calls


def members(cls: type) -> set[str]:
    """The public methods and properties `cls` declares or inherits (object's aside)."""
    return {n for n, v in inspect.getmembers(cls) if not n.startswith("_")
            and (callable(v) or isinstance(v, property)) and n not in CLASS_FACTS}


def capability_protocols() -> list[type]:
    """Every capability protocol backends.base declares."""
    return [v for v in vars(base).values() if isinstance(v, type)
            and getattr(v, "_is_protocol", False) and getattr(v, "_is_runtime_protocol", False)]


def wrappers() -> list[Callable[[Backend], ForwardingBackend]]:
    never = lambda key: False  # noqa: E731 - no fault: every call passes through
    return [ForwardingBackend, lambda b: faults.DyingBackend(b, never, 1),
            lambda b: faults.PausingBackend(b, never, 1, "/nonexistent/flag"),
            lambda b: faults.FullDiskBackend(b, never, 1 << 40),
            lambda b: faults.SlowBackend(b, 0.0)]


WRAPPERS = wrappers()
NAMES = ["forwarding", "dying", "pausing", "full-disk", "slow"]


def test_every_backend_method_is_written_out() -> None:
    """Not inherited from Backend (whose defaults would act on the wrapper) and not
    reached through __getattr__."""
    missing = sorted(members(Backend) - set(vars(ForwardingBackend)))
    assert not missing, f"ForwardingBackend does not forward {missing}"
    missing = sorted(members(WriteHandle) - set(vars(ForwardingWriteHandle)))
    assert not missing, f"ForwardingWriteHandle does not forward {missing}"


def test_every_capability_has_a_forwarder() -> None:
    protocols = capability_protocols()
    assert SharedFileWrites in protocols and len(protocols) >= 5  # the check sees them
    forwarded = dict(CAPABILITY_FORWARDERS)
    assert sorted(p.__name__ for p in protocols) == sorted(p.__name__ for p in forwarded)
    for protocol, forwarder in forwarded.items():
        wanted = set(typing.get_protocol_members(protocol)) if hasattr(
            typing, "get_protocol_members") else {
            n for n in vars(protocol) if not n.startswith("_")}
        missing = sorted(wanted - set(vars(forwarder)))
        assert not missing, f"{forwarder.__name__} does not forward {missing}"


def test_no_wrapper_forwards_through_getattr() -> None:
    for module in (faults, forwarding):
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                assert "__getattr__" not in vars(cls), cls


class Recorder(Backend):
    """Every method of the core and of every capability: records its call and returns
    a token of its own, so a test sees each call arrive, arguments and result intact."""

    name = "recorder"
    alignment = 512

    def __init__(self) -> None:
        super().__init__("rec://t")
        self.calls: list[tuple[str, tuple[Any, ...]]] = []


def _record(name: str) -> Callable[..., Any]:
    def method(self: Recorder, *args: Any) -> Any:
        self.calls.append((name, args))
        return f"token:{name}"
    return method


def _recorded_property(name: str) -> property:
    def get(self: Recorder) -> str:
        self.calls.append((name, ()))
        return f"token:{name}"
    return property(get)


CALLS = sorted(members(Backend) | {n for p in capability_protocols()
                                   for n in vars(p) if not n.startswith("_")})
PROPERTIES = {n for n in CALLS if isinstance(getattr(Backend, n, None), property)}
for _name in CALLS:
    setattr(Recorder, _name, _recorded_property(_name) if _name in PROPERTIES else _record(_name))
Recorder.__abstractmethods__ = frozenset()


def _signature_of(name: str) -> inspect.Signature:
    for owner in (Backend, *capability_protocols()):
        if name in vars(owner) or hasattr(owner, name):
            return inspect.signature(getattr(owner, name))
    raise AssertionError(name)


@pytest.mark.parametrize("wrap", WRAPPERS, ids=NAMES)
def test_every_call_reaches_the_backend_inside(wrap: Callable[[Backend], Backend]) -> None:
    inner = Recorder()
    outer = wrap(inner)
    assert isinstance(outer, Backend)
    assert (outer.name, outer.target, outer.alignment) == ("recorder", "rec://t", 512)
    assert outer.options is inner.options and outer.hints is inner.hints
    for kind, _ in CAPABILITY_FORWARDERS:
        assert isinstance(outer, kind), kind
    for name in CALLS:
        inner.calls.clear()
        if name in PROPERTIES:
            assert getattr(outer, name) == f"token:{name}", name
            assert inner.calls == [(name, ())], name
            continue
        signature = _signature_of(name)
        args = tuple(object() for _ in list(signature.parameters)[1:])  # self aside
        got = getattr(outer, name)(*args)
        assert inner.calls == [(name, args)], name
        if isinstance(got, ForwardingWriteHandle):  # a wrapper that always wraps writes
            got = got.inner
        returns = signature.return_annotation not in (None, "None")
        assert got == (f"token:{name}" if returns else None), name


def test_a_wrapper_has_the_capabilities_of_the_backend_inside(tmp_path: Path) -> None:
    local = LocalBackend(str(tmp_path / "t"), LocalOptions(io="buffered"))
    memory = MemoryBackend("memory://w")
    for wrap in WRAPPERS:
        assert capabilities_of(type(wrap(local))) == capabilities_of(LocalBackend)
        assert capabilities_of(type(wrap(memory))) == capabilities_of(MemoryBackend)
        for kind, _ in CAPABILITY_FORWARDERS:
            assert isinstance(wrap(local), kind) == isinstance(local, kind), kind
            assert isinstance(wrap(memory), kind) == isinstance(memory, kind), kind
        assert wrap(memory).name == "memory" and wrap(local).describe() == local.describe()
    dying = faults.DyingBackend(local, lambda key: False, 1)
    assert dying.for_parent() is dying  # local is its own parent's backend: still wrapped


class TestWrappedLocal(BackendConformance):
    """A local backend inside every fault wrapper at once (none set off) is still a
    conforming backend, through the runner too."""

    @pytest.fixture
    def target(self, tmp_path: Path) -> str:
        return str(tmp_path / "target")

    def open(self, target: str) -> Backend:
        backend: Backend = LocalBackend(target, LocalOptions(io="buffered"))
        for wrap in WRAPPERS:
            backend = wrap(backend)
        return backend

    def put_foreign(self, target: str, name: str, data: bytes) -> None:
        path = Path(target) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def listing(self, target: str) -> list[str]:
        root = Path(target)
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) \
            if root.exists() else []
