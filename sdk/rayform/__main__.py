"""``python -m rayform``: the ``rayform`` command line."""

import sys

from rayform.cli import main

sys.exit(main())
