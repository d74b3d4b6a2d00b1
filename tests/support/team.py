"""Two real Unix users of one group, for the team-cache tests (``runuser``/``setpriv`` as them).

Created once per machine if missing and left in place, so that concurrent or later runs find
them. Needs root.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from pathlib import Path

__all__ = ["GROUP", "USERS", "ensure_users", "reachable"]

GROUP = "rfteam"
USERS = ("rfalice", "rfbob")


def ensure_users() -> None:
    """Add the group and its two users unless they exist."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "-f", GROUP], check=True)
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/sh", user], check=True)


def reachable(path: Path) -> None:
    """Let other users traverse to ``path`` (o+x on each parent that lacks it): the venv's
    interpreter and the checkout may live under root's home."""
    for p in [path, *path.parents]:
        mode = stat.S_IMODE(p.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(p, mode | stat.S_IXOTH | (stat.S_IROTH if p == path else 0))
