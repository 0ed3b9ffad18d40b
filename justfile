# Recipes for people working on cosearch. `just --list` shows them.

# Create .venv with the CPU build of torch, cosearch and the embedded models.
setup:
    bash scripts/install.sh

# The test suite (the same command CI runs).
test:
    .venv/bin/python -m pytest -q

# The README's main job: index, evaluate, train agent and ranker jointly, evaluate, oracle study.
demo:
    .venv/bin/cosearch demo

# Every speed and quality benchmark, one after another (long: hours on a 2-core CPU; see each recipe).
bench: bench-group-reward bench-index bench-serve bench-serve-workers bench-serve-dense bench-serve-dense-workers bench-dense-scale bench-bm25-memory bench-rollout bench-update bench-retrieval bench-valid-actions oracle-study

# Regenerate docs/cli.md from the commands' --help (tests/test_docs.py fails when it is stale).
docs:
    .venv/bin/python scripts/gen_cli_docs.py docs/cli.md

# Rebuild the fixture slice from ../shared/data.
fixtures:
    .venv/bin/python scripts/make_fixtures.py ../shared/data fixtures

# The oracle-retrieval study (paper Table 1) on ../shared/data dev: 30 questions per dataset (bamboogle: all
# 25), all 32,628 passages (BM25), embedded SmolLM2 agent; --ranker none and --ranker llm against the oracle.
# Halves advance together 35 questions at a time; rerun to continue; `--report-only` reports what is finished.
oracle-study out="runs/oracle-study":
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    OMP_NUM_THREADS=1 .venv/bin/cosearch oracle --questions '../shared/data/dev/*.jsonl' --per-dataset 30 --question-chunk 32 --block 35 --index indexes/dev-bm25 --ranker none --ranker llm --out {{out}} -o {{out}}/summary.json

# Speed of `cosearch group` and `cosearch reward`: 500 vs 2,000 questions (50 ranker calls each).
bench-group-reward:
    nice -n 10 .venv/bin/python bench/bench_group_reward.py --questions 500 2000 --repeats 3 --out bench/results/group_reward.md

# Rollout speed: batched `run_rollouts` vs one trajectory at a time with batch-1 `model.generate` (same
# questions, SmolLM2, settings; both constrained). Results: bench/results/rollout_speed.md.
bench-rollout questions="8" n="4" turns="2":
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_rollout.py --questions {{questions}} --naive-questions 1 --n {{n}} --max-turns {{turns}} --max-new-tokens 80

# Two rollout shards at once (each --threads = CPUs / 2) vs one process with all cores, and vs two shards that
# each take every core (torch's default before), on the same 16 fixture questions x G=4 (8 a shard: one full
# --question-chunk each); records the load.
# A few minutes on 2 quiet cores. Results: bench/results/threads.md (+ .json).
bench-threads shards="2" questions="16":
    .venv/bin/python bench/bench_threads.py --shards {{shards}} --questions {{questions}} --n 4 --oversub-timeout 60 --out bench/results/threads.md

# One GRPO update of SmolLM2-135M (fp32, CPU): `cosearch update` vs TRL's GRPO loss path on the same batch,
# alternating in fresh processes (needs the trl extra). Results: bench/results/update_cpu.md.
bench-update questions="1" group="8" repeats="2":
    nice -n 10 .venv/bin/python bench/bench_update.py --questions {{questions}} --group {{group}} --repeats {{repeats}} --out bench/results/update_cpu.md

# `cosearch serve` under load vs a one-request-at-a-time server (`--serial`), side by side: BM25 k=50 on
# indexes/dev-bm25, dev questions, 1/8/32 concurrent clients on loopback, each cell at most 3,000 requests or
# 20 s (under 3 min in all). Results: bench/results/serve_load.md (+ .json).
bench-serve:
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    .venv/bin/python bench/serve_load.py --index indexes/dev-bm25 --questions '../shared/data/dev/*.jsonl' --k 50 --clients 1 8 32 --requests 3000 --max-seconds 20 --out bench/results/serve_load.md

# The same BM25 load against `cosearch serve --serial --workers 2` (two one-request-at-a-time processes on one
# port). Results: bench/results/serve_load_workers.md (+ .json).
bench-serve-workers workers="2":
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    .venv/bin/python bench/serve_load.py --index indexes/dev-bm25 --questions '../shared/data/dev/*.jsonl' --k 50 --clients 1 8 32 --requests 3000 --max-seconds 20 --serve-options "--serial --workers {{workers}}" --out bench/results/serve_load_workers.md

# The dense load (below) against `cosearch serve --workers 2` (each worker batching, torch threads split).
# Results: bench/results/serve_load_dense_workers.md (+ .json).
bench-serve-dense-workers workers="2":
    test -d indexes/fixture-dense || .venv/bin/cosearch index build --corpus fixtures/corpus.jsonl --out indexes/fixture-dense --dense minilm
    .venv/bin/python bench/serve_load.py --index indexes/fixture-dense --retriever dense --questions '../shared/data/dev/*.jsonl' --k 50 --clients 1 8 32 --requests 3000 --max-seconds 20 --serve-options "--workers {{workers}}" --out bench/results/serve_load_dense_workers.md

# The same load with the dense retriever (MiniLM over the fixture corpus; the build encodes 1,464 passages,
# minutes on 2 cores, once): batching concurrent clients' queries into one encoder pass. ~3 min.
bench-serve-dense:
    test -d indexes/fixture-dense || .venv/bin/cosearch index build --corpus fixtures/corpus.jsonl --out indexes/fixture-dense --dense minilm
    .venv/bin/python bench/serve_load.py --index indexes/fixture-dense --retriever dense --questions '../shared/data/dev/*.jsonl' --k 50 --clients 1 8 32 --requests 3000 --max-seconds 20 --out bench/results/serve_load_dense.md

# Index build and search speed vs bm25s/faiss called directly, FAISS index types, and pyserini vs bm25s
# (pass --pyserini /tmp/venv-pyserini/bin/python; README "BM25 backends" says how to make that venv).
# Dense rows need the cached MiniLM embeddings that `just bench-retrieval` makes. Results: bench/results/index_speed.md.
bench-index *args:
    nice -n 10 .venv/bin/python bench/bench_index.py --data ../shared/data {{args}}

# Dense index types at wiki-18 scale (issue 17): flat / hnsw / ivfpq / ivfpq-refine on the cached MiniLM vectors
# of the shared corpus (encoded and cached first if missing: ~25+ min on 2 cores), recall@10/@50 vs flat, queries/s,
# RAM and disk per passage, extrapolated to 21M x 768; dev recall@10/hit@5; 2 processes sharing one index; a real
# 2M-passage ivfpq-refine build (real vectors tiled with noise; ~3 GB in /tmp; allow ~1 h on 2 cores).
# Results: bench/results/dense_scale.md (+ .json).
bench-dense-scale real_build="2000000" processes="2" *args:
    nice -n 10 .venv/bin/python bench/dense_scale.py --data ../shared/data --encode-missing --real-build {{real_build}} --processes {{processes}} --out bench/results/dense_scale.md {{args}}

# BM25 build memory and time, bm25s vs sharded: the shared corpus, then 300k and 1M passages made by repeating it
# (in /tmp), extrapolated to wiki-18's 21M; also checks both give the same dev recall. ~15 min on 2 quiet cores.
# Results: bench/results/bm25_memory.md.
bench-bm25-memory:
    nice -n 19 .venv/bin/python bench/bench_bm25_memory.py --data ../shared/data --sizes 32628 300000 1000000 --quality --out bench/results/bm25_memory.md

# Retrieval quality (recall@10, hit@5) of BM25 and dense MiniLM on all 32,628 passages and the dev questions;
# the first run encodes the corpus (~25+ min on 2 cores; cached afterwards). Results: bench/results/retrieval_quality.md.
bench-retrieval:
    nice -n 10 .venv/bin/python bench/retrieval_quality.py --data ../shared/data --index indexes/shared-32k --dense

