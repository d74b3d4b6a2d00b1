#!/usr/bin/env bash
# Creates .venv (if missing) and installs exactly what Rayform needs, CPU-only.
# Idempotent and fast when nothing changed. Usage: scripts/setup.sh [full|demo]
#   full (the default, `make test`): rayform[torch,server,dev] and, as root, every system
#        package the tests use (FFmpeg, curl, chromium, sshfs, openssh-server);
#   demo (`make demo`): rayform[torch,server] and FFmpeg only.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-full}
case "$mode" in
  full) extras="torch,server,dev" ;;
  demo) extras="torch,server" ;;
  *) echo "setup: unknown mode '$mode': use full (everything make test needs) or demo" >&2; exit 2 ;;
esac

need_apt=()
# FFmpeg: the shared libraries for torchcodec, the ffmpeg CLI for tests that edit videos.
# grep reads all of ldconfig's list (not -q, which exits at the first match: ldconfig then
# dies of SIGPIPE, and pipefail read that as "missing" and ran apt-get again).
if ! ldconfig -p 2>/dev/null | grep 'libavcodec\.so' >/dev/null || ! command -v ffmpeg >/dev/null 2>&1; then
  need_apt+=(ffmpeg)
fi
if [ "$mode" = full ]; then
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
  # Chromium: the docs and viewer tests drive it headless (tests/docs, tests/view).
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # sshfs and sshd: the two-node cache tests (tests/cache/test_claims_nodes.py), which need root anyway.
  if [ "$(id -u)" = 0 ]; then
    command -v sshfs >/dev/null 2>&1 || need_apt+=(sshfs)
    [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
  fi
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install these system packages first (FFmpeg shared libraries for torchcodec; chromium for the browser tests): ${need_apt[*]}" >&2
    echo "       e.g. sudo apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# One stamp per mode and pyproject.toml: a `make test` after a `make demo` finds no full stamp
# and installs the rest; the full set also satisfies the demo.
digest=$(sha1sum pyproject.toml | cut -c1-12)
stamp=.venv/.rayform-installed-$mode-$digest
full_stamp=.venv/.rayform-installed-full-$digest
if [ ! -f "$stamp" ] && [ ! -f "$full_stamp" ]; then
  echo "setup: installing rayform[$extras] into .venv (CPU torch 2.13.0, torchcodec 0.13.0)"
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned, so that nothing pulls a CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0" "torchcodec==0.13.0"
  .venv/bin/python -m pip install -q -e ".[$extras]"
  rm -f .venv/.rayform-installed-*
  touch "$stamp"
fi
.venv/bin/python -c "import rayform, rayform_server, torch, torchcodec; print('setup: ok (torch', torch.__version__ + ', torchcodec', torchcodec.__version__ + ')')"
