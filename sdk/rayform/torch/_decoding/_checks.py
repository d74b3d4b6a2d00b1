"""The packet decoder's checks, kept on disk for the processes that come next.

Before the packet decoder (:mod:`._intra`) serves the videos of a signature (codec, size, pixel
format, colour space and range), a process decodes the first video's first and last frames
with the general backend too and compares the bits (``_video._checked_intra``). The general
backend is torchcodec, whose import is slow (it imports torch's compiler): every
fresh process paid it on its first video (a Ray worker's first read task, each DataLoader
worker of each epoch), though the verdict is a fact about the installed decoders, not about
the process. So a verdict is also written to ``decoder-checks.json`` in the user state
directory (``~/.local/state/rayform`` on Linux; ``XDG_STATE_HOME`` moves it), under a
fingerprint of everything it depends on:

* the versions of rayform, torch, torchcodec and PyAV (with its FFmpeg libraries' versions),
  and the size and modification time of rayform's decoding modules;
* the processor's model and instruction-set flags (FFmpeg's SIMD code is chosen by them);
* the path, size and modification time of every FFmpeg library the dynamic loader can find
  (``ldconfig``'s cache, ``LD_LIBRARY_PATH``, this environment's ``lib``) and of torchcodec's
  own libraries: the FFmpeg that torchcodec would load is among them.

Any change to those (an upgrade, another FFmpeg, another environment on a shared home) is
another fingerprint, whose signatures are checked again. A file that cannot be read or written
(a read-only home, a race with another process) only costs the check, never a wrong verdict:
a verdict is read back only under the same fingerprint and signature it was written with.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import platformdirs
import torch

from rayform import __version__

__all__ = ["fingerprint", "forget", "load", "path", "store"]

#: Fingerprints kept in the file (the most recent ones): old environments drop out.
_KEEP = 8
_FORMAT = 1
#: Prefixes of the FFmpeg libraries a general backend loads (and their neighbours).
_FFMPEG = ("libavcodec", "libavformat", "libavutil", "libswscale", "libswresample", "libavfilter")


def path() -> Path:
    """The file the verdicts are kept in."""
    return Path(platformdirs.user_state_dir("rayform")) / "decoder-checks.json"


def load(signature: tuple[Any, ...]) -> bool | None:
    """The verdict kept for ``signature`` under this process's :func:`fingerprint`, if any."""
    verdict = _kept().get(fingerprint(), {}).get(_key(signature))
    return verdict if isinstance(verdict, bool) else None


def store(signature: tuple[Any, ...], verdict: bool) -> None:
    """Keep ``verdict`` for ``signature`` under this process's fingerprint (best effort: a
    file that cannot be written is left as it is)."""
    kept = _kept()
    mine = kept.pop(fingerprint(), {})
    mine[_key(signature)] = bool(verdict)
    kept[fingerprint()] = mine  # last: the most recent fingerprint
    while len(kept) > _KEEP:
        kept.pop(next(iter(kept)))
    _write(kept)


def forget() -> None:
    """Drop every verdict kept under this process's fingerprint."""
    kept = _kept()
    if kept.pop(fingerprint(), None) is not None:
        _write(kept)


@functools.cache
def fingerprint() -> str:
    """A digest of the decoders this process would use (see the module's docstring); computed
    once per process (a forked child keeps its parent's: it has the same libraries)."""
    import av  # as in ._intra: PyAV loads only where the packet decoder runs

    parts = [
        f"format {_FORMAT}",
        f"rayform {__version__}",
        f"torch {torch.__version__}",
        f"av {av.__version__} {sorted(av.library_versions.items())}",
        f"torchcodec {_version('torchcodec')}",
        f"cpu {_cpu()}",
        f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}",
        f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}",
    ]
    here = Path(__file__).parent
    files = [here / name for name in ("_checks.py", "_intra.py", "_sws.py", "_video.py")]
    files += _torchcodec_libraries() + _ffmpeg_libraries()
    for file in files:
        try:
            st = file.stat()
        except OSError:
            parts.append(f"{file} missing")
        else:
            parts.append(f"{file} {st.st_size} {st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _cpu() -> str:
    """The processor's model and instruction-set flags: FFmpeg picks its SIMD code by them, so
    a home directory shared by nodes of different processors keeps a verdict per kind."""
    with contextlib.suppress(OSError):
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
        wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
        return "; ".join(line for line in first.splitlines() if line.startswith(wanted))
    return f"{platform.machine()} {platform.processor()}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _torchcodec_libraries() -> list[Path]:
    """The shared libraries of torchcodec, found without importing it (the import is the cost)."""
    try:
        spec = importlib.util.find_spec("torchcodec")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(
        p for d in spec.submodule_search_locations for p in Path(d).rglob("*.so*") if p.is_file()
    )


def _ffmpeg_libraries() -> list[Path]:
    """Every FFmpeg library the dynamic loader can find: ``ldconfig``'s cache, the
    ``LD_LIBRARY_PATH`` directories and this environment's ``lib`` (a conda FFmpeg)."""
    found: set[Path] = set()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listing = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        for line in listing.splitlines():
            name, _, target = line.partition("=>")
            if name.strip().startswith(_FFMPEG):
                found.add(Path(target.strip()))
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs.append(os.path.join(sys.prefix, "lib"))
    for directory in dirs:
        with contextlib.suppress(OSError):
            found.update(p for p in Path(directory).iterdir() if p.name.startswith(_FFMPEG))
    return sorted(found)


def _key(signature: tuple[Any, ...]) -> str:
    return json.dumps([str(part) for part in signature])


def _kept() -> dict[str, dict[str, Any]]:
    """The file's verdicts by fingerprint, oldest first; empty where it is missing, unreadable
    or not this format."""
    try:
        doc = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    kept = (
        doc.get("fingerprints") if isinstance(doc, dict) and doc.get("format") == _FORMAT else None
    )
    if not isinstance(kept, dict):
        return {}
    return {k: v for k, v in kept.items() if isinstance(v, dict)}


def _write(kept: dict[str, dict[str, Any]]) -> None:
    """Replace the file whole (a reader sees the old or the new one, never a part)."""
    doc = {"format": _FORMAT, "fingerprints": kept}
    target = path()
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".decoder-checks-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