# Learning evidence (issues 7, 14), study 4: search-r1, fixed-ranker and cosearch at equal compute from one
# supervised warm-up of the shipped SmolLM2, evaluated greedy on 210 held-out dev questions (stratified, never
# trained, warmed up or tuned on); RL questions without the title shortcut (bench/title_filter.py). Study 4 took
# 0.75 h for cosearch alone (`--threads 2`), then ~1 h for the other two side by side (`--threads 1` each) on this
# 2-core machine. Results: bench/results/learning_evidence.md (study 3: learning_evidence_study3.md).
learning-evidence:
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    .venv/bin/python bench/learning_split.py --heldout 210 --warmup 168 --train-dev-per-dataset 60 --out runs/study3
    test -d runs/study3/warmup || .venv/bin/cosearch warmup --questions runs/study3/warmup.jsonl --exclude runs/study3/heldout.jsonl --index indexes/dev-bm25 --out runs/study3/warmup --max-turns 1 --k 3 --top-n 5 --max-new-tokens 64 --epochs 2 --lr 3e-5 --token-budget 2048 --ranker-demos evidence
    .venv/bin/python bench/title_filter.py --questions runs/study3/train.jsonl --index indexes/dev-bm25 --top-n 5 --out runs/study4/train.jsonl --report runs/study3/heldout.jsonl
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study4.toml --name s4-cosearch
    # fixed-ranker starts from the same models with the same greedy settings, so its eval-init is cosearch's
    mkdir -p runs/s4-fixed-ranker && (test -d runs/s4-fixed-ranker/eval-init || cp -r runs/s4-cosearch/eval-init runs/s4-fixed-ranker/)
    for preset in fixed-ranker search-r1; do .venv/bin/cosearch train --preset $preset --config bench/learning_study4.toml --name s4-$preset; done
    .venv/bin/python bench/learning_evidence.py --runs runs/s4-search-r1 runs/s4-fixed-ranker runs/s4-cosearch --untrained smollm2 --shipped-eval runs/study3/eval-shipped --png bench/results/learning_curves.png --json bench/results/learning_evidence.json

