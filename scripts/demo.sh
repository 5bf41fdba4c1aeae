#!/usr/bin/env bash
# Set up, then run the main job on the embedded default: a few episodes with tool calls,
# an evaluation summary, and a rendered picture under outputs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m medvqa_env.demo "$@"
