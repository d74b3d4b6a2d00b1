#!/usr/bin/env bash
# Creates .venv (if missing) and installs exactly what Rayform needs, CPU-only.
# Idempotent and fast when nothing changed. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# FFmpeg: the shared libraries for torchcodec, the ffmpeg CLI for tests that edit videos.
# grep reads all of ldconfig's list (not -q, which exits at the first match: ldconfig then
# dies of SIGPIPE, and pipefail read that as "missing" and ran apt-get again).
if ! ldconfig -p 2>/dev/null | grep 'libavcodec\.so' >/dev/null || ! command -v ffmpeg >/dev/null 2>&1; then
  need_apt+=(ffmpeg)
fi
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# Chromium: the docs test screenshots the built site headless (tests/docs/test_docs_site.py).
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# sshfs and sshd: the two-node cache tests (tests/cache/test_claims_nodes.py), which need root anyway.
if [ "$(id -u)" = 0 ]; then
  command -v sshfs >/dev/null 2>&1 || need_apt+=(sshfs)
  [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install these system packages first (FFmpeg shared libraries for torchcodec; chromium for the docs test): ${need_apt[*]}" >&2
    echo "       e.g. sudo apt-get install ${need_apt[*]}" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.rayform-installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "setup: installing rayform[torch,server,dev] into .venv (CPU torch 2.13.0, torchcodec 0.13.0)"
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned, so that nothing pulls a CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0" "torchcodec==0.13.0"
  .venv/bin/python -m pip install -q -e ".[torch,server,dev]"
  rm -f .venv/.rayform-installed-*
  touch "$stamp"
fi
.venv/bin/python -c "import rayform, rayform_server, torch, torchcodec; print('setup: ok (torch', torch.__version__ + ', torchcodec', torchcodec.__version__ + ')')"