# Two levers on study 4's cosearch run (issue 14), after `just learning-evidence`: study 5 = lr 2e-5 instead of
# 5e-6 (8 iterations, ~0.6 h), study 6 = study 4 continued to 20 iterations (resumed from its folder: the same
# result as a fresh 20-iteration run; 12 more iterations + evaluation, ~0.9 h). Results:
# bench/results/learning_levers.md, title_copy.md.
learning-levers:
    mkdir -p runs/s5-cosearch && (test -d runs/s5-cosearch/eval-init || cp -r runs/s4-cosearch/eval-init runs/s5-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study5.toml --name s5-cosearch
    mkdir -p runs/s6-cosearch && (test -d runs/s6-cosearch/iter-0007 || cp -r runs/s4-cosearch/eval-init runs/s4-cosearch/iter-00* runs/s6-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study6.toml --name s6-cosearch
    .venv/bin/python bench/learning_evidence.py --runs runs/s4-cosearch runs/s5-cosearch runs/s6-cosearch --untrained smollm2 --shipped-eval runs/study3/eval-shipped --png bench/results/learning_levers.png --json bench/results/learning_levers.json --title "cosearch preset: study 4 (lr 5e-6, 8 it.), study 5 (lr 2e-5), study 6 (20 it.)"
    .venv/bin/python bench/title_copy.py runs/learn-search-r1 runs/learn-fixed-ranker runs/learn-cosearch runs/s4-search-r1 runs/s4-fixed-ranker runs/s4-cosearch runs/s5-cosearch runs/s6-cosearch --eval start=runs/learn-cosearch/eval-init/rollouts.jsonl --eval search-r1-end=runs/learn-search-r1/iter-0007/eval/rollouts.jsonl --eval fixed-ranker-end=runs/learn-fixed-ranker/iter-0007/eval/rollouts.jsonl --eval cosearch-end=runs/learn-cosearch/iter-0007/eval/rollouts.jsonl --eval s4-search-r1-end=runs/s4-search-r1/iter-0007/eval/rollouts.jsonl --eval s4-fixed-ranker-end=runs/s4-fixed-ranker/iter-0007/eval/rollouts.jsonl --eval s4-cosearch-end=runs/s4-cosearch/iter-0007/eval/rollouts.jsonl --eval s5-cosearch-end=runs/s5-cosearch/iter-0007/eval/rollouts.jsonl --eval s6-cosearch-end=runs/s6-cosearch/iter-0019/eval/rollouts.jsonl --out bench/results/title_copy.md

# Learning evidence, study 7 (issue 14): study 4 with 16 groups per update, 4 iterations; then the analysis.
learning-study7:
    mkdir -p runs/s7-cosearch && (test -d runs/s7-cosearch/eval-init || cp -r runs/s4-cosearch/eval-init runs/s7-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study7.toml --name s7-cosearch
    .venv/bin/python bench/learning_evidence.py --runs runs/s4-cosearch runs/s6-cosearch runs/s7-cosearch --untrained smollm2 --shipped-eval runs/study3/eval-shipped --png bench/results/learning_study7.png --json bench/results/learning_study7.json --title "cosearch preset: study 4 (4 groups/update, 8 it.), study 6 (20 it.), study 7 (16 groups/update, 4 it.)"
    .venv/bin/python bench/title_copy.py runs/s4-cosearch runs/s6-cosearch runs/s7-cosearch --eval start=runs/s4-cosearch/eval-init/rollouts.jsonl --eval s4-cosearch-end=runs/s4-cosearch/iter-0007/eval/rollouts.jsonl --eval s6-cosearch-end=runs/s6-cosearch/iter-0019/eval/rollouts.jsonl --eval s7-cosearch-end=runs/s7-cosearch/iter-0003/eval/rollouts.jsonl --out bench/results/title_copy_study7.md

# Study 8 (issue 14): cosearch from study 3's warm-up on training questions whose answer the agent is shown
# (bench/answerable_pool.py), rollouts at temperature 0.7 (bench/learning_study8.toml), after `just
# learning-evidence` (its s4-cosearch/eval-init is the same start's held-out evaluation). Results:
# bench/results/learning_study8.md.
learning-study8:
    .venv/bin/python bench/answerable_pool.py --exclude runs/study3/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study8/train.jsonl
    mkdir -p runs/s8-cosearch && (test -d runs/s8-cosearch/eval-init || cp -r runs/s4-cosearch/eval-init runs/s8-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study8.toml --name s8-cosearch
    .venv/bin/python bench/gain_by_visibility.py --start runs/s8-cosearch/eval-init/rollouts.jsonl --end runs/s8-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 --json runs/s8-cosearch/visibility.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s8-cosearch --png bench/results/learning_study8.png --json bench/results/learning_study8.json --extra gain_by_visibility=runs/s8-cosearch/visibility.json --extra training_questions=runs/study8/train.manifest.json --title "cosearch preset, study 8: answerable training questions, temperature 0.7"
    .venv/bin/python bench/title_copy.py runs/s8-cosearch --eval start=runs/s8-cosearch/eval-init/rollouts.jsonl --eval s8-cosearch-end=runs/s8-cosearch/iter-0005/eval/rollouts.jsonl --out bench/results/title_copy_study8.md

# Study 9 (issue 14, target b): study 8 with K = 1, so the ranker's r_rel is Hit@1 and the agent reads only the
# ranker's first choice (bench/learning_study9.toml; ~1.6 h here). After `just learning-study8` (its training pool).
learning-study9:
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study9.toml --name s9-cosearch
    .venv/bin/python bench/gain_by_visibility.py --start runs/s9-cosearch/eval-init/rollouts.jsonl --end runs/s9-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 --json runs/s9-cosearch/visibility.json
    .venv/bin/python bench/ranker_choices.py runs/s9-cosearch --json runs/s9-cosearch/ranker_choices.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s9-cosearch --png bench/results/learning_study9.png --json bench/results/learning_study9.json --extra gain_by_visibility=runs/s9-cosearch/visibility.json --extra training_questions=runs/study8/train.manifest.json --extra ranker_choices=runs/s9-cosearch/ranker_choices.json --title "cosearch preset, study 9: study 8 with K = 1"
    .venv/bin/python bench/title_copy.py runs/s9-cosearch --eval start=runs/s9-cosearch/eval-init/rollouts.jsonl --eval s9-cosearch-end=runs/s9-cosearch/iter-0005/eval/rollouts.jsonl --out bench/results/title_copy_study9.md

# Learning evidence, study 10 (issue 14, target b): study 9 at METHOD.md's temperature 1.0 with the ranker reading
# 96 tokens of each candidate (bench/learning_study10.toml; ~1.5 h here). After `just learning-study8` (its
# training pool). Results: bench/results/learning_study10.md.
learning-study10:
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study10.toml --name s10-cosearch
    .venv/bin/python bench/gain_by_visibility.py --start runs/s10-cosearch/eval-init/rollouts.jsonl --end runs/s10-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 --json runs/s10-cosearch/visibility.json
    .venv/bin/python bench/ranker_choices.py runs/s10-cosearch --json runs/s10-cosearch/ranker_choices.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s10-cosearch --png bench/results/learning_study10.png --json bench/results/learning_study10.json --extra gain_by_visibility=runs/s10-cosearch/visibility.json --extra training_questions=runs/study8/train.manifest.json --extra ranker_choices=runs/s10-cosearch/ranker_choices.json --title "cosearch preset, study 10: study 9 at temperature 1.0, ranker reading 96 tokens"
    .venv/bin/python bench/title_copy.py runs/s10-cosearch --eval start=runs/s10-cosearch/eval-init/rollouts.jsonl --eval s10-cosearch-end=runs/s10-cosearch/iter-0005/eval/rollouts.jsonl --out bench/results/title_copy_study10.md

# Learning evidence, study 11 (issue 14, target a): study 8's training judged on 630 held-out questions, which hold
# study 8's 210 (bench/learning_study11.toml; ~1.8 h here: 33 min of it the two evaluations of 630, 15 min the
# analysis). After the first three lines of `just learning-evidence` (index, study 3's split and warm-up).
# learning_split also writes a train.jsonl that the study does not use: its training questions are
# answerable_pool's, drawn outside the 630. Study 8's pool is (re)built only to count the questions the two pools
# share.
# Results: bench/results/learning_study11.md.
learning-study11:
    .venv/bin/python bench/learning_split.py --heldout 630 --exclude runs/study3/warmup.jsonl --data ../shared/data --out runs/study11-split
    .venv/bin/python bench/answerable_pool.py --exclude runs/study11-split/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study11/train.jsonl
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study11.toml --name s11-cosearch
    .venv/bin/python bench/gain_by_visibility.py --start runs/s11-cosearch/eval-init/rollouts.jsonl --end runs/s11-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 --split "study 8's 210=runs/study3/heldout.jsonl" --json runs/s11-cosearch/visibility.json
    test -f runs/study8/train.jsonl || .venv/bin/python bench/answerable_pool.py --exclude runs/study3/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study8/train.jsonl
    .venv/bin/python bench/question_overlap.py runs/study11/train.jsonl runs/study8/train.jsonl runs/study11-split/heldout.jsonl runs/study3/heldout.jsonl --json runs/s11-cosearch/overlap.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s11-cosearch --png bench/results/learning_study11.png --json bench/results/learning_study11.json --extra gain_by_visibility=runs/s11-cosearch/visibility.json --extra training_questions=runs/study11/train.manifest.json --extra heldout_questions=runs/study11-split/heldout.manifest.json --extra question_overlap=runs/s11-cosearch/overlap.json --title "cosearch preset, study 11: study 8 judged on 630 held-out questions"
    .venv/bin/python bench/title_copy.py runs/s11-cosearch --eval start=runs/s11-cosearch/eval-init/rollouts.jsonl --eval s11-cosearch-end=runs/s11-cosearch/iter-0005/eval/rollouts.jsonl --out bench/results/title_copy_study11.md

# Learning evidence, study 12 (issue 14, target a): study 11 with ReMax's greedy baseline for the agent's advantage
# (bench/learning_study12.toml; the only difference). The start's evaluation on the 630 is study 11's, copied when
# it exists (same models, questions and rollout settings; greedy, so the same records). After `just
# learning-study11`; ~1.5 h here. Results: bench/results/learning_study12.md.
learning-study12:
    test -d runs/s12-cosearch/eval-init || ! test -f runs/s11-cosearch/eval-init/summary.json || (mkdir -p runs/s12-cosearch && cp -r runs/s11-cosearch/eval-init runs/s12-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study12.toml --name s12-cosearch
    .venv/bin/python bench/gain_by_visibility.py --start runs/s12-cosearch/eval-init/rollouts.jsonl --end runs/s12-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 --split "study 8's 210=runs/study3/heldout.jsonl" --json runs/s12-cosearch/visibility.json
    .venv/bin/cosearch evaluate score runs/s12-cosearch/eval-init/rollouts.jsonl runs/s12-cosearch/iter-0005/eval/rollouts.jsonl -q -o runs/s12-cosearch/vs-start.json
    .venv/bin/cosearch evaluate score runs/s11-cosearch/iter-0005/eval/rollouts.jsonl runs/s12-cosearch/iter-0005/eval/rollouts.jsonl -q -o runs/s12-cosearch/vs-s11.json
    .venv/bin/python bench/sampled_gains.py --pair "630 held-out, greedy: study 11's end -> study 12's end=runs/s12-cosearch/vs-s11.json" --json runs/s12-cosearch/vs-s11-figures.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s12-cosearch --png bench/results/learning_study12.png --json bench/results/learning_study12.json --extra gain_by_visibility=runs/s12-cosearch/visibility.json --extra vs_study11_end=runs/s12-cosearch/vs-s11-figures.json --title "cosearch preset, study 12: study 11 with a greedy baseline for the agent (ReMax)"
    .venv/bin/python bench/title_copy.py runs/s12-cosearch --eval start=runs/s12-cosearch/eval-init/rollouts.jsonl --eval s12-cosearch-end=runs/s12-cosearch/iter-0005/eval/rollouts.jsonl --out bench/results/title_copy_study12.md

# The rollout options of study 11's evaluations (bench/learning_study11.toml); S11_START and S11_END: its models.
S11_ROLLOUT := "--index indexes/dev-bm25 --ranker llm --sizes cpu --max-turns 1 --top-n 5 --k 3 --max-new-tokens 64 --ranker-max-new-tokens 64 --passage-tokens 48 --question-chunk 16 --constrain agent,ranker --seed 0"
S11_START := "--agent runs/study3/warmup --ranker-model runs/study3/warmup"
S11_END := "--agent runs/s11-cosearch/iter-0005/agent --ranker-model runs/s11-cosearch/iter-0005/ranker"

# Does study 11's training move the policy it optimises, where greedy decoding showed no change? (1) The 630
# held-out questions sampled at the training temperature (0.7), two samples a question from the start and from
# the trained models, same seed (common random numbers), ~35 min a model here; (2) the same on the 112 questions
# training drew (what it trained on: does it learn those?); (3) greedy on the 404 questions of the training pool
# it never drew (unseen, but chosen by the rule that chose the training questions). Each pair is scored
# question by question with a paired bootstrap. Then what the updates rewarded, against the start's greedy
# answers on the drawn questions. After `just learning-study11`; ~1.7 h here.
# Results: bench/results/learning_study11_sampled.md.
learning-study11-sampled:
    mkdir -p runs/s11-sampled
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/study11-split/heldout.jsonl --temperature 0.7 --n 2 {{S11_START}} -o runs/s11-sampled/start.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/study11-split/heldout.jsonl --temperature 0.7 --n 2 {{S11_END}} -o runs/s11-sampled/end.jsonl
    .venv/bin/cosearch evaluate score runs/s11-sampled/start.jsonl runs/s11-sampled/end.jsonl --per-question runs/s11-sampled/per_question.parquet -o runs/s11-sampled/compare.json
    .venv/bin/python bench/drawn_split.py --run runs/s11-cosearch --questions runs/study11/train.jsonl --out runs/s11-sampled
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/s11-sampled/drawn.jsonl --temperature 0.7 --n 2 {{S11_START}} -o runs/s11-sampled/drawn-start.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/s11-sampled/drawn.jsonl --temperature 0.7 --n 2 {{S11_END}} -o runs/s11-sampled/drawn-end.jsonl
    .venv/bin/cosearch evaluate score runs/s11-sampled/drawn-start.jsonl runs/s11-sampled/drawn-end.jsonl -o runs/s11-sampled/drawn-compare.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/s11-sampled/unseen.jsonl --greedy --n 1 {{S11_START}} -o runs/s11-sampled/unseen-start.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/s11-sampled/unseen.jsonl --greedy --n 1 {{S11_END}} -o runs/s11-sampled/unseen-end.jsonl
    .venv/bin/cosearch evaluate score runs/s11-sampled/unseen-start.jsonl runs/s11-sampled/unseen-end.jsonl -o runs/s11-sampled/unseen-compare.json
    .venv/bin/python bench/greedy_agreement.py --start runs/s11-sampled/start.jsonl,runs/s11-cosearch/eval-init/rollouts.jsonl --end runs/s11-sampled/end.jsonl,runs/s11-cosearch/iter-0005/eval/rollouts.jsonl --json runs/s11-sampled/agreement.json
    .venv/bin/python bench/gain_by_visibility.py --start runs/s11-sampled/start.jsonl --end runs/s11-sampled/end.jsonl --shown-from runs/s11-cosearch/eval-init/rollouts.jsonl --index indexes/dev-bm25 --split "study 8's 210=runs/study3/heldout.jsonl" --json runs/s11-sampled/visibility.json
    .venv/bin/cosearch evaluate score runs/s11-cosearch/eval-init/rollouts.jsonl runs/s11-cosearch/iter-0005/eval/rollouts.jsonl -o runs/s11-sampled/greedy-compare.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/s11-sampled/drawn.jsonl --greedy --n 1 {{S11_START}} -o runs/s11-sampled/drawn-greedy-start.jsonl
    .venv/bin/cosearch evaluate score runs/s11-sampled/drawn-greedy-start.jsonl -q -o runs/s11-sampled/drawn-greedy-score.json
    .venv/bin/python bench/advantage_vs_greedy.py --run runs/s11-cosearch --greedy runs/s11-sampled/drawn-greedy-start.jsonl --json runs/s11-sampled/advantage_vs_greedy.json
    .venv/bin/cosearch evaluate score runs/s11-sampled/start.jsonl runs/s11-sampled/end.jsonl --confidence 0.9833 -q -o runs/s11-sampled/compare-983.json
    .venv/bin/cosearch evaluate score runs/s11-sampled/unseen-start.jsonl runs/s11-sampled/unseen-end.jsonl --confidence 0.9833 -q -o runs/s11-sampled/unseen-compare-983.json
    .venv/bin/python bench/sampled_gains.py --pair "630 held-out=runs/s11-sampled/compare.json" --pair "630 held-out, greedy (study 11)=runs/s11-sampled/greedy-compare.json" --pair "112 drawn in training=runs/s11-sampled/drawn-compare.json" --pair "404 of the pool never drawn=runs/s11-sampled/unseen-compare.json" --pair "630 held-out (Bonferroni, 3 comparisons)=runs/s11-sampled/compare-983.json" --pair "404 of the pool never drawn (Bonferroni, 3 comparisons)=runs/s11-sampled/unseen-compare-983.json" --extra greedy_agreement=runs/s11-sampled/agreement.json --extra gain_by_visibility=runs/s11-sampled/visibility.json --extra advantage_vs_greedy=runs/s11-sampled/advantage_vs_greedy.json --run "112 drawn in training, greedy start=runs/s11-sampled/drawn-greedy-score.json" --json bench/results/learning_study11_sampled.json

# A copy of a finished run's folder (config, eval-init, every iteration), for a longer run to continue (studies 13,
# 15 and 16): skipped when `dst` exists (a continued run resumes from its last finished step) or `src` lacks its
# `last` iteration (then the longer run trains from the start).
_continue-copy src dst last="iter-0005":
    test -d {{dst}} || ! test -f {{src}}/{{last}}/metrics.json || (mkdir -p {{dst}} && cp -r {{src}}/config.toml {{src}}/eval-init {{src}}/iter-0* {{dst}}/)

# Study 13 (issue 14, target a): study 12 continued to 12 iterations (bench/learning_study13.toml, stated before
# the run). When study 12's run folder holds its 6 finished iterations, a copy of it is continued (they are this
# run's first 6: neither the lr schedule, the question order nor the seeds depend on `iterations`), ~1.2 h here;
# otherwise the whole run, ~2.5 h. Target (a) is judged on the 97.5% CI (second look at the 630). Results:
# bench/results/learning_study13.md.
learning-study13:
    .venv/bin/just _continue-copy runs/s12-cosearch runs/s13-cosearch
    test -d runs/s13-cosearch/eval-init || ! test -f runs/s11-cosearch/eval-init/summary.json || (mkdir -p runs/s13-cosearch && cp -r runs/s11-cosearch/eval-init runs/s13-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study13.toml --name s13-cosearch
    .venv/bin/cosearch evaluate score runs/s13-cosearch/eval-init/rollouts.jsonl runs/s13-cosearch/iter-0011/eval/rollouts.jsonl -q -o runs/s13-cosearch/vs-start.json
    .venv/bin/cosearch evaluate score runs/s13-cosearch/eval-init/rollouts.jsonl runs/s13-cosearch/iter-0011/eval/rollouts.jsonl --confidence 0.975 -q -o runs/s13-cosearch/vs-start-975.json
    .venv/bin/cosearch evaluate score runs/s13-cosearch/iter-0005/eval/rollouts.jsonl runs/s13-cosearch/iter-0011/eval/rollouts.jsonl -q -o runs/s13-cosearch/vs-6.json
    .venv/bin/python bench/sampled_gains.py --pair "630 held-out, greedy: start -> 12 iterations=runs/s13-cosearch/vs-start.json" --pair "630 held-out, greedy: start -> 12 iterations (Bonferroni, 2 looks)=runs/s13-cosearch/vs-start-975.json" --pair "630 held-out, greedy: 6 iterations (study 12) -> 12=runs/s13-cosearch/vs-6.json" --json runs/s13-cosearch/pairs.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s13-cosearch --png bench/results/learning_study13.png --json bench/results/learning_study13.json --extra pairs=runs/s13-cosearch/pairs.json --title "cosearch preset, study 13: study 12 (greedy baseline) continued to 12 iterations"
    .venv/bin/python bench/title_copy.py runs/s13-cosearch --eval start=runs/s13-cosearch/eval-init/rollouts.jsonl --eval "6 iterations (study 12)=runs/s13-cosearch/iter-0005/eval/rollouts.jsonl" --eval "12 iterations=runs/s13-cosearch/iter-0011/eval/rollouts.jsonl" --out bench/results/title_copy_study13.md

# Studies 12 and 13 gained on the 630's single-hop questions (+0.021 [+0.005, +0.037], +0.025 [+0.006, +0.046];
# post hoc, on questions looked at before). A confirmatory check on questions no study has touched: 200 dev
# questions each of nq, triviaqa and popqa from the back of the sha1 order (every split takes from the front),
# none a warm-up, training-pool or held-out question of studies 3-13 (bench/fresh_heldout.py), answered
# greedily by the start and by study 13's end with study 11's rollout settings. Stated before it runs: the
# figure is the greedy F1 gain on the 600, paired bootstrap 95% CI, one comparison. Not target (a), which is
# stratified over all 7 datasets. After `just learning-study13`; ~40 min here.
# Results: bench/results/learning_study13.md (bench/results/learning_study13_fresh.json).
S13_END := "--agent runs/s13-cosearch/iter-0011/agent --ranker-model runs/s13-cosearch/iter-0011/ranker"
# Every question file of studies 3-13 (warm-ups, training pools, held-out sets): no fresh question is one of them.
FRESH_EXCLUDE := "--exclude runs/study3/warmup.jsonl --exclude runs/study3/heldout.jsonl --exclude runs/study3/train.jsonl --exclude runs/study8/train.jsonl --exclude runs/study11/train.jsonl --exclude runs/study11-split/heldout.jsonl --exclude runs/study11-split/train.jsonl"
learning-study13-fresh:
    .venv/bin/python bench/fresh_heldout.py --datasets nq,triviaqa,popqa --per-dataset 200 {{FRESH_EXCLUDE}} --out runs/fresh/single-hop.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S11_START}} -o runs/fresh/start.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S13_END}} -o runs/fresh/s13-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s13-end.jsonl -q -o runs/fresh/s13-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> study 13's end=runs/fresh/s13-vs-start.json" --extra fresh_questions=runs/fresh/single-hop.manifest.json --json bench/results/learning_study13_fresh.json

# The same check on fresh multi-hop questions, where the 630 suggested no gain (-0.011 [-0.032, +0.004], post hoc):
# 200 dev questions each of hotpotqa and 2wikimultihopqa from the back of the sha1 order (musique and bamboogle
# have none left untouched), same exclusions and settings. Stated before it runs: the figure is the greedy F1
# change on the 400, paired bootstrap 95% CI, one comparison, no direction assumed. ~25 min here.
# Results: bench/results/learning_study13.md (bench/results/learning_study13_fresh_multihop.json).
learning-study13-fresh-multihop:
    .venv/bin/python bench/fresh_heldout.py --datasets hotpotqa,2wikimultihopqa --per-dataset 200 {{FRESH_EXCLUDE}} --out runs/fresh/multi-hop.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S11_START}} -o runs/fresh/multi-hop-start.jsonl
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S13_END}} -o runs/fresh/multi-hop-s13-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/multi-hop-start.jsonl runs/fresh/multi-hop-s13-end.jsonl -q -o runs/fresh/multi-hop-s13-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "400 fresh multi-hop, greedy: start -> study 13's end=runs/fresh/multi-hop-s13-vs-start.json" --extra fresh_questions=runs/fresh/multi-hop.manifest.json --json bench/results/learning_study13_fresh_multihop.json

