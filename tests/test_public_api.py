"""The public API may grow, never shrink: names and signatures checked against a snapshot.

``tests/public_api.json`` records every public name (``rayform.__all__``, ``rayform.torch``,
``rayform.format``, ``rayform.files``, ``rayform.errors``, ``rayform.lerobot_layout``,
``rayform.ray``, the public methods and properties of ``Client``, ``Slice``,
``EpisodeDataset``, ``EpisodeSampler``, ``MixtureDataset``, ``Cache``, and of the segment
model ``Segments`` and its display side ``SegmentColumns``)
with its call signature, and the console scripts and entry points of ``pyproject.toml``. A
name may be added; none may disappear, and a recorded parameter keeps its name, kind and
default (new parameters must have defaults), so code written against an earlier release keeps
working when modules move.

After adding public API on purpose, refresh the snapshot:
``python tests/test_public_api.py --update``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import tomllib

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).resolve().parent / "public_api.json"
MODULES = (
    "rayform",
    "rayform.torch",
    "rayform.torch.lerobot",
    "rayform.format",
    "rayform.files",
    "rayform.errors",
    "rayform.lerobot_layout",
    "rayform.ray",
)
CLASSES = (
    "rayform.client:Client",
    "rayform.slice:Slice",
    "rayform.cache:Cache",
    "rayform.manifest:Segments",
    "rayform.manifest:SegmentColumns",
    "rayform.torch:EpisodeDataset",
    "rayform.torch:EpisodeSampler",
    "rayform.torch:MixtureDataset",
)


def _signature(obj: Any) -> list[list[Any]] | None:
    """``[[name, kind, default repr or None], ...]``, or None when it has none to read."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, p.kind.name, default])
    return out


def current() -> dict[str, Any]:
    """The public API as the checkout has it."""
    api: dict[str, Any] = {}
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name in sorted(getattr(mod, "__all__", [])):
            obj = getattr(mod, name)
            api[f"{mod_name}.{name}"] = _signature(obj) if callable(obj) else "value"
    for spec in CLASSES:
        mod_name, _, cls_name = spec.partition(":")
        cls = getattr(importlib.import_module(mod_name), cls_name)
        for name, member in sorted(vars(cls).items()):
            if name.startswith("_") and name not in ("__init__", "__len__", "__getitem__"):
                continue
            if isinstance(member, property):
                api[f"{mod_name}.{cls_name}.{name}"] = "property"
            elif isinstance(member, (classmethod, staticmethod)):
                api[f"{mod_name}.{cls_name}.{name}"] = _signature(member.__func__)
            elif callable(member):
                api[f"{mod_name}.{cls_name}.{name}"] = _signature(member)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for script, target in project["scripts"].items():
        api[f"script:{script}"] = target
    for group, points in project.get("entry-points", {}).items():
        for name, target in points.items():
            api[f"entry-point:{group}:{name}"] = target
    return api


def _resolves(target: str) -> bool:
    mod_name, _, attr = target.partition(":")
    if mod_name.startswith("rayform.integrations."):
        # Importing a tracker's plugin outside the tracker's own loading order warns (see
        # test_mlflow.py); that the module is there is what the entry point needs.
        return importlib.util.find_spec(mod_name) is not None
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj is not None


def test_no_public_name_or_parameter_disappears() -> None:
    recorded = json.loads(SNAPSHOT.read_text())
    now = current()
    gone = sorted(set(recorded) - set(now))
    assert not gone, f"public API removed: {gone} (add, never remove; see the module doc)"
    changed = []
    for name, sig in recorded.items():
        if not isinstance(sig, list) or not isinstance(now[name], list):
            if sig != now[name]:
                changed.append(f"{name}: {sig} -> {now[name]}")
            continue
        params = {p[0]: p for p in now[name]}
        for p in sig:
            if params.get(p[0]) != p:
                changed.append(f"{name}({p[0]}): {p} -> {params.get(p[0])}")
        for p in now[name]:
            new = p[0] not in {q[0] for q in sig}
            if new and p[2] is None and p[1] not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
                changed.append(f"{name}({p[0]}): a new parameter without a default")
    assert not changed, "public signatures changed incompatibly:\n" + "\n".join(changed)


def test_scripts_and_entry_points_resolve() -> None:
    for name, target in current().items():
        if name.startswith(("script:", "entry-point:")):
            assert _resolves(target), f"{name} -> {target} does not resolve"


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    api = current()  # one entry a line, so a change reads as a one-line diff
    lines = [f"{json.dumps(k)}: {json.dumps(api[k])}" for k in sorted(api)]
    SNAPSHOT.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {SNAPSHOT}")
