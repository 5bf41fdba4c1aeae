#!/usr/bin/env bash
# verl-tool's own tool server, unmodified, in its own venv (.venv-verltool), beside (never inside) the
# project's .venv, for running it side by side with `medvqa-tools serve` (benchmarks/bench_seed_wire.py).
#
#   VERLTOOL_SRC=/path/to/verl-tool scripts/setup_verltool.sh   # a checkout of TIGER-AI-Lab/verl-tool
#   scripts/setup_verltool.sh                                   # from the package index, if published there
#
# verl-tool is not on PyPI (checked 2026-12-07: `pip download --no-deps verl-tool` finds nothing), so
# the usual way is a checkout: `git clone https://github.com/TIGER-AI-Lab/verl-tool` (its bundled verl/
# is installed from the checkout too). What its crop tool needs, and why this venv is heavy:
#   verl_tool/servers/tools/pixel_reasoner.py imports verl_tool.agent_loop.vision_utils, whose package
#   imports verl's agent loop (verl, ray, tensordict, transformers) and torchvision (its video path).
#   torchvision cannot sit beside the project's CPU torch, so this venv takes the torch + torchvision pair
#   that lies on this machine's disk (a CUDA build, ~6 GB; ../shared/NOTES.md), never the project's venv.
# Its server then starts as its README says:
#   .venv-verltool/bin/python -m verl_tool.servers.serve --host 127.0.0.1 --port 5500 \
#       --tool_type pixel_reasoner --workers_per_tool 1
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-verltool}
PY=${PYTHON:-python3}
TORCH_PAIR=${TORCH_PAIR:-"torch==2.14.1 torchvision==0.29.1"}

if [ -n "${VERLTOOL_SRC:-}" ]; then
    if [ ! -f "$VERLTOOL_SRC/pyproject.toml" ] || [ ! -d "$VERLTOOL_SRC/verl_tool/servers" ]; then
        echo "setup_verltool: VERLTOOL_SRC=$VERLTOOL_SRC is not a checkout of TIGER-AI-Lab/verl-tool" \
             "(no pyproject.toml or verl_tool/servers)" >&2
        exit 1
    fi
    source="$VERLTOOL_SRC"
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    if "$PY" -m pip download --no-deps --quiet verl-tool -d "$tmp" >/dev/null 2>&1; then
        source="verl-tool"
    else
        echo "setup_verltool: verl-tool is not on the package index this machine reaches; give a checkout:" >&2
        echo "  git clone https://github.com/TIGER-AI-Lab/verl-tool && VERLTOOL_SRC=\$PWD/verl-tool $0" >&2
        exit 1
    fi
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# What verl-tool's pins leave open and resolve wrongly today (found by installing it, 2026-12-07): its bundled
# verl imports AutoModelForVision2Seq (gone in transformers 5) and needs numpy < 2, which the newest pyarrow
# and datasets refuse; cachetools and openai are imported by its agent loop without being declared.
pins="$VENV/verltool-constraints.txt"
printf '%s\n' "transformers<5" "numpy<2" "pyarrow>=19,<20" "datasets<4" > "$pins"
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet -c "$pins" $TORCH_PAIR
if [ -n "${VERLTOOL_SRC:-}" ] && [ -f "$VERLTOOL_SRC/verl/setup.py" ]; then
    "$VENV/bin/pip" install --quiet -c "$pins" "$VERLTOOL_SRC/verl"   # the verl verl-tool pins (its submodule)
fi
# verl-tool's declared dependencies but pyext (its python_oj tool's; it no longer builds on Python >= 3.11:
# inspect.getargspec is gone), then verl-tool itself without them
if [ -n "${VERLTOOL_SRC:-}" ]; then
    "$VENV/bin/python" - "$VERLTOOL_SRC/pyproject.toml" > "$VENV/verltool-deps.txt" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.lower().startswith("pyext")))
PY
    "$VENV/bin/pip" install --quiet -c "$pins" -r "$VENV/verltool-deps.txt" fastapi "uvicorn[standard]" httpx regex \
        cachetools openai
    "$VENV/bin/pip" install --quiet --no-deps -e "$source"   # editable, as its README installs it: its
    # pyproject lists the package "verl_tool" alone, so a plain install leaves out verl_tool.servers
else
    "$VENV/bin/pip" install --quiet -c "$pins" "$source" fastapi "uvicorn[standard]" httpx regex cachetools openai
fi
"$VENV/bin/python" -c "import verl_tool.servers.serve, verl_tool.servers.tools.pixel_reasoner" \
    && echo "setup_verltool: verl-tool's server and crop tool import in $VENV ($source)"