# Study 12's end sampled as study 11's were (`just learning-study11-sampled`'s first comparison): the 630 held-out
# questions at the training temperature 0.7, two samples a question, same seed, against the start's and study 11's
# end's samples; and how often samples give the model's own greedy answer. After `just learning-study12` and `just
# learning-study11-sampled`; ~40 min here. Results: bench/results/learning_study12_sampled.json.
S12_END := "--agent runs/s12-cosearch/iter-0005/agent --ranker-model runs/s12-cosearch/iter-0005/ranker"

learning-study12-sampled:
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/study11-split/heldout.jsonl --temperature 0.7 --n 2 {{S12_END}} -o runs/s12-cosearch/sampled-end.jsonl
    .venv/bin/cosearch evaluate score runs/s11-sampled/start.jsonl runs/s12-cosearch/sampled-end.jsonl -q -o runs/s12-cosearch/sampled-compare.json
    .venv/bin/cosearch evaluate score runs/s11-sampled/end.jsonl runs/s12-cosearch/sampled-end.jsonl -q -o runs/s12-cosearch/sampled-vs-s11.json
    .venv/bin/python bench/greedy_agreement.py --start runs/s11-sampled/start.jsonl,runs/s12-cosearch/eval-init/rollouts.jsonl --end runs/s12-cosearch/sampled-end.jsonl,runs/s12-cosearch/iter-0005/eval/rollouts.jsonl --json runs/s12-cosearch/agreement.json
    .venv/bin/python bench/sampled_gains.py --pair "630 held-out, sampled: start -> study 12's end=runs/s12-cosearch/sampled-compare.json" --pair "630 held-out, sampled: study 11's end -> study 12's end=runs/s12-cosearch/sampled-vs-s11.json" --pair "630 held-out, greedy: start -> study 12's end=runs/s12-cosearch/vs-start.json" --extra greedy_agreement=runs/s12-cosearch/agreement.json --json bench/results/learning_study12_sampled.json

