#!/bin/bash
# The paper-7b run as Slurm jobs: per iteration, questions -> rollout array (vLLM) -> group/reward (CPU) ->
# update (torchrun FSDP, 8 GPUs), and every EVAL_EVERY iterations a dev evaluation; each job waits for the one
# before it (afterok), so the whole run is queued at once.
# Usage: RUN=runs/paper-7b QUESTIONS=train.jsonl DEV=dev.jsonl INDEX=indexes/wiki18-e5 \
#        MODEL=/models/Qwen2.5-7B-Instruct ITERATIONS=100 bash examples/slurm/paper-7b/submit.sh
set -euo pipefail
here=$(dirname "$0")
: "${RUN:?}" "${QUESTIONS:?}" "${DEV:?}" "${INDEX:?}" "${MODEL:?}"
export RUN QUESTIONS DEV INDEX AGENT_REF=$MODEL RANKER_REF=${RANKER_MODEL:-$MODEL}
ITERATIONS=${ITERATIONS:-100}
EVAL_EVERY=${EVAL_EVERY:-10}
previous=""
for ((I = ${START:-0}; I < ITERATIONS; I++)); do
  I=$I bash "$here/questions.sh"
  export FOLDER=$(printf '%s/iter-%04d' "$RUN" "$I")
  if ((I == 0)); then export AGENT=$MODEL RANKER=${RANKER_MODEL:-$MODEL}
  else last=$(printf '%s/iter-%04d' "$RUN" $((I - 1))); export AGENT=$last/agent RANKER=$last/ranker; fi
  after=${previous:+--dependency=afterok:$previous}
  rollout=$(sbatch --parsable --export=ALL $after "$here/rollout.sbatch")
  scored=$(sbatch --parsable --export=ALL --dependency=afterok:$rollout "$here/group_reward.sbatch")
  previous=$(sbatch --parsable --export=ALL --dependency=afterok:$scored "$here/update.sbatch")
  line="iteration $I: rollout $rollout -> group/reward $scored -> update $previous"
  if (((I + 1) % EVAL_EVERY == 0 || I + 1 == ITERATIONS)); then
    line="$line -> evaluate $(sbatch --parsable --export=ALL --dependency=afterok:$previous "$here/evaluate.sbatch")"
  fi
  echo "$line"
done
