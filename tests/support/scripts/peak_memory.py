"""Ask a (hostile) server for a slice; on the ``RayformError`` it must end in, print the
error's type and this process's peak resident memory in MiB.

Usage: ``python peak_memory.py ENDPOINT TOKEN CACHE_DIR SLICE``.
"""

import sys

import rayform


def main(endpoint: str, token: str, cache_dir: str, slice_id: str) -> None:
    client = rayform.Client(endpoint, token, cache_dir=cache_dir)
    try:
        client.slices.get(slice_id)
    except rayform.RayformError as exc:
        with open("/proc/self/status") as status:
            peak = next(line for line in status if line.startswith("VmHWM:"))
        print(type(exc).__name__, int(peak.split()[1]) // 1024)


if __name__ == "__main__":
    main(*sys.argv[1:5])