# Study 14 (issue 14): study 12 with seed 1, a replication (bench/learning_study14.toml, stated before the run).
# The start's evaluation on the 630 is study 11's, copied (greedy: the seed does not change it). Stated figures:
# the end's greedy F1 gain over the start on the 600 fresh single-hop questions of `just learning-study13-fresh`
# (replication of study 13's +0.024), and on the 630 (target a), each a paired bootstrap 95% CI. Described
# beside them: study 12's end (seed 0) on the same 600, the two seeds' ends against each other, and seed 1's end
# on the 400 fresh multi-hop questions. After `just learning-study12` and `just learning-study13-fresh`
# (`-multihop`); ~1.7 h here. Results: bench/results/learning_study14.md.
S14_END := "--agent runs/s14-cosearch/iter-0005/agent --ranker-model runs/s14-cosearch/iter-0005/ranker"
learning-study14:
    test -d runs/s14-cosearch/eval-init || ! test -f runs/s11-cosearch/eval-init/summary.json || (mkdir -p runs/s14-cosearch && cp -r runs/s11-cosearch/eval-init runs/s14-cosearch/)
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study14.toml --name s14-cosearch
    .venv/bin/cosearch evaluate score runs/s14-cosearch/eval-init/rollouts.jsonl runs/s14-cosearch/iter-0005/eval/rollouts.jsonl -q -o runs/s14-cosearch/vs-start.json
    .venv/bin/cosearch evaluate score runs/s12-cosearch/iter-0005/eval/rollouts.jsonl runs/s14-cosearch/iter-0005/eval/rollouts.jsonl -q -o runs/s14-cosearch/vs-s12.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S14_END}} -o runs/fresh/s14-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s14-end.jsonl -q -o runs/fresh/s14-vs-start.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S12_END}} -o runs/fresh/s12-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s12-end.jsonl -q -o runs/fresh/s12-vs-start.json
    .venv/bin/cosearch evaluate score runs/fresh/s12-end.jsonl runs/fresh/s14-end.jsonl -q -o runs/fresh/s14-vs-s12.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S14_END}} -o runs/fresh/multi-hop-s14-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/multi-hop-start.jsonl runs/fresh/multi-hop-s14-end.jsonl -q -o runs/fresh/multi-hop-s14-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> study 14's end (seed 1)=runs/fresh/s14-vs-start.json" --pair "630 held-out, greedy: start -> study 14's end (seed 1)=runs/s14-cosearch/vs-start.json" --pair "600 fresh single-hop, greedy: start -> study 12's end (seed 0)=runs/fresh/s12-vs-start.json" --pair "600 fresh single-hop, greedy: study 12's end (seed 0) -> study 14's end (seed 1)=runs/fresh/s14-vs-s12.json" --pair "630 held-out, greedy: study 12's end (seed 0) -> study 14's end (seed 1)=runs/s14-cosearch/vs-s12.json" --pair "400 fresh multi-hop, greedy: start -> study 14's end (seed 1)=runs/fresh/multi-hop-s14-vs-start.json" --json runs/s14-cosearch/pairs.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s14-cosearch --png bench/results/learning_study14.png --json bench/results/learning_study14.json --extra pairs=runs/s14-cosearch/pairs.json --title "cosearch preset, study 14: study 12 with seed 1"

# Checks added after study 14's stated figures were in (post hoc, described, not judged): how close the fresh
# single-hop figure's lower bound is to 0 (10,000 bootstrap replicates, four bootstrap seeds), what iterations 6-12
# added on the fresh questions (study 12's end -> study 13's), and the two seeds' 6-iteration ends pooled per
# question (bench/pool_runs.py). No model is loaded; seconds. Results: bench/results/learning_study14.md
# (bench/results/learning_study14_checks.json).
learning-study14-checks:
    for s in 0 1 2 3; do .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s14-end.jsonl --bootstrap 10000 --seed $s -q -o runs/fresh/s14-vs-start-10k-$s.json; done
    .venv/bin/cosearch evaluate score runs/fresh/s12-end.jsonl runs/fresh/s13-end.jsonl -q -o runs/fresh/s13-vs-s12.json
    .venv/bin/python bench/pool_runs.py runs/fresh/s12-end.jsonl runs/fresh/s14-end.jsonl -o runs/fresh/seeds-6it.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/seeds-6it.jsonl -q -o runs/fresh/seeds-6it-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> study 14's end, 10,000 replicates, bootstrap seed 0=runs/fresh/s14-vs-start-10k-0.json" --pair "600 fresh single-hop, greedy: start -> study 14's end, 10,000 replicates, bootstrap seed 1=runs/fresh/s14-vs-start-10k-1.json" --pair "600 fresh single-hop, greedy: start -> study 14's end, 10,000 replicates, bootstrap seed 2=runs/fresh/s14-vs-start-10k-2.json" --pair "600 fresh single-hop, greedy: start -> study 14's end, 10,000 replicates, bootstrap seed 3=runs/fresh/s14-vs-start-10k-3.json" --pair "600 fresh single-hop, greedy: study 12's end (6 iterations) -> study 13's end (12)=runs/fresh/s13-vs-s12.json" --pair "600 fresh single-hop, greedy: start -> mean of the two seeds' 6-iteration ends=runs/fresh/seeds-6it-vs-start.json" --json bench/results/learning_study14_checks.json

