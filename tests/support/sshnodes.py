"""Two "nodes" sharing one cache directory, as on a cluster: two independent sshfs mounts.

An ``sshd`` with its own configuration, host key and client key (all in a temporary directory)
listens on a free loopback port and serves one directory over SFTP; each node is an sshfs
mount of it. Each mount has its own kernel caches (sshfs keeps attributes for 20 s), and
``flock`` does not cross them, as on NFS without lockd or Lustre without ``-o flock``.
Processes of a node run in their own UTS namespace with the node's host name (``unshare``),
so the SDK sees two hosts and cannot check the other node's pids.

Needs root (``/dev/fuse``, ``unshare``, ``allow_other`` mounts, ``setpriv``) and the Debian
packages ``sshfs`` and ``openssh-server``; :func:`missing` says what is absent.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SshNodes", "missing"]

_TOOLS = ("sshfs", "sshd", "ssh-keygen", "fusermount", "unshare", "setpriv")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing() -> str | None:
    """Why two sshfs nodes cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (FUSE mounts with allow_other, unshare --uts, setpriv)"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse for sshfs"
    absent = [t for t in _TOOLS if _which(t) is None]
    if absent:
        return f"needs {', '.join(absent)} (apt-get install sshfs openssh-server)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SshNodes:
    """An sshd on loopback serving ``export``, and sshfs mounts of it (:meth:`mount`).

    Use as a context manager: leaving it unmounts every mount and stops the sshd, also
    after a failure.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rayform-nodes-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.export = self.dir / "export"
        self.export.mkdir()
        self.port = _free_port()
        self._mounts: list[Path] = []
        self._sshd: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SshNodes:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        keygen = _which("ssh-keygen")
        assert keygen is not None
        for key in ("host", "client"):
            subprocess.run(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / key)], check=True
            )
        (self.dir / "authorized_keys").write_bytes((self.dir / "client.pub").read_bytes())
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.dir / 'host'}",
                    f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM yes",
                    "PidFile none",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        sshd = _which("sshd")
        assert sshd is not None
        self._log = (self.dir / "sshd.log").open("wb")
        self._sshd = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(config)], stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._sshd.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("sshd did not listen within 20 s")

    def mount(self, name: str, login: str = "root") -> Path:
        """Mount the export at ``DIR/name`` as the SFTP user ``login`` (what a node's writes
        are done as on the server); every local user may use the mount."""
        point = self.dir / name
        point.mkdir()
        opts = (
            f"IdentityFile={self.dir / 'client'},StrictHostKeyChecking=no,"
            "UserKnownHostsFile=/dev/null,BatchMode=yes,allow_other,LogLevel=ERROR"
        )
        subprocess.run(
            [
                "sshfs",
                "-p",
                str(self.port),
                "-o",
                opts,
                f"{login}@127.0.0.1:{self.export}",
                str(point),
            ],
            check=True,
            timeout=60,
            capture_output=True,
        )
        self._mounts.append(point)
        return point

    def run_on(
        self,
        node: str,
        cmd: Sequence[str],
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        **popen: object,
    ) -> subprocess.Popen[str]:
        """Start ``cmd`` as on host ``node`` (its own UTS namespace), as ``user`` if given.

        Every step execs the next, so the returned process is ``cmd`` itself (a SIGKILL
        reaches it)."""
        prefix = []
        if user:
            pw = pwd.getpwnam(user)
            prefix = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]
        full = [
            "unshare",
            "--uts",
            "sh",
            "-c",
            f'hostname {node} && exec "$@"',
            "sh",
            *prefix,
            *cmd,
        ]
        return subprocess.Popen(full, env=env, text=True, **popen)  # type: ignore[call-overload]

    def close(self) -> None:
        """Unmount everything (lazily if still busy) and stop the sshd; remove the directory."""
        for point in reversed(self._mounts):
            done = subprocess.run(["fusermount", "-u", str(point)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
        self._mounts.clear()
        if self._sshd is not None:
            self._sshd.terminate()
            try:
                self._sshd.wait(10)
            except subprocess.TimeoutExpired:
                self._sshd.kill()
                self._sshd.wait()
            self._log.close()
            self._sshd = None
        shutil.rmtree(self.dir, ignore_errors=True)
