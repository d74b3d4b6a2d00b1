"""The ``rayform`` command line, optionally with the cache's coordination switched off first.

Usage: ``python rayform_cli.py [--no-claims] [--fake-locks] ARGS...``.

``--no-claims``: every download claim is granted at once, so processes (or nodes) never wait
for each other's downloads. ``--fake-locks``: every cache lock is granted at once, as on a
filesystem whose ``flock`` does nothing. Either is patched in before the command line is
imported.
"""

import contextlib
import sys
from typing import Any


def no_claims() -> None:
    import rayform.cache
    import rayform.cache._claims

    def granted(self: Any, *args: Any) -> contextlib.nullcontext[Any]:
        return contextlib.nullcontext(rayform.cache._claims.Claimed(None, None))

    setattr(rayform.cache.Cache, "_claim", granted)  # noqa: B010 - a stand-in for the method


def fake_locks() -> None:
    import rayform.cache

    def granted(*a: Any, **k: Any) -> contextlib.nullcontext[bool]:
        return contextlib.nullcontext(True)

    setattr(rayform.cache, "bounded_lock", granted)  # noqa: B010 - a stand-in for the lock


PATCHES = {"--no-claims": no_claims, "--fake-locks": fake_locks}

if __name__ == "__main__":
    args = sys.argv[1:]
    while args and args[0] in PATCHES:
        PATCHES[args.pop(0)]()
    from rayform.cli import main

    sys.exit(main(args))