# Study 15 (issue 14): study 14 (seed 1) continued to 12 iterations (bench/learning_study15.toml, stated before
# the run), as study 13 continued study 12: does study 13's larger fresh single-hop gain at 12 iterations hold with
# another seed? Continues a copy of study 14's run folder when it holds its 6 finished iterations (~1.1 h here for
# iterations 6-11 and the evaluation), then the fresh questions (~35 min). Both stated figures (fresh single-hop
# and the 630) are judged on the 97.5% CI (second look for this run). Results: bench/results/learning_study15.md.
S15_END := "--agent runs/s15-cosearch/iter-0011/agent --ranker-model runs/s15-cosearch/iter-0011/ranker"
learning-study15:
    .venv/bin/just _continue-copy runs/s14-cosearch runs/s15-cosearch
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study15.toml --name s15-cosearch
    .venv/bin/cosearch evaluate score runs/s15-cosearch/eval-init/rollouts.jsonl runs/s15-cosearch/iter-0011/eval/rollouts.jsonl -q -o runs/s15-cosearch/vs-start.json
    .venv/bin/cosearch evaluate score runs/s15-cosearch/eval-init/rollouts.jsonl runs/s15-cosearch/iter-0011/eval/rollouts.jsonl --confidence 0.975 -q -o runs/s15-cosearch/vs-start-975.json
    .venv/bin/cosearch evaluate score runs/s15-cosearch/iter-0005/eval/rollouts.jsonl runs/s15-cosearch/iter-0011/eval/rollouts.jsonl -q -o runs/s15-cosearch/vs-6.json
    .venv/bin/cosearch evaluate score runs/s13-cosearch/iter-0011/eval/rollouts.jsonl runs/s15-cosearch/iter-0011/eval/rollouts.jsonl -q -o runs/s15-cosearch/vs-s13.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S15_END}} -o runs/fresh/s15-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s15-end.jsonl -q -o runs/fresh/s15-vs-start.json
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s15-end.jsonl --confidence 0.975 -q -o runs/fresh/s15-vs-start-975.json
    .venv/bin/cosearch evaluate score runs/fresh/s14-end.jsonl runs/fresh/s15-end.jsonl -q -o runs/fresh/s15-vs-s14.json
    .venv/bin/cosearch evaluate score runs/fresh/s13-end.jsonl runs/fresh/s15-end.jsonl -q -o runs/fresh/s15-vs-s13.json
    .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S15_END}} -o runs/fresh/multi-hop-s15-end.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/multi-hop-start.jsonl runs/fresh/multi-hop-s15-end.jsonl -q -o runs/fresh/multi-hop-s15-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> study 15's end (seed 1, 12 iterations)=runs/fresh/s15-vs-start.json" --pair "600 fresh single-hop, greedy: start -> study 15's end (Bonferroni, 2 looks)=runs/fresh/s15-vs-start-975.json" --pair "630 held-out, greedy: start -> study 15's end=runs/s15-cosearch/vs-start.json" --pair "630 held-out, greedy: start -> study 15's end (Bonferroni, 2 looks)=runs/s15-cosearch/vs-start-975.json" --pair "630 held-out, greedy: 6 iterations (study 14) -> 12=runs/s15-cosearch/vs-6.json" --pair "600 fresh single-hop, greedy: 6 iterations (study 14) -> 12=runs/fresh/s15-vs-s14.json" --pair "630 held-out, greedy: study 13's end (seed 0) -> study 15's end (seed 1)=runs/s15-cosearch/vs-s13.json" --pair "600 fresh single-hop, greedy: study 13's end (seed 0) -> study 15's end (seed 1)=runs/fresh/s15-vs-s13.json" --pair "400 fresh multi-hop, greedy: start -> study 15's end=runs/fresh/multi-hop-s15-vs-start.json" --json runs/s15-cosearch/pairs.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s15-cosearch --png bench/results/learning_study15.png --json bench/results/learning_study15.json --extra pairs=runs/s15-cosearch/pairs.json --title "cosearch preset, study 15: study 14 (seed 1) continued to 12 iterations"

# Checks beside study 15's stated figures (described, not judged; seconds, no model loaded): the two seeds'
# 12-iteration ends (studies 13 and 15) pooled per question (bench/pool_runs.py) against the start, on the 600
# fresh single-hop, the 400 fresh multi-hop and the 630 held-out questions. After `just learning-study15`.
# Results: bench/results/learning_study15.md (bench/results/learning_study15_checks.json).
learning-study15-checks:
    .venv/bin/python bench/pool_runs.py runs/fresh/s13-end.jsonl runs/fresh/s15-end.jsonl -o runs/fresh/seeds-12it.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/seeds-12it.jsonl -q -o runs/fresh/seeds-12it-vs-start.json
    .venv/bin/python bench/pool_runs.py runs/fresh/multi-hop-s13-end.jsonl runs/fresh/multi-hop-s15-end.jsonl -o runs/fresh/multi-hop-seeds-12it.jsonl
    .venv/bin/cosearch evaluate score runs/fresh/multi-hop-start.jsonl runs/fresh/multi-hop-seeds-12it.jsonl -q -o runs/fresh/multi-hop-seeds-12it-vs-start.json
    .venv/bin/python bench/pool_runs.py runs/s13-cosearch/iter-0011/eval/rollouts.jsonl runs/s15-cosearch/iter-0011/eval/rollouts.jsonl -o runs/s15-cosearch/seeds-12it.jsonl
    .venv/bin/cosearch evaluate score runs/s15-cosearch/eval-init/rollouts.jsonl runs/s15-cosearch/seeds-12it.jsonl -q -o runs/s15-cosearch/seeds-12it-vs-start.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> mean of the two seeds' 12-iteration ends=runs/fresh/seeds-12it-vs-start.json" --pair "400 fresh multi-hop, greedy: start -> mean of the two seeds' 12-iteration ends=runs/fresh/multi-hop-seeds-12it-vs-start.json" --pair "630 held-out, greedy: start -> mean of the two seeds' 12-iteration ends=runs/s15-cosearch/seeds-12it-vs-start.json" --json bench/results/learning_study15_checks.json

# Study 16 (issue 14, target a): both seeds' 12-iteration runs (studies 13 and 15) continued to 18 iterations
# (bench/learning_study16_seed0.toml, bench/learning_study16_seed1.toml, stated before the run). Each arm continues
# a copy of its 12-iteration run folder (~1.1 h here each: 6 iterations and the 630's evaluation), then its end
# answers the 600 fresh single-hop questions (~15 min each). Stated: the two arms' ends pooled per question, start
# -> 18 iterations, on the fresh single-hop and on the 630, judged on the 98.33% CI (third look). A killed run
# continues from its last finished step. The pooled 12-iteration ends come from `just learning-study15-checks`.
# Results: bench/results/learning_study16.md.
S16_END0 := "--agent runs/s16-seed0/iter-0017/agent --ranker-model runs/s16-seed0/iter-0017/ranker"
S16_END1 := "--agent runs/s16-seed1/iter-0017/agent --ranker-model runs/s16-seed1/iter-0017/ranker"
learning-study16:
    .venv/bin/just _continue-copy runs/s13-cosearch runs/s16-seed0 iter-0011
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study16_seed0.toml --name s16-seed0
    test -f runs/fresh/s16-seed0-end.jsonl || .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S16_END0}} -o runs/fresh/s16-seed0-end.jsonl
    .venv/bin/just _continue-copy runs/s15-cosearch runs/s16-seed1 iter-0011
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study16_seed1.toml --name s16-seed1
    test -f runs/fresh/s16-seed1-end.jsonl || .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/single-hop.jsonl --greedy --n 1 {{S16_END1}} -o runs/fresh/s16-seed1-end.jsonl
    .venv/bin/python bench/pool_runs.py runs/fresh/s16-seed0-end.jsonl runs/fresh/s16-seed1-end.jsonl -o runs/fresh/seeds-18it.jsonl
    .venv/bin/python bench/pool_runs.py runs/s16-seed0/iter-0017/eval/rollouts.jsonl runs/s16-seed1/iter-0017/eval/rollouts.jsonl -o runs/s16-seed1/seeds-18it.jsonl
    .venv/bin/just learning-study15-checks
    for c in 0.9833 0.95; do .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/seeds-18it.jsonl --confidence $c -q -o runs/fresh/seeds-18it-vs-start-$c.json; .venv/bin/cosearch evaluate score runs/s16-seed1/eval-init/rollouts.jsonl runs/s16-seed1/seeds-18it.jsonl --confidence $c -q -o runs/s16-seed1/seeds-18it-vs-start-$c.json; done
    for s in 0 1; do .venv/bin/cosearch evaluate score runs/fresh/start.jsonl runs/fresh/s16-seed$s-end.jsonl -q -o runs/fresh/s16-seed$s-vs-start.json; .venv/bin/cosearch evaluate score runs/s16-seed$s/eval-init/rollouts.jsonl runs/s16-seed$s/iter-0017/eval/rollouts.jsonl -q -o runs/s16-seed$s/vs-start.json; .venv/bin/cosearch evaluate score runs/s16-seed$s/iter-0011/eval/rollouts.jsonl runs/s16-seed$s/iter-0017/eval/rollouts.jsonl -q -o runs/s16-seed$s/vs-12.json; done
    .venv/bin/cosearch evaluate score runs/fresh/seeds-12it.jsonl runs/fresh/seeds-18it.jsonl -q -o runs/fresh/seeds-18it-vs-12it.json
    .venv/bin/cosearch evaluate score runs/s15-cosearch/seeds-12it.jsonl runs/s16-seed1/seeds-18it.jsonl -q -o runs/s16-seed1/seeds-18it-vs-12it.json
    .venv/bin/python bench/sampled_gains.py --pair "600 fresh single-hop, greedy: start -> the two arms' 18-iteration ends, pooled (stated, 98.33%)=runs/fresh/seeds-18it-vs-start-0.9833.json" --pair "600 fresh single-hop, greedy: start -> the two arms' 18-iteration ends, pooled (95%)=runs/fresh/seeds-18it-vs-start-0.95.json" --pair "630 held-out, greedy: start -> the two arms' 18-iteration ends, pooled (stated, 98.33%)=runs/s16-seed1/seeds-18it-vs-start-0.9833.json" --pair "630 held-out, greedy: start -> the two arms' 18-iteration ends, pooled (95%)=runs/s16-seed1/seeds-18it-vs-start-0.95.json" --pair "600 fresh single-hop, greedy: start -> seed 0's 18-iteration end=runs/fresh/s16-seed0-vs-start.json" --pair "600 fresh single-hop, greedy: start -> seed 1's 18-iteration end=runs/fresh/s16-seed1-vs-start.json" --pair "630 held-out, greedy: start -> seed 0's 18-iteration end=runs/s16-seed0/vs-start.json" --pair "630 held-out, greedy: start -> seed 1's 18-iteration end=runs/s16-seed1/vs-start.json" --pair "630 held-out, greedy: seed 0, 12 -> 18 iterations=runs/s16-seed0/vs-12.json" --pair "630 held-out, greedy: seed 1, 12 -> 18 iterations=runs/s16-seed1/vs-12.json" --pair "600 fresh single-hop, greedy: the two arms pooled, 12 -> 18 iterations=runs/fresh/seeds-18it-vs-12it.json" --pair "630 held-out, greedy: the two arms pooled, 12 -> 18 iterations=runs/s16-seed1/seeds-18it-vs-12it.json" --json runs/s16-seed1/pairs.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s16-seed0 runs/s16-seed1 --png bench/results/learning_study16.png --json bench/results/learning_study16.json --extra pairs=runs/s16-seed1/pairs.json --title "cosearch preset, study 16: both seeds continued to 18 iterations"

