#!/usr/bin/env bash
# Set up, then run the main job on the embedded default: a few episodes with tool calls,
# an evaluation summary, and a rendered picture under outputs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
exec .venv/bin/python -m eval.demo "$@"
