#!/usr/bin/env bash
# Adds lerobot-lancedb (LanceDBDataset and lerobot-lance-convert, LeRobot's Lance layout) to
# the LeRobot 0.6.1 peer venv (scripts/peer_lerobot061.sh builds it when missing), then prints
# the path of its python. Used by `python -m bench.resize --data bench --lance PYTHON`.
# Pinned so that the venv's torch (2.11, what LeRobot 0.6.1 took) is not replaced: the install
# checks that torch's version is the same afterwards. pylance is lancedb's optional Lance
# binding (`import lance`), which the package's blob reads use.
# Usage: scripts/peer_lance.sh [VENV_DIR]      (default: <repo>/.peer-venv-061)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$(bash "$repo/scripts/peer_lerobot061.sh" "$@" | tail -n 1)
pins=(lerobot-lancedb==0.3.1 lancedb==0.40.0 pylance==14.0.2)
probe='import lance, lancedb, lerobot_lancedb; from lerobot_lancedb import LanceDBDataset'
if ! HF_HUB_OFFLINE=1 "$py" -c "$probe" >/dev/null 2>&1; then
  before=$("$py" -c 'import torch; print(torch.__version__)')
  "$py" -m pip install -q "${pins[@]}" >&2
  after=$("$py" -c 'import torch; print(torch.__version__)')
  if [ "$before" != "$after" ]; then
    echo "peer_lance.sh: installing ${pins[*]} replaced torch $before with $after" >&2
    exit 3
  fi
  HF_HUB_OFFLINE=1 "$py" -c "$probe"
fi
echo "$py"