# Study 17 (issue 14, target a): the agent searches twice (bench/learning_study17.toml, stated before the run).
# Study 3's warm-up again with --max-turns 2 (~40 min here: 107 agent and 198 ranker demonstrations, twice study
# 3's tokens), then study 12's training at T = 2 from it (6 iterations; its eval-init is the T = 2 start on the
# 630), then the start and the end on the 400 fresh multi-hop questions. Stated: the end's greedy F1 gain over
# its own start on the 630 (target a) and on the fresh multi-hop questions, judged on the 97.5% CI. Described:
# the T = 2 start against study 12's T = 1 start, the end against study 12's end. A killed run continues from
# its last finished step; a finished warm-up or rollout is kept. About 4 h here in all (estimated before the run
# from study 12's times and twice the tokens a question). On a machine without the earlier studies' runs the
# recipe first rebuilds the question files they made (seconds; the same bytes, checked on 2026-12-06 against the
# hashes in learning_study13_fresh_multihop.json), and, after the stated figures, study 3's warm-up, study 12's
# run and its start on the fresh multi-hop questions for the described comparisons (~2 h more).
# Results: bench/results/learning_study17.md.
S17_ROLLOUT := "--index indexes/dev-bm25 --ranker llm --sizes cpu --max-turns 2 --top-n 5 --k 3 --max-new-tokens 64 --ranker-max-new-tokens 64 --passage-tokens 48 --question-chunk 16 --constrain agent,ranker --seed 0"
S17_START := "--agent runs/study17/warmup --ranker-model runs/study17/warmup"
S17_END := "--agent runs/s17-cosearch/iter-0005/agent --ranker-model runs/s17-cosearch/iter-0005/ranker"
learning-study17:
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    test -f runs/study3/warmup.jsonl || .venv/bin/python bench/learning_split.py --heldout 210 --warmup 168 --train-dev-per-dataset 60 --out runs/study3
    test -f runs/study8/train.jsonl || .venv/bin/python bench/answerable_pool.py --exclude runs/study3/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study8/train.jsonl
    test -f runs/study11-split/heldout.jsonl || .venv/bin/python bench/learning_split.py --heldout 630 --exclude runs/study3/warmup.jsonl --data ../shared/data --out runs/study11-split
    test -f runs/study11/train.jsonl || .venv/bin/python bench/answerable_pool.py --exclude runs/study11-split/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study11/train.jsonl
    test -f runs/fresh/multi-hop.jsonl || .venv/bin/python bench/fresh_heldout.py --datasets hotpotqa,2wikimultihopqa --per-dataset 200 {{FRESH_EXCLUDE}} --out runs/fresh/multi-hop.jsonl
    test -d runs/study17/warmup || .venv/bin/cosearch warmup --questions runs/study3/warmup.jsonl --exclude runs/study3/heldout.jsonl --index indexes/dev-bm25 --out runs/study17/warmup --max-turns 2 --k 3 --top-n 5 --max-new-tokens 64 --epochs 2 --lr 3e-5 --token-budget 2048 --ranker-demos evidence
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study17.toml --name s17-cosearch
    test -f runs/fresh/multi-hop-s17-start.jsonl || .venv/bin/cosearch rollout {{S17_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S17_START}} -o runs/fresh/multi-hop-s17-start.jsonl
    test -f runs/fresh/multi-hop-s17-end.jsonl || .venv/bin/cosearch rollout {{S17_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S17_END}} -o runs/fresh/multi-hop-s17-end.jsonl
    for c in 0.975 0.95; do .venv/bin/cosearch evaluate score runs/s17-cosearch/eval-init/rollouts.jsonl runs/s17-cosearch/iter-0005/eval/rollouts.jsonl --confidence $c -q -o runs/s17-cosearch/vs-start-$c.json; .venv/bin/cosearch evaluate score runs/fresh/multi-hop-s17-start.jsonl runs/fresh/multi-hop-s17-end.jsonl --confidence $c -q -o runs/fresh/multi-hop-s17-vs-start-$c.json; done
    test -d runs/study3/warmup || .venv/bin/cosearch warmup --questions runs/study3/warmup.jsonl --exclude runs/study3/heldout.jsonl --index indexes/dev-bm25 --out runs/study3/warmup --max-turns 1 --k 3 --top-n 5 --max-new-tokens 64 --epochs 2 --lr 3e-5 --token-budget 2048 --ranker-demos evidence
    .venv/bin/cosearch train --preset cosearch --config bench/learning_study12.toml --name s12-cosearch
    test -f runs/fresh/multi-hop-start.jsonl || .venv/bin/cosearch rollout {{S11_ROLLOUT}} --questions runs/fresh/multi-hop.jsonl --greedy --n 1 {{S11_START}} -o runs/fresh/multi-hop-start.jsonl
    .venv/bin/cosearch evaluate score runs/s12-cosearch/eval-init/rollouts.jsonl runs/s17-cosearch/eval-init/rollouts.jsonl -q -o runs/s17-cosearch/start-vs-t1-start.json
    .venv/bin/cosearch evaluate score runs/fresh/multi-hop-start.jsonl runs/fresh/multi-hop-s17-start.jsonl -q -o runs/fresh/multi-hop-s17-start-vs-t1-start.json
    .venv/bin/cosearch evaluate score runs/s12-cosearch/iter-0005/eval/rollouts.jsonl runs/s17-cosearch/iter-0005/eval/rollouts.jsonl -q -o runs/s17-cosearch/vs-s12-end.json
    .venv/bin/python bench/sampled_gains.py --pair "630 held-out, greedy (T = 2): start -> study 17's end (stated, 97.5%)=runs/s17-cosearch/vs-start-0.975.json" --pair "630 held-out, greedy (T = 2): start -> study 17's end (95%)=runs/s17-cosearch/vs-start-0.95.json" --pair "400 fresh multi-hop, greedy (T = 2): start -> study 17's end (stated, 97.5%)=runs/fresh/multi-hop-s17-vs-start-0.975.json" --pair "400 fresh multi-hop, greedy (T = 2): start -> study 17's end (95%)=runs/fresh/multi-hop-s17-vs-start-0.95.json" --pair "630 held-out, greedy: study 12's T = 1 start -> study 17's T = 2 start=runs/s17-cosearch/start-vs-t1-start.json" --pair "400 fresh multi-hop, greedy: study 12's T = 1 start -> study 17's T = 2 start=runs/fresh/multi-hop-s17-start-vs-t1-start.json" --pair "630 held-out, greedy: study 12's end (T = 1) -> study 17's end (T = 2)=runs/s17-cosearch/vs-s12-end.json" --json runs/s17-cosearch/pairs.json
    .venv/bin/python bench/learning_evidence.py --runs runs/s17-cosearch --png bench/results/learning_study17.png --json bench/results/learning_study17.json --extra pairs=runs/s17-cosearch/pairs.json --title "cosearch preset, study 17: study 12 searching twice (T = 2), from a two-search warm-up"

