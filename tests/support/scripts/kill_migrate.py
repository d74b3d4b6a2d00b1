"""Run ``rayform-server migrate ROOT`` and SIGKILL it at one point of a slice's migration.

Usage: ``python kill_migrate.py ROOT WHEN``; ``WHEN`` is ``before-the-reference-moves`` (every
new object written, the slice's reference not yet moved) or ``after-the-reference-moves`` (the
reference moved, the old history markers not yet removed). The process dies of SIGKILL there,
as a crash or an operator's ``kill -9`` would leave it.
"""

import os
import signal
import sys

from rayform_server.cli import main
from rayform_server.store import Store


def die(*args: object, **kwargs: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    root, when = sys.argv[1:3]
    if when == "before-the-reference-moves":
        Store.set_slice = die  # type: ignore[method-assign,assignment]
    else:
        Store.forget = die  # type: ignore[method-assign,assignment]
    sys.exit(main(["migrate", root]))
