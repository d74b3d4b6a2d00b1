"""The import rules of docs/architecture.md, checked by reading every module's imports (AST).

1. The SDK (``sdk/rayform``) never imports the server stub, the tests or the benchmarks.
2. The SDK core (``rayform`` outside ``rayform/torch``, ``rayform/integrations`` and
   ``rayform/ray``) never imports torch, torchcodec, ``rayform.torch`` or
   ``rayform.integrations``: ``import rayform`` must work without torch. Only ``rayform/ray``
   imports Ray (or ``rayform.ray``): the core and ``rayform.torch`` work without it.
3. A private module or name (``_x``) is imported only from inside the package that owns it:
   ``rayform._ids`` from ``rayform`` and its subpackages, ``rayform.torch._index`` from
   ``rayform.torch``, ``rayform_server._video`` from ``rayform_server``. The server stub, the
   benchmarks and the scripts use public names (``rayform.format``, ``rayform.files``,
   ``rayform.errors``...).
4. Tests use the public home of the wire format (``rayform.format``), never ``rayform._ids``,
   ``rayform._hashing`` or ``rayform._blobfmt``; white-box unit tests of other private modules
   may import them. Tests import shared helpers from the ``support`` package, never from
   ``conftest``.

Rule 7 there: a private module of the root package (``rayform/_x.py``) has more than one user
in the SDK; a helper with one user lives beside it, in the user's package or a package of its
part.
"""

from __future__ import annotations

import ast
import tempfile
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
    # Its decode-and-resize variant resizes as the dataset does: the same geometry (Target).
    ("bench.rows", "rayform._resolution"),
    # The resume benchmark times the order engine alone over a virtual 10^9-sample epoch, which
    # no dataset of this machine's size can hold: it measures below the API too.
    ("bench.resume", "rayform.torch._sampling"),
    # A Ray read task lends the reader memory that the next block overwrites: only a caller
    # that hands each batch on (Ray copies it into its object store) before reading the next
    # may, which no user of rayform.torch does.
    ("rayform.ray._data", "rayform.torch._batchmem"),
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


def _is_package(dotted: str) -> bool:
    parts = dotted.split(".")
    roots = [REPO / "sdk", REPO / "server_stub", REPO]
    return any(root.joinpath(*parts, "__init__.py").is_file() for root in roots)


def _private_owner(name: str) -> str | None:
    """The package that owns the last private component of ``name`` (``None``: all public):
    a private module belongs to the package that holds it, and a private name to its module's
    package. So ``rayform.torch._sampling._order`` is private to ``rayform.torch._sampling``
    (whose ``__init__`` is the face the rest of ``rayform.torch`` imports)."""
    parts = name.split(".")
    last = None
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            last = i
    if last is None:
        return None
    prefix = ".".join(parts[:last])
    return prefix if _is_package(prefix) or last <= 1 else ".".join(parts[: last - 1])


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_sdk_never_imports_the_server_tests_or_bench() -> None:
    bad = [
        f"{f}:{line} imports {name}"
        for f, _, line, name in _all_imports("sdk")
        if name.split(".")[0] in ("rayform_server", "tests", "bench", "conftest", "support")
    ]
    assert not bad, "the SDK must work without the server stub:\n" + "\n".join(bad)


def test_the_sdk_core_never_imports_torch() -> None:
    heavy = ("torch", "torchcodec", "rayform.torch", "rayform.integrations")
    bad = [
        f"{f}:{line} imports {name}"
        for f, module, line, name in _all_imports("sdk")
        if not _within(module, "rayform.torch")
        and not _within(module, "rayform.integrations")
        and not _within(module, "rayform.ray")
        and any(_within(name, h) for h in heavy)
    ]
    assert not bad, (
        "`import rayform` must not need torch; move this into rayform/torch or "
        "rayform/integrations:\n" + "\n".join(bad)
    )


