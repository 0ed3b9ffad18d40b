"""Shared test helpers: run the CLI like a user, find the fixture data, build tiny real models."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosearch_cli.cli import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | bytes | None = None) -> CliResult:
    """Invoke `cosearch ARGS` in-process; stdout and stderr are kept apart as a shell would."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES
