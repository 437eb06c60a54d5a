"""The package's layout follows the data flow: a module imports only the steps before it
(or its own step), and no modules import each other in a cycle.

workload -> plan -> payload -> backend I/O -> formats -> records -> runner -> report ->
cadence -> simulate -> runspec, replay -> measure -> testing -> cli. A module uses no other
module's private (`_name`) members. Every import counts, at the top of a module or inside a
function (imports done lazily are still dependencies).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ckptbench"

# Steps of the data flow, first to last; a module's step is its longest matching prefix.
LAYERS: list[tuple[str, ...]] = [
    ("ckptbench", "ckptbench.errors", "ckptbench.units", "ckptbench.redact", "ckptbench.fields",
     "ckptbench.progress"),
    ("ckptbench.models", "ckptbench.spec", "ckptbench.tierspec"),
    ("ckptbench.plan",),
    ("ckptbench.payload",),
    ("ckptbench.backends",),
    ("ckptbench.formats",),
    ("ckptbench.records",),
    ("ckptbench.runner",),
    ("ckptbench.report", "ckptbench.mlperf"),
    ("ckptbench.jobmodel", "ckptbench.cadence"),
    ("ckptbench.simulate",),
    ("ckptbench.runspec", "ckptbench.replay"),
    ("ckptbench.measure",),
    ("ckptbench.testing",),
    ("ckptbench.cli", "ckptbench.__main__"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    assert found >= 0, f"{module}: in no layer of the data flow (add it to LAYERS)"
    return found


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def import_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` names (relative imports resolved)."""
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
    return base


