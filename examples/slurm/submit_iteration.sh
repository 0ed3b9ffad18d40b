#!/bin/bash
# Submit one iteration: rollout shards -> group/reward -> update, each waiting for the previous.
# Usage: RUN=runs/paper/iter-0003 QUESTIONS=train.jsonl INDEX=indexes/wiki18-e5 \
#        AGENT=... RANKER=... AGENT_REF=... RANKER_REF=... bash examples/slurm/submit_iteration.sh
set -euo pipefail
here=$(dirname "$0")
rollout=$(sbatch --parsable --export=ALL "$here/rollout.sbatch")
scored=$(sbatch --parsable --export=ALL --dependency=afterok:$rollout "$here/group_reward.sbatch")
update=$(sbatch --parsable --export=ALL --dependency=afterok:$scored "$here/update.sbatch")
echo "rollout $rollout -> group/reward $scored -> update $update"
