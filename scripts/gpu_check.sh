#!/usr/bin/env bash
# The GPU path checked on one GPU in under 8 minutes (about 1 minute expected), with only torch (CUDA build),
# transformers and orjson: rollout on cuda, a bf16 update, old log-probs recomputed, FSDP on one rank, and the
# engine/trainer log-prob gap (scripts/gpu_check.py says what each check compares). No model is downloaded: a
# tiny random Llama and tokenizer are built in the script.
#
#   scripts/gpu_check.sh                       writes bench/results/gpu_check.txt (commit it)
#   GPU_CHECK_OUT=path scripts/gpu_check.sh    writes there instead ($OUT/gpu_check.txt when $OUT is set)
#   COSEARCH_WHEELS=dir                        a folder of wheels to install orjson from when it is missing
#                                              (made elsewhere with `pip download orjson -d dir`)
# Exit status 0 when every check passed; the last line of the output is the PASS/FAIL summary.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${GPU_CHECK_OUT:-}" ]; then out=$GPU_CHECK_OUT
elif [ -n "${OUT:-}" ]; then out=$OUT/gpu_check.txt
else out=bench/results/gpu_check.txt
fi
mkdir -p "$(dirname "$out")"

if ! "$PY" -c "import orjson" 2>/dev/null && [ -n "${COSEARCH_WHEELS:-}" ]; then
  "$PY" -m pip install --quiet --no-index --find-links "$COSEARCH_WHEELS" orjson
fi

{
  echo "# scripts/gpu_check.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import transformers; print('transformers', transformers.__version__)" 2>&1
} > "$out"
timeout 480 "$PY" -W ignore scripts/gpu_check.py 2>&1 | tee -a "$out"
status=${PIPESTATUS[0]}
if [ "$status" = 124 ]; then echo "SUMMARY: FAIL (timed out after 480 s)" | tee -a "$out"; fi
echo "output written to $out"
exit "$status"
