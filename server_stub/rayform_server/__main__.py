"""``python -m rayform_server``: the same as the ``rayform-server`` command."""

import sys

from rayform_server.cli import main

if __name__ == "__main__":  # not when re-imported by a spawned worker process
    sys.exit(main())
