#!/usr/bin/env bash
# Builds LeRobot 0.6.1 in .peer-venv-061 (gitignored) only if it is missing, then prints the
# path of its python. Used by `python -m bench.resize --lerobot --lerobot-python PYTHON` and by
# `python -m bench.ray_lerobot`, whose `ray.data.read_lerobot` side needs Ray Data in it too:
# a venv that has LeRobot but not Ray gets Ray added, not rebuilt (the rebuild is ~5 GB).
# LeRobot 0.6.1 needs Python 3.12 and takes the registry's torch 2.11 build (CUDA-linked,
# about 5 GB installed; it runs on CPU). Its dataset extra brings `datasets` and torchcodec.
# Usage: scripts/peer_lerobot061.sh [VENV_DIR]      (default: <repo>/.peer-venv-061)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-"$repo/.peer-venv-061"}
probe='from lerobot.datasets.lerobot_dataset import LeRobotDataset'
ray='ray[data]==2.60.0'
if [ -x "$venv/bin/python" ] && HF_HUB_OFFLINE=1 "$venv/bin/python" -c "$probe" >/dev/null 2>&1; then
  "$venv/bin/python" -c 'import ray.data' >/dev/null 2>&1 || "$venv/bin/pip" install -q "$ray" >&2
  echo "$venv/bin/python"
  exit 0
fi
py=""
# A pyenv shim answers to python3.12 even when that version is not selected: try each.
for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
  if "$candidate" --version >/dev/null 2>&1; then
    py=$candidate
    break
  fi
done
if [ -z "$py" ]; then
  echo "peer_lerobot061.sh: LeRobot 0.6.1 needs Python 3.12 (no working python3.12 found)" >&2
  exit 2
fi
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/pip" install -q 'lerobot[dataset]==0.6.1' "$ray" >&2
HF_HUB_OFFLINE=1 "$venv/bin/python" -c "$probe; import ray.data"
echo "$venv/bin/python"
