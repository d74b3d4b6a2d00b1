#!/usr/bin/env bash
# Builds the LeRobot peer environment in .peer-venv (gitignored) only if it is missing,
# then prints the path of its python. Used by tests/server/test_ingest_lerobot.py, which writes
# datasets with LeRobot's own writer and reads them back with LeRobotDataset.
# Usage: scripts/peer_lerobot.sh [VENV_DIR]      (default: <repo>/.peer-venv)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-"$repo/.peer-venv"}
setup=${RAYFORM_LEROBOT_SETUP:-"$repo/scripts/peer/lerobot/setup.sh"}
probe='from lerobot.datasets.lerobot_dataset import LeRobotDataset; import diffusers, blake3, platformdirs, tenacity, serial, gymnasium'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$probe" >/dev/null 2>&1; then
  echo "$venv/bin/python"
  exit 0
fi
if [ ! -f "$setup" ]; then
  echo "peer_lerobot.sh: $setup not found; set RAYFORM_LEROBOT_SETUP to LeRobot's setup.sh" >&2
  exit 2
fi
rm -rf "$venv"
bash "$setup" "$venv" >&2
echo "$venv/bin/python"