def imports(module: str, runtime_only: bool = False) -> set[str]:
    """Package modules `module` imports (a name imported from a package counts as the
    submodule when it is one); `runtime_only`: without those under TYPE_CHECKING."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    skip = _type_only(tree) if runtime_only else set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("ckptbench")}
        elif isinstance(node, ast.ImportFrom):
            base = import_base(node, package)
            if not base.startswith("ckptbench"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {m for m in out if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}
RUNTIME = {m: imports(m, runtime_only=True) for m in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_later_step(module: str) -> None:
    later = sorted(t for t in GRAPH[module] if layer(t) > layer(module))
    assert not later, f"{module} (step {layer(module)}) imports later steps: {later}"


def test_no_import_cycle() -> None:
    """At run time (a type-only import back is how two modules name each other's types)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(RUNTIME[m]):
            if state.get(t) == 1:
                cycle = [*stack[stack.index(t):], t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(RUNTIME):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("handle", ["reader", "writer", "crt", "obstore_io", "boto_readahead"])
def test_s3_handles_see_the_session_not_the_backend(handle: str) -> None:
    """S3's upload and download handles hold s3.session.S3Session, never S3Backend (whose
    private members they used to reach into)."""
    assert "ckptbench.backends.s3.backend" not in GRAPH[f"ckptbench.backends.s3.{handle}"]


def test_the_package_never_imports_the_harness() -> None:
    """The service harnesses (MinIO, GlusterFS, warp, fio) are the repository's, not the
    installed package's: pyproject installs ckptbench* only, so an import of `harness`
    from ckptbench would fail for every user."""
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{module}: {n}" for n in names if n.split(".")[0] == "harness"]
    assert not found
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["ckptbench*"]


def test_the_walk_sees_imports() -> None:
    """The checker itself: it must find known edges, or the tests above prove nothing."""
    assert "ckptbench.formats.base" in GRAPH["ckptbench.formats.raw"]
    assert "ckptbench.runner.driver" in GRAPH["ckptbench.runner.launch_local"]
    assert "ckptbench.backends.s3.session" in GRAPH["ckptbench.backends.s3.reader"]
    assert "ckptbench.backends.s3.session" not in RUNTIME["ckptbench.backends.s3.reader"]
    assert layer("ckptbench.cli.run_cmd") > layer("ckptbench.runner.session") > layer("ckptbench.plan.core")


def test_the_library_never_imports_the_cli() -> None:
    """The CLI is glue on top: nothing below it reaches back up (not even lazily, nor for
    types), so the library runs, and is tested, without it."""
    back = sorted(f"{m} -> {t}" for m in MODULES if layer(m) < layer("ckptbench.cli")
                  for t in GRAPH[m] if layer(t) == layer("ckptbench.cli"))
    assert not back, f"library modules import the CLI: {back}"


def private_uses(module: str, source: str | None = None) -> list[str]:
    """Where `module` uses another package module's private names: `from M import _x`,
    or `M._x` through an imported module (a leading underscore: that module's own)."""
    tree = ast.parse(source if source is not None else MODULES[module].read_text())
    path = MODULES.get(module)
    package = module if path is not None and path.name == "__init__.py" else \
        module.rpartition(".")[0]
    aliases: dict[str, str] = {}
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = import_base(node, package)
            if not base.startswith("ckptbench"):
                continue
            for a in node.names:
                if _private(a.name) and base != module:
                    out.append(f"from {base} import {a.name}")
                if f"{base}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ckptbench"):
                    aliases[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and aliases.get(node.value.id, module) != module):
            out.append(f"{node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_member_access_across_modules(module: str) -> None:
    """A module's `_names` are its own: another module that needs one needs a public
    name (or the code belongs with it)."""
    used = private_uses(module)
    assert not used, f"{module} uses other modules' private names: {used}"


def test_the_private_check_sees_uses() -> None:
    """The checker itself, on code that breaks the rule both ways and code that keeps it."""
    bad = ("from ckptbench.spec import _check_keys\n"
           "from ckptbench import units\n"
           "import ckptbench.fields as f\n"
           "units._split('1', 'x', 'y'); f._CONTROL\n")
    assert sorted(private_uses("ckptbench.measure", bad)) == [
        "f._CONTROL (ckptbench.fields)", "from ckptbench.spec import _check_keys",
        "units._split (ckptbench.units)"]
    good = "from ckptbench import units\nunits.parse_size('1', 'x')\nself._x = 1\n"
    assert private_uses("ckptbench.measure", good) == []


# Private names of other libraries that a module may use (their own seams, no public one).
FOREIGN_PRIVATE = {
    "_exit": "os._exit: a forked child ends without running the parent's cleanup",
    "_asdict": "a namedtuple's public method, underscored to avoid field names",
    "_strip_protocol": "fsspec's path normalization, which its file systems all define",
    "_reader_constructor": "torch DCP's S3 storage reader, swapped for ckptbench's",
}


def private_attribute_uses(module: str, source: str | None = None) -> list[str]:
    """Where `module` reaches a `_name` member of an object other than self or cls that
    the module itself never defines (as a function, class, attribute or name): another
    module's private member, reached through one of its objects."""
    tree = ast.parse(source if source is not None else MODULES[module].read_text())
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.alias):
            own.add(node.asname or node.name.rpartition(".")[2])
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr)
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            and node.attr not in own and node.attr not in FOREIGN_PRIVATE]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_member_of_another_modules_objects(module: str) -> None:
    """An object's `_names` belong to the module that defines its class: another module
    that needs one needs a public method (S3's read-ahead issues the reader's GETs
    through S3Reader.get_range, not its private _range)."""
    used = private_attribute_uses(module)
    assert not used, f"{module} reaches other modules' private members: {used}"


def test_the_private_member_check_sees_uses() -> None:
    bad = ("def f(reader):\n    return reader._range(0, b'')\n")
    assert private_attribute_uses("ckptbench.backends.s3.boto_readahead", bad) == [
        "line 2: reader._range"]
    good = ("class R:\n    def _range(self): ...\n\n"
            "def f(r: R):\n    return r._range(), self._x, os._exit\n")
    assert private_attribute_uses("ckptbench.backends.s3.boto_readahead", good) == []


def test_the_command_line_starts_without_matplotlib() -> None:
    """Every command's start is part of a restart's time (and of every test): matplotlib
    (about 1 s of imports on a small machine) loads only when a figure is drawn."""
    import subprocess
    import sys

    code = ("import sys, ckptbench.cli; ckptbench.cli._register(); "  # every command module
            "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "[]", out
