"""The rules of docs/architecture.md that an import linter cannot check, and the linter itself.

Rules 1, 2, 3 (for modules) and 5 are `import-linter` contracts (``[tool.importlinter]`` in
pyproject.toml): :func:`test_the_import_contracts_hold` runs ``lint-imports`` and
:func:`test_the_import_linter_sees_what_it_looks_for` shows, on a made-up package, that it
finds an import inside a function, one under ``TYPE_CHECKING``, a cycle and a private import.
Checked here by reading every module (AST):

3. A private *name* (``from rayform.client import _x``) is imported only from inside the
   package that owns it; a private module is the linter's (in the scripts, which are no
   package, both are checked here).
4. Tests use the public home of the wire format (``rayform.format``), never ``rayform._ids``,
   ``rayform._hashing`` or ``rayform._blobfmt``; white-box unit tests of other private modules
   may import them. Tests import shared helpers from the ``support`` package, never from
   ``conftest``.
6. No module reads a private attribute that a class of another module defines.
7. A private module of the root package (``rayform/_x.py``) has more than one user in the
   SDK; a helper with one user lives beside it, in the user's package or a package of its
   part.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from importlinter.api import read_configuration

REPO = Path(__file__).resolve().parents[1]

#: Where each top-level package's modules live, and the module-name prefix of its files.
TREES = {
    "sdk": (REPO / "sdk", ""),
    "server": (REPO / "server_stub", ""),
    "bench": (REPO / "bench", "bench."),
    "scripts": (REPO / "scripts", "scripts."),
    "tests": (REPO / "tests", ""),
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


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    roots = [REPO / "sdk", REPO / "server_stub", REPO]
    return _is_package(dotted) or any(
        root.joinpath(*parts[:-1], parts[-1] + ".py").is_file() for root in roots
    )


def _through_last_private(name: str) -> str:
    """``name`` up to its last private component: ``rayform.torch._index`` for
    ``rayform.torch._index.build_index``."""
    parts = name.split(".")
    last = max(i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__"))
    return ".".join(parts[: last + 1])


@pytest.mark.parametrize("tree", ["sdk", "server", "bench", "scripts"])
def test_private_names_are_imported_only_inside_their_package(tree: str) -> None:
    bad = []
    for f, module, line, name in _all_imports(tree):
        owner = _private_owner(name)
        if owner is None or name.split(".")[0] not in OWN or _within(module, owner):
            continue
        if tree != "scripts" and _is_module(_through_last_private(name)):
            continue  # a private module: import-linter's contract 3 (and its exceptions)
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
        if name.split(".")[0].startswith("test_"):
            bad.append(
                f"{f}:{line} imports {name}: a test module never imports another; "
                "move what both need into the support package"
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


# -- private reach-ins (the SDK and the server stub) -------------------------------------------
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


def _own_modules() -> dict[str, Path]:
    out = {}
    for tree in ("sdk", "server"):
        root, prefix = TREES[tree]
        for path in sorted(root.rglob("*.py")):
            if not any(part.startswith(".") for part in path.relative_to(REPO).parts):
                out[_module_name(path, root, prefix)] = path
    return out


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
                    f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:"
                    f"{node.lineno} reads .{node.attr} "
                    f"(private to {', '.join(sorted(others))})"
                )
    return bad


def test_no_module_reads_another_modules_private_attributes() -> None:
    bad = _private_reads(_own_modules())
    assert not bad, (
        "a private attribute of another module's class: add a public method or "
        "property to that class (or pass what is needed in)\n" + "\n".join(bad)
    )


def test_the_reach_in_check_sees_what_it_looks_for() -> None:
    """The checker itself, on two made-up modules."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {
            "a": "class A:\n    def _hidden(self):\n        return self._hidden()\n",
            "b": "from a import A\n\ndef f(x: A):\n    return x._hidden(), x._fields\n",
        }
        modules = {}
        for name, text in files.items():
            modules[name] = Path(tmp, f"{name}.py")
            modules[name].write_text(text)
        bad = _private_reads(modules)
    assert len(bad) == 1 and "reads ._hidden (private to a)" in bad[0]


# -- import-linter: rules 1, 2, 3 (modules) and 5 ---------------------------------------------
def _lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is missing: pip install -e '.[dev]'"
    return subprocess.run(
        [exe, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_import_contracts_hold() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BROKEN" not in done.stdout and done.stdout.count("KEPT") == 5


def test_every_part_of_the_sdk_is_placed_by_the_torch_contract() -> None:
    """A new child of ``rayform`` must be listed among the core's modules (which never import
    torch or Ray) or be one of the parts that may: else the contract would not see it."""
    config = read_configuration(str(REPO / "pyproject.toml"))["contracts_options"]
    core = next(c for c in config if c["name"].startswith("2. The SDK core"))
    root = REPO / "sdk" / "rayform"
    children = {
        f"rayform.{p.stem}"
        for p in root.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    heavy = {"rayform.torch", "rayform.integrations", "rayform.ray"}
    assert children - heavy == set(core["source_modules"]), (
        "list a new module of sdk/rayform in the core's source_modules in pyproject.toml "
        "(or remove a gone one)"
    )


_MADE_UP_CONFIG = """
[tool.importlinter]
root_packages = ["made"]
include_external_packages = true
exclude_type_checking_imports = false

[[tool.importlinter.contracts]]
name = "core never imports heavy"
type = "forbidden"
source_modules = ["made.core"]
forbidden_modules = ["made.heavy"]

[[tool.importlinter.contracts]]
name = "private"
type = "private_modules"

[[tool.importlinter.contracts]]
name = "cycles"
type = "acyclic_siblings"
ancestors = ["made"]
"""


def test_the_import_linter_sees_what_it_looks_for(tmp_path: Path) -> None:
    """On a made-up package: an import inside a function breaks a forbidden contract, a
    private module imported from outside its package breaks the private one, and a cycle that
    one side closes under ``TYPE_CHECKING`` breaks the acyclic one."""
    files = {
        "made/__init__.py": "",
        "made/heavy/__init__.py": "",
        "made/heavy/_inner.py": "",
        "made/core/__init__.py": "def f():\n    import made.heavy\n",
        "made/a.py": "from made import b\n",
        "made/b.py": (
            "from typing import TYPE_CHECKING\nimport made.heavy._inner\n"
            "if TYPE_CHECKING:\n    import made.a\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "pyproject.toml").write_text(_MADE_UP_CONFIG)
    done = _lint_imports(tmp_path)
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, out
    assert "core never imports heavy BROKEN" in out and "made.core -> made.heavy" in out
    assert "private BROKEN" in out and "made.b -> made.heavy._inner" in out
    assert "cycles BROKEN" in out
