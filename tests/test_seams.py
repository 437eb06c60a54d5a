"""The package's seams are typed: no `Any` in the signatures of the seam modules (the
backend core, the format protocol, the manifest, the collectives), no attribute probed by name (`getattr(x, "name")`,
`hasattr(x, "name")`), no `__getattr__` forwarding, no `type: ignore`, except where a
third-party object, a platform constant or a thread-local leaves nothing to declare; each
such place is listed below with its reason. A new one fails here until it is typed or
listed; a listed one that is gone fails too, so the list only shrinks."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ckptbench"

TORCH_DCP = "torch DCP's reader, metadata and storage objects differ across torch versions"
FSSPEC_FILE = "fsspec's file objects differ by file system and have no common type"
BOTOCORE = "botocore's and urllib3's response objects (untyped; private members by design)"

# (path under ckptbench/, what) -> why it cannot be typed
ALLOWED: dict[tuple[str, str], str] = {
    ("formats/dcp_load.py", "getattr:storage_data"): TORCH_DCP,
    ("formats/dcp_load.py", "getattr:length"): TORCH_DCP,
    ("formats/dcp_load.py", "hasattr:chunks"): TORCH_DCP,
    ("formats/torch_dcp.py", "type: ignore[misc]"):
        "DCP's planners are subclassed and torch is optional, so their base is Any to mypy",
    ("formats/codecs.py", "type: ignore[no-redef]"):
        "zarr < 3.1.3 ships the same LZ4 codec class under numcodecs.zarr3",
    ("formats/zarr/engine.py", "getattr:loop"): "a threading.local's attribute is set per thread",
    ("backends/s3/readahead.py", "getattr:lane"): "a threading.local's attribute is set per thread",
    ("backends/s3/window.py", "getattr:n"): "a threading.local's attribute is set per thread",
    ("redact.py", "hasattr:_asdict"): "a named tuple has no common base class to test against",
    ("backends/fsspec_backend.py", "getattr:f"): FSSPEC_FILE,
    ("backends/fsspec_backend.py", "hasattr:fileno"): FSSPEC_FILE,
    ("backends/fsspec_backend.py", "hasattr:discard"): FSSPEC_FILE,
    ("backends/local.py", "getattr:O_CLOEXEC"): "a platform constant that not every os has",
    ("backends/s3/errors.py", "getattr:status_code"): BOTOCORE,
    ("backends/s3/errors.py", "getattr:context"): BOTOCORE,
    ("backends/s3/reader.py", "getattr:_raw_stream"): BOTOCORE,
    ("backends/s3/reader.py", "getattr:_fp"): BOTOCORE,
    ("backends/s3/reader.py", "getattr:chunked"): BOTOCORE,
    ("backends/s3/reader.py", "hasattr:readinto"): BOTOCORE,
    ("backends/s3/crt.py", "getattr:name"): "awscrt's errors are untyped; some carry a name",
    ("backends/s3/obstore_io.py", "type: ignore[arg-type,unused-ignore]"):
        "obstore's credential-provider type differs across its releases",
    ("testing/conformance.py", "type: ignore[method-assign]"):
        "the conformance test swaps one backend instance's method to inject a failure",
}

IGNORE = re.compile(r"type:\s*ignore(\[[^\]]*\])?")


def probes(source: str) -> set[str]:
    """What `source` probes or silences: getattr:/hasattr:<name> for a literal name,
    __getattr__ for a forwarding class, type: ignore[...] for each silenced error."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.add(f"{node.func.id}:{node.args[1].value}")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__getattr__":
            found.add("__getattr__")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := IGNORE.search(tok.string)):
            found.add(f"type: ignore{m.group(1) or ''}")
    return found


def package_probes() -> set[tuple[str, str]]:
    return {(p.relative_to(PACKAGE).as_posix(), what) for p in PACKAGE.rglob("*.py")
            for what in probes(p.read_text())}


def test_no_probing_or_type_ignore_outside_the_allow_list() -> None:
    unlisted = sorted(package_probes() - ALLOWED.keys())
    assert not unlisted, ("type these seams (a protocol, a declared attribute, a typed "
                          f"helper) or list them in ALLOWED with a reason: {unlisted}")


def test_the_allow_list_names_only_what_is_still_there() -> None:
    gone = sorted(ALLOWED.keys() - package_probes())
    assert not gone, f"no longer in the package, drop from ALLOWED: {gone}"


