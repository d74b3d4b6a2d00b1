"""The import rules of docs/architecture.md, checked by reading every module's imports (AST).

1. The SDK (``sdk/rayform``) never imports the server stub, the tests or the benchmarks.
2. The SDK core (``rayform`` outside ``rayform/torch`` and ``rayform/integrations``) never
   imports torch, torchcodec, ``rayform.torch`` or ``rayform.integrations``: ``import rayform``
   must work without torch.
3. A private module or name (``_x``) is imported only from inside the package that owns it:
   ``rayform._ids`` from ``rayform`` and its subpackages, ``rayform.torch._index`` from
   ``rayform.torch``, ``rayform_server._video`` from ``rayform_server``. The server stub, the
   benchmarks and the scripts use public names (``rayform.format``, ``rayform.files``,
   ``rayform.errors``...).
4. Tests use the public home of the wire format (``rayform.format``), never ``rayform._ids``,
   ``rayform._hashing`` or ``rayform._blobfmt``; white-box unit tests of other private modules
   may import them. Tests import shared helpers from the ``support`` package, never from
   ``conftest``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Where each top-level package's modules live, and the module-name prefix of its files.
TREES = {
    "sdk": (REPO / "sdk", ""),
    "server": (REPO / "server_stub", ""),
    "bench": (REPO / "bench", "bench."),
    "scripts": (REPO / "scripts", "scripts."),
    "tests": (REPO / "tests", ""),
}

#: Imports of private modules that a rule above would refuse, each with the reason it stands.
ALLOWED_PRIVATE = {
    # Row 5 of the benchmark, the raw decode limit, decodes exactly the frames the dataset's
    # own grid needs with the SDK's own all-intra packet decoder: it measures below the API.
    ("bench.rows", "rayform.torch._index"),
    ("bench.rows", "rayform.torch._decoding"),
    # The resume benchmark times the order engine alone over a virtual 10^9-sample epoch, which
    # no dataset of this machine's size can hold: it measures below the API too.
    ("bench.resume", "rayform.torch._sampling"),
}

#: Our packages: the private-module rule is about how they depend on each other.
OWN = ("rayform", "rayform_server", "bench")
#: The wire format's private implementation, whose public home is ``rayform.format``.
WIRE_PRIVATE = ("rayform._ids", "rayform._hashing", "rayform._blobfmt")


def _module_name(path: Path, root: Path, prefix: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return prefix + ".".join(parts)


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every module or name that ``path`` imports, anywhere in it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"


def _all_imports(tree: str) -> Iterator[tuple[str, str, int, str]]:
    """``(file, importer module, line, imported name)`` over one tree of :data:`TREES`."""
    root, prefix = TREES[tree]
    for path in sorted(root.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(REPO).parts):
            continue
        module = _module_name(path, root, prefix)
        for line, name in _imports(path, module):
            yield str(path.relative_to(REPO)), module, line, name


def _private_owner(name: str) -> str | None:
    """The package that owns the first private component of ``name`` (``None``: all public)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_sdk_never_imports_the_server_tests_or_bench() -> None:
    bad = [f"{f}:{line} imports {name}" for f, _, line, name in _all_imports("sdk")
           if name.split(".")[0] in ("rayform_server", "tests", "bench", "conftest", "support")]
    assert not bad, "the SDK must work without the server stub:\n" + "\n".join(bad)


def test_the_sdk_core_never_imports_torch() -> None:
    heavy = ("torch", "torchcodec", "rayform.torch", "rayform.integrations")
    bad = [f"{f}:{line} imports {name}" for f, module, line, name in _all_imports("sdk")
           if not _within(module, "rayform.torch") and not _within(module, "rayform.integrations")
           and any(_within(name, h) for h in heavy)]
    assert not bad, ("`import rayform` must not need torch; move this into rayform/torch or "
                     "rayform/integrations:\n" + "\n".join(bad))


@pytest.mark.parametrize("tree", ["sdk", "server", "bench", "scripts"])
def test_private_modules_are_imported_only_inside_their_package(tree: str) -> None:
    bad = []
    for f, module, line, name in _all_imports(tree):
        owner = _private_owner(name)
        if owner is None or name.split(".")[0] not in OWN or _within(module, owner):
            continue
        if any(module == importer and _within(name, allowed) for importer, allowed in ALLOWED_PRIVATE):
            continue
        bad.append(f"{f}:{line} imports {name} (private to {owner})")
    assert not bad, ("use the public name instead (rayform.format, rayform.files, rayform.errors, "
                     "...), or make it public:\n" + "\n".join(bad))


def test_tests_use_the_public_wire_format_and_the_helpers_module() -> None:
    bad = []
    for f, _, line, name in _all_imports("tests"):
        if any(_within(name, w) for w in WIRE_PRIVATE):
            bad.append(f"{f}:{line} imports {name}: import it from rayform.format")
        if _within(name, "conftest"):
            bad.append(f"{f}:{line} imports {name}: conftest holds fixtures only; "
                       "import shared helpers from the support package")
    assert not bad, "\n".join(bad)


def test_the_rules_see_imports() -> None:
    """The checker itself: it finds nested, relative and from-imports of private names."""
    found = {name for _, module, _, name in _all_imports("server") if module == "rayform_server.cli"}
    assert "rayform_server.blobstore.configure_root" in found  # from-import of a name
    assert "rayform_server.app.create_app" in found  # imported inside a function
    assert _private_owner("rayform.torch._index.build_index") == "rayform.torch"
    assert _private_owner("rayform.format.hash_bytes") is None
    assert _private_owner("bench._data._StoreClient") == "bench"
