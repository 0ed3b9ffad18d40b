#!/bin/bash
# Write iteration I's training questions (the same seeded per-epoch shuffle `cosearch train` uses) to
# $RUN/iter-NNNN/questions.jsonl. Usage: RUN=runs/paper-7b QUESTIONS=train.jsonl I=3 bash questions.sh
set -euo pipefail
: "${RUN:?}" "${QUESTIONS:?}" "${I:?}"
folder=$(printf '%s/iter-%04d' "$RUN" "$I")
mkdir -p "$folder"
"${PYTHON:-.venv/bin/python}" - "$QUESTIONS" "$I" "$folder/questions.jsonl" "${PER_ITERATION:-512}" "${SEED:-0}" <<'PY'
import sys
import orjson
from cosearch_cli.records import read_questions
from cosearch_cli.train import TrainConfig, iteration_questions

path, i, out, per, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
questions = read_questions(path)[0]
chosen = iteration_questions(questions, TrainConfig(questions_per_iteration=per, seed=seed), i)
with open(out, "wb") as f:
    f.writelines(orjson.dumps(q) + b"\n" for q in chosen)  # a Question dataclass, every field kept
PY
