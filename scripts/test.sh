#!/usr/bin/env bash
# Set up, then run the test suite: the fast suite by default (tests marked `slow` left out), or
# whatever pytest arguments are given (`bash scripts/test.sh -m slow` runs the slow ones; .ci/run runs both).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ $# -eq 0 ]]; then
  set -- -m "not slow"
fi
exec .venv/bin/python -m pytest "$@"