# Would METHOD.md's temperature 1.0, or reading 96 tokens a candidate, make the ranker sample informed departures
# from the retriever's first? Samples study 9's start ranker on 48 of its training calls (~15 min here):
# bench/results/ranker_exploration.json. After `just learning-study9`.
ranker-exploration:
    .venv/bin/python bench/ranker_exploration.py --run runs/s9-cosearch --ranker runs/study3/warmup --index indexes/dev-bm25 --calls 48 --samples 6 --json bench/results/ranker_exploration.json

# Whether BM25's tie order since 9579ea2 changes the held-out agent's candidates (after `just learning-evidence`):
# bench/results/bm25_tie_order.md (no model; seconds).
bm25-tie-order:
    .venv/bin/python bench/bm25_tie_order.py --calls runs/s4-cosearch/eval-init/rollouts.jsonl --index indexes/dev-bm25 --out bench/results/bm25_tie_order.md

# How often a ranker could show the agent an answer the retriever's top K miss, per retriever depth N (issue 14,
# target b): bench/results/ranker_room.md (no model; under a minute).
ranker-room:
    .venv/bin/python bench/ranker_room.py --exclude runs/study3/heldout.jsonl --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 400 --k 3 --depths 5 10 20 50 --out bench/results/ranker_room.md

# A ranker warm-up on more demonstrations (issue 14's ranker lever), judged on the 210 held-out ranker calls.
# `just ranker-warmup` (100 more questions per dataset, 4x study 3's demonstrations) writes ranker_warmup.json;
# `just ranker-warmup 300 runs/rw3-split ranker_warmup_10x runs/study7-split/warmup-ranker` (10x, compared with the
# 4x) writes ranker_warmup_10x.json (~1 h here).
ranker-warmup more="100" split="runs/study7-split" result="ranker_warmup" baseline="runs/study3/warmup":
    .venv/bin/python bench/learning_split.py --heldout 210 --warmup 168 --train-dev-per-dataset 60 --more-warmup {{more}} --out {{split}}
    .venv/bin/cosearch warmup --questions runs/study3/warmup.jsonl --questions {{split}}/warmup_more.jsonl --index indexes/dev-bm25 --out {{split}}/warmup-ranker --exclude runs/study3/heldout.jsonl --ranker-demos shuffled --epochs 1 --lr 3e-5 --token-budget 2048 --k 3 --top-n 5 --max-turns 1 --max-new-tokens 64 --seed 0
    .venv/bin/cosearch evaluate ranker --calls runs/s4-cosearch/eval-init/rollouts.jsonl --index indexes/dev-bm25 --ranker-model {{split}}/warmup-ranker --baseline-model {{baseline}} -o {{split}}/ranker-eval.json --per-call {{split}}/ranker-calls.parquet
    .venv/bin/python bench/ranker_warmup_summary.py --eval {{split}}/ranker-eval.json --per-call {{split}}/ranker-calls.parquet --warmup {{split}}/warmup-ranker --out bench/results/{{result}}.json

# Ranker warm-ups whose demonstrations choose only by evidence the ranker can see (issue 14, target b), after
# `just learning-evidence` (its s4-cosearch/eval-init holds the 210 held-out ranker calls): `cosearch warmup
# --visible-evidence` on the 4x questions of `just ranker-warmup`, the ranker reading `tokens` of each candidate,
# judged on the held-out calls read the same way. `just ranker-warmup-visible 96`, `just ranker-warmup-visible 32`
# and `just ranker-warmup-visible 96 balanced` (~1 h, ~40 min and ~25 min of warm-up here), then
# `just ranker-warmup-visible-result`. Results: bench/results/ranker_warmup_visible.md.
ranker-warmup-visible tokens="96" demos="evidence" split="runs/study7-split":
    .venv/bin/python bench/learning_split.py --heldout 210 --warmup 168 --train-dev-per-dataset 60 --more-warmup 100 --out {{split}}
    .venv/bin/cosearch warmup --questions runs/study3/warmup.jsonl --questions {{split}}/warmup_more.jsonl --index indexes/dev-bm25 --out runs/rwv-{{demos}}-{{tokens}}/warmup-ranker --exclude runs/study3/heldout.jsonl --ranker-demos {{demos}} --visible-evidence --ranker-passage-tokens {{tokens}} --epochs 1 --lr 3e-5 --token-budget 2048 --k 3 --top-n 5 --max-turns 1 --max-new-tokens 64 --seed 0
    .venv/bin/cosearch evaluate ranker --calls runs/s4-cosearch/eval-init/rollouts.jsonl --index indexes/dev-bm25 --ranker-model runs/rwv-{{demos}}-{{tokens}}/warmup-ranker --baseline-model runs/study3/warmup --ranker-passage-tokens {{tokens}} -o runs/rwv-{{demos}}-{{tokens}}/ranker-eval.json --per-call runs/rwv-{{demos}}-{{tokens}}/ranker-calls.parquet
    .venv/bin/python bench/ranker_warmup_summary.py --eval runs/rwv-{{demos}}-{{tokens}}/ranker-eval.json --per-call runs/rwv-{{demos}}-{{tokens}}/ranker-calls.parquet --warmup runs/rwv-{{demos}}-{{tokens}}/warmup-ranker --calls runs/s4-cosearch/eval-init/rollouts.jsonl --index indexes/dev-bm25 --out runs/rwv-{{demos}}-{{tokens}}/summary.json

# bench/results/ranker_warmup_visible.json: the summaries of the three `just ranker-warmup-visible` runs.
ranker-warmup-visible-result:
    .venv/bin/python -c "import json; json.dump({arm: json.load(open(f'runs/rwv-{arm}/summary.json')) for arm in ('evidence-96', 'evidence-32', 'balanced-96')}, open('bench/results/ranker_warmup_visible.json', 'w'), indent=2)"

# How much of the evidence the prompts show: answer-bearing candidates whose answer lies within B tokens.
evidence-in-view:
    .venv/bin/python bench/evidence_in_view.py --index indexes/dev-bm25 --calls runs/s4-cosearch/eval-init/rollouts.jsonl --questions runs/study3/warmup.jsonl --questions runs/study7-split/warmup_more.jsonl --out bench/results/evidence_in_view.md

# Fixed-set check (issue 7): GRPO raises the reward on the 8 training questions it sees every iteration.
learning-overfit:
    .venv/bin/python bench/learning_split.py --out runs/learning --subset bench/learning_overfit_ids.txt
    OMP_NUM_THREADS=1 .venv/bin/cosearch train --preset search-r1 --config bench/learning_overfit.toml --name learn-overfit
    .venv/bin/python bench/learning_evidence.py --runs runs/learn-overfit --png bench/results/learning_overfit.png --title "fixed-set check: 8 training questions every iteration (SmolLM2-135M, search-r1 preset, lr 1e-5)"

# Valid actions of the embedded model: free vs constrained vs warm-up vs both (issue 8), on ../shared/data dev.
bench-valid-actions per_dataset="15" n="4":
    test -d indexes/dev-bm25 || .venv/bin/cosearch index build --corpus '../shared/data/corpus/*.jsonl' --out indexes/dev-bm25
    OMP_NUM_THREADS=1 .venv/bin/python bench/valid_actions.py --per-dataset {{per_dataset}} --n {{n}} --warmup-per-dataset 8 --epochs 2 --index indexes/dev-bm25 --out bench/results/valid_actions.json --save-warmup runs/warmup-smollm2 --threads 1
