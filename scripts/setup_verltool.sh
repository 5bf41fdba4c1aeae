#!/usr/bin/env bash
# verl-tool's tool server in its own venv (.venv-verltool), beside (never inside) the project's .venv,
# for running it side by side with `medvqa-tools serve` (benchmarks/bench_seed_wire.py).
#
#   scripts/setup_verltool.sh                          # from the package index, if verl-tool is published there
#   VERLTOOL_SRC=/path/to/verl-tool scripts/setup_verltool.sh   # else from a checkout of TIGER-AI-Lab/verl-tool
#
# Checked 2026-12-04 on the project's VM: `pip download --no-deps verl-tool` finds no distribution on
# the index it reaches, and no checkout is on disk, so benchmarks/bench_seed_wire.py measures a
# reproduction of verl-tool's crop response instead (its "verl-tool crop (reproduction)" row; see
# that file's docstring). With this venv, verl-tool's own server starts as its README says:
#   .venv-verltool/bin/python -m verl_tool.servers.serve --host 127.0.0.1 --port 5500 \
#       --tool_type pixel_reasoner --workers_per_tool 1
# and answers turns such as <tool_call>{"name": "crop_image", "arguments": {"bbox_2d": [...], "target_image": 1}}</tool_call>.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-verltool}
PY=${PYTHON:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if "$PY" -m pip download --no-deps --quiet verl-tool -d "$tmp" >/dev/null 2>&1; then
    source="verl-tool"
elif [ -n "${VERLTOOL_SRC:-}" ]; then
    if [ ! -f "$VERLTOOL_SRC/pyproject.toml" ]; then
        echo "setup_verltool: VERLTOOL_SRC=$VERLTOOL_SRC has no pyproject.toml; expected a checkout of TIGER-AI-Lab/verl-tool" >&2
        exit 1
    fi
    source="$VERLTOOL_SRC"
else
    echo "setup_verltool: verl-tool is not on the package index this machine reaches, and VERLTOOL_SRC is not set;" >&2
    echo "  give a checkout (VERLTOOL_SRC=/path/to/verl-tool), or use bench_seed_wire.py's reproduction row." >&2
    exit 1
fi

"$PY" -m venv "$VENV"
# its server: FastAPI + uvicorn + fire; the crop tool needs Pillow and qwen_vl_utils (a declared dependency)
"$VENV/bin/pip" install --quiet fastapi uvicorn httpx fire pillow
"$VENV/bin/pip" install --quiet "$source"
"$VENV/bin/python" -c "import verl_tool.servers.serve" && echo "setup_verltool: verl-tool's server is in $VENV ($source)"