def test_only_rayform_ray_imports_ray() -> None:
    bad = [
        f"{f}:{line} imports {name}"
        for f, module, line, name in _all_imports("sdk")
        if not _within(module, "rayform.ray")
        and (_within(name, "ray") or _within(name, "rayform.ray"))
    ]
    assert not bad, (
        "Ray is the optional `ray` extra: only rayform/ray may import it (and rayform.ray):\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize("tree", ["sdk", "server", "bench", "scripts"])
def test_private_modules_are_imported_only_inside_their_package(tree: str) -> None:
    bad = []
    for f, module, line, name in _all_imports(tree):
        owner = _private_owner(name)
        if owner is None or name.split(".")[0] not in OWN or _within(module, owner):
            continue
        if any(
            module == importer and _within(name, allowed) for importer, allowed in ALLOWED_PRIVATE
        ):
            continue
        bad.append(f"{f}:{line} imports {name} (private to {owner})")
    assert not bad, (
        "use the public name instead (rayform.format, rayform.files, rayform.errors, "
        "...), or make it public:\n" + "\n".join(bad)
    )


#: Private modules of the root package (``rayform/_x.py``) with one user in the SDK that stay
#: at the root anyway, each with its reason.
ROOT_SINGLE_USER: dict[str, str] = {
    "rayform._export_cli": (
        "the `rayform export` subcommand, split out of rayform.cli (its one user, itself at the "
        "root, 486 lines) so that the command line's core stays small; it cannot live beside "
        "the export in rayform.torch.lerobot, which needs torch, while the CLI must parse "
        "without it"
    ),
}


def _root_private_users() -> dict[str, set[str]]:
    """Each private module of the root package (``rayform._x``, a file, not a package) and the
    SDK modules that import it or a name from it."""
    root = TREES["sdk"][0] / "rayform"
    users: dict[str, set[str]] = {f"rayform.{p.stem}": set() for p in root.glob("_*.py")}
    users.pop("rayform.__init__", None)
    users.pop("rayform.__main__", None)
    for _, module, _, name in _all_imports("sdk"):
        for target in users:
            if _within(name, target) and module != target:
                users[target].add(module)
    return users


def test_a_private_root_module_has_more_than_one_user() -> None:
    """The root package holds what several parts share; a helper with one user lives beside
    it, in the user's package (``rayform._net._progress``) or in a package of that part
    (``rayform._resolve``)."""
    lonely = {
        module: sorted(users)
        for module, users in _root_private_users().items()
        if len(users) < 2 and module not in ROOT_SINGLE_USER
    }
    assert not lonely, (
        "a private module of the root package with one user (or none): move it beside its "
        "user, or list it in ROOT_SINGLE_USER with the reason it stays\n"
        + "\n".join(f"{m}: used by {u or 'nothing'}" for m, u in sorted(lonely.items()))
    )


def test_tests_use_the_public_wire_format_and_the_helpers_module() -> None:
    bad = []
    for f, _, line, name in _all_imports("tests"):
        if any(_within(name, w) for w in WIRE_PRIVATE):
            bad.append(f"{f}:{line} imports {name}: import it from rayform.format")
        if _within(name, "conftest"):
            bad.append(
                f"{f}:{line} imports {name}: conftest holds fixtures only; "
                "import shared helpers from the support package"
            )
    assert not bad, "\n".join(bad)


def test_the_rules_see_imports() -> None:
    """The checker itself: it finds nested, relative and from-imports of private names."""
    found = {
        name for _, module, _, name in _all_imports("server") if module == "rayform_server.cli"
    }
    assert "rayform_server.blobstore.configure_root" in found  # from-import of a name
    assert "rayform_server.app.create_app" in found  # imported inside a function
    assert _private_owner("rayform.torch._index.build_index") == "rayform.torch"
    assert _private_owner("rayform.format.hash_bytes") is None
    assert _private_owner("bench._data._StoreClient") == "bench"
    assert (
        _private_owner("rayform.torch._sampling._order.episode_streams")
        == "rayform.torch._sampling"
    )
    assert _private_owner("rayform.uri._dataset._shown") == "rayform.uri"
    assert _private_owner("rayform._net.Transport") == "rayform"
    assert _private_owner("rayform._net._progress.byte_bar") == "rayform._net"
    assert _private_owner("rayform._resolve.open_manifest") == "rayform"
    users = _root_private_users()
    assert "rayform._net" not in users and "rayform.units" not in users  # root files, private
    assert {"rayform.client", "rayform.cli"} <= users["rayform._limits"]  # `from x import y`
    assert "rayform.manifest._display" in users["rayform._html"]  # `from rayform import _html`


# -- import cycles and private reach-ins (the SDK and the server stub) -------------------------
#: Reads of a private attribute defined by a class of another module, each with its reason.
ALLOWED_PRIVATE_ATTRS = {
    # A namedtuple's own API (``_fields``, ``_asdict``, ``_replace``, ``_make``), not ours.
    "_fields",
    "_asdict",
    "_replace",
    "_make",
    # torch's shared-memory storage constructor, which the collate function calls like torch's.
    "_new_shared",
}
#: Import cycles that stand, each with its reason (none today: type-only and in-function
#: imports count, so a circle cannot hide behind ``TYPE_CHECKING``).
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _own_modules() -> dict[str, Path]:
    out = {}
    for tree in ("sdk", "server"):
        root, prefix = TREES[tree]
        for path in sorted(root.rglob("*.py")):
            if not any(part.startswith(".") for part in path.relative_to(REPO).parts):
                out[_module_name(path, root, prefix)] = path
    return out


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> modules it imports anywhere in it: at the top, inside functions, and under
    ``if TYPE_CHECKING:`` (an import for annotations only is still a dependency a reader must
    hold in mind); an edge goes to the imported module itself, not to the ``__init__`` of the
    packages above it."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    cycles = [c for c in _cycles(_edges(_own_modules())) if frozenset(c) not in ALLOWED_CYCLES]
    assert not cycles, (
        "modules that import each other (directly or around a circle; an import "
        "inside a function or under TYPE_CHECKING counts): move what both need into a "
        "module of its own, type against a Protocol (rayform._seams), or pass it in\n"
        + "\n".join(" <-> ".join(c) for c in cycles)
    )


def _private_attrs_by_module(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Private attribute names (``_x``) each module's classes define: methods, class
    attributes and ``self._x = ...`` assignments."""
    out: dict[str, set[str]] = {}
    for module, path in modules.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner is not node:
                    names.add(inner.name)
                elif isinstance(inner, (ast.Assign, ast.AnnAssign)):
                    for target in (
                        inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    ):
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                        elif (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id in ("self", "cls")
                        ):
                            names.add(target.attr)
        out[module] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return out


def _private_reads(modules: dict[str, Path]) -> list[str]:
    defined = _private_attrs_by_module(modules)
    owners: dict[str, set[str]] = {}
    for module, names in defined.items():
        for name in names:
            owners.setdefault(name, set()).add(module)
    bad = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                not isinstance(node, ast.Attribute)
                or not node.attr.startswith("_")
                or node.attr.startswith("__")
            ):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "super"):
                continue
            if node.attr in ALLOWED_PRIVATE_ATTRS or node.attr in defined[module]:
                continue  # this module's own classes define it: a read of its own
            others = owners.get(node.attr, set()) - {module}
            if others:
                bad.append(
                    f"{path.relative_to(REPO)}:{node.lineno} reads .{node.attr} "
                    f"(private to {', '.join(sorted(others))})"
                )
    return bad


def test_no_module_reads_another_modules_private_attributes() -> None:
    bad = _private_reads(_own_modules())
    assert not bad, (
        "a private attribute of another module's class: add a public method or "
        "property to that class (or pass what is needed in)\n" + "\n".join(bad)
    )


def test_the_cycle_and_reach_in_checks_see_what_they_look_for() -> None:
    """The checkers themselves, on small made-up graphs and modules."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    with tempfile.TemporaryDirectory() as tmp:
        files = {
            "a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n",
            "b": "def f():\n    import a\n",
        }
        modules = {}
        for name, text in files.items():
            modules[name] = Path(tmp, f"{name}.py")
            modules[name].write_text(text)
        graph = _edges(modules)
    assert graph == {"a": {"b"}, "b": {"a"}}  # a type-only and an in-function import count
    assert _cycles(graph) == [["a", "b"]]