def test_the_check_sees_each_kind() -> None:
    source = '''
class Wrapper:
    def __getattr__(self, name):
        return getattr(self.inner, name)

def f(backend, n):
    root = getattr(backend, "root", None)
    if hasattr(backend, "transport"):
        pass
    x = getattr(backend, n)  # a name computed at run time is no probe of a seam
    return memoryview(root)  # type: ignore[arg-type]

y = 1  # type: ignore
'''
    assert probes(source) == {"__getattr__", "getattr:root", "hasattr:transport",
                              "type: ignore[arg-type]", "type: ignore"}


# The modules where the layers meet: what crosses them is declared, never `Any`.
SEAM_MODULES = ("backends/base.py", "formats/base.py", "formats/manifest.py",
                "formats/manifest_encoding.py", "runner/comm.py", "runner/decision.py",
                "runner/driver.py", "runner/fill_in.py")

JSON_FACTS = "open-ended facts written as they are to the results file (each backend its own)"
DECODED = ("the manifest's JSON fields as decoded, before accept() and covers() check them "
           "(its files are typed: FileEntry)")

# (path under ckptbench/, Any:<where>) -> why it stays `Any`
ALLOWED_ANY: dict[tuple[str, str], str] = {
    ("backends/base.py", "Any:Striping.set_striping"): JSON_FACTS,
    ("backends/base.py", "Any:Backend.describe"): JSON_FACTS,
    ("backends/base.py", "Any:Backend.details"): JSON_FACTS,
    ("formats/base.py", "Any:TimedOp.extra"): "an op record's extra facts, each format its own",
    ("formats/base.py", "Any:ThreadResult.op"): "an op record's extra facts, each format its own",
    ("formats/manifest.py", "Any:Manifest(base)"): DECODED,
    ("formats/manifest.py", "Any:Manifest.__init__"): DECODED,
    ("formats/manifest.py", "Any:Manifest.__getitem__"): DECODED,
}


def _mentions_any(node: ast.expr | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id == "Any")
        or (isinstance(n, ast.Attribute) and n.attr == "Any")
        or (isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.search(r"\bAny\b", n.value) is not None)
        for n in ast.walk(node))


def any_in_signatures(source: str) -> set[str]:
    """Where `source` declares `Any`: Any:<function> for a parameter or return annotation,
    Any:<class>.<attribute> for a class attribute, Any:<class>(base) for a base class."""
    found: set[str] = set()

    def visit(body: list[ast.stmt], where: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                if any(_mentions_any(p.annotation) for p in params if p is not None) or \
                        _mentions_any(node.returns):
                    found.add(f"Any:{where}{node.name}")
            elif isinstance(node, ast.ClassDef):
                if any(_mentions_any(b) for b in node.bases):
                    found.add(f"Any:{node.name}(base)")
                visit(node.body, f"{node.name}.")
            elif isinstance(node, ast.AnnAssign) and _mentions_any(node.annotation) and where:
                found.add(f"Any:{where}{ast.unparse(node.target)}")
    visit(ast.parse(source).body, "")
    return found


def seam_anys() -> set[tuple[str, str]]:
    return {(path, what) for path in SEAM_MODULES
            for what in any_in_signatures((PACKAGE / path).read_text())}


def test_no_any_at_the_seams_outside_the_allow_list() -> None:
    unlisted = sorted(seam_anys() - ALLOWED_ANY.keys())
    assert not unlisted, ("declare what crosses these seams (a dataclass, a TypedDict, a "
                          f"protocol, object) or list them in ALLOWED_ANY with a reason: {unlisted}")


def test_the_any_allow_list_names_only_what_is_still_there() -> None:
    gone = sorted(ALLOWED_ANY.keys() - seam_anys())
    assert not gone, f"no longer `Any`, drop from ALLOWED_ANY: {gone}"


def test_the_any_check_sees_each_kind() -> None:
    source = '''
import typing
from typing import Any

def f(x: Any, *args: int, **kw: "dict[str, Any]") -> None: ...
def g(x: int) -> list[typing.Any]: ...
def h(x: object) -> Anyway: ...

class C(Mapping[str, Any]):
    field: dict[str, Any]
    ok: int
    def m(self, x: int) -> Any: ...
    def n(self, x: int) -> int:
        local: Any = x
        return local
'''
    assert any_in_signatures(source) == {"Any:f", "Any:g", "Any:C(base)", "Any:C.field",
                                         "Any:C.m"}
