"""The ``rayform`` command line, optionally with the cache's coordination switched off first.

Usage: ``python rayform_cli.py [--no-claims] ARGS...``.

``--no-claims``: every download claim is granted at once, so processes (or nodes) never wait
for each other's downloads (the cache's one lock per blob is the claim). It is patched in
before the command line is imported.
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


PATCHES = {"--no-claims": no_claims}

if __name__ == "__main__":
    args = sys.argv[1:]
    while args and args[0] in PATCHES:
        PATCHES[args.pop(0)]()
    from rayform.cli import main

    sys.exit(main(args))
