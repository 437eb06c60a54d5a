"""The package's seams are typed: no attribute probed by name (`getattr(x, "name")`,
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
