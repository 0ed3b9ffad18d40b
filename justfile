# Recipes for people working on cosearch. `just --list` shows them.

# Create .venv with the CPU build of torch, cosearch and the embedded models.
setup:
    bash scripts/install.sh

# The test suite (the same command CI runs).
test:
    .venv/bin/python -m pytest -q

# Rebuild the fixture slice from ../shared/data.
fixtures:
    .venv/bin/python scripts/make_fixtures.py ../shared/data fixtures

# Speed of `cosearch group` and `cosearch reward`: 500 vs 2,000 questions (50 ranker calls each).
bench-group-reward:
    nice -n 10 .venv/bin/python bench/bench_group_reward.py --questions 500 2000 --repeats 3 --out bench/results/group_reward.md
