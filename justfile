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
