"""Every `cosearch` command the README shows parses as written (known subcommand, known options, values of the
right type), and the times the README, `--help` and the demo state are the same measurement."""

from __future__ import annotations

import re
import shlex

import typer.main
from conftest import ROOT, run_cli

from cosearch_cli.cli import app
from cosearch_cli.demo import DEMO_TIME
from cosearch_cli.train import PRESETS

PROGRAMS = ("cosearch", ".venv/bin/cosearch")


def readme_commands() -> list[str]:
    """`cosearch ...` invocations in the README's code blocks and inline code, continuation lines joined, one
    per pipe stage."""
    readme = (ROOT / "README.md").read_text()
    commands = []
    blocks = re.findall(r"```[a-z]*\n(.*?)```", readme, flags=re.S)
    inline = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", readme, flags=re.S))
    # Inline code counts when it is a whole command (it has options), not a name like `cosearch index wiki`.
    inline = [code for code in inline if " -" in code]
    for block in blocks + inline:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#\s.*$", "", line).strip()
            for part in re.split(r"\s*(?:\|\||\||&&|;)\s*", line):
                if part.split(" ", 1)[0] in PROGRAMS and " " in part:
                    commands.append(part)
    return commands


def _parse(command: str) -> None:
    words = shlex.split(command)[1:]
    for i, word in enumerate(words):  # shell redirections are not arguments
        if re.fullmatch(r"\d?>>?|<", word):
            words = words[:i]
            break
    target = typer.main.get_command(app)
    while hasattr(target, "commands") and words and words[0] in target.commands:
        target, words = target.commands[words[0]], words[1:]
    target.make_context(f"cosearch {target.name}", list(words))


def test_every_readme_command_parses_as_written():
    # `...` marks an elided part of an example, capitals a placeholder (`cosearch evaluate RUNS`)
    commands = [c for c in readme_commands() if "..." not in c and "--help" not in c
                and not re.search(r"\b[A-Z][A-Z_]+\b(?!=)", c.replace("$SLURM_CPUS_PER_TASK", ""))]
    assert len(commands) > 25
    failures = []
    for command in commands:
        try:
            _parse(command)
        except Exception as exc:  # typer's (vendored) click usage errors: unknown option, bad value, missing
            failures.append(f"{command}\n    -> {type(exc).__name__}: {exc}")
    assert not failures, "README commands that do not parse:\n" + "\n".join(failures)


def test_after_the_quick_start_the_readme_says_how_cosearch_gets_on_path():
    readme = (ROOT / "README.md").read_text()
    quick_start, rest = readme.split("## The pipeline", 1)
    assert "source .venv/bin/activate" in quick_start
    assert any(c.startswith("cosearch ") for c in readme_commands())


def test_readme_covers_every_stage_with_an_example():
    readme = (ROOT / "README.md").read_text()
    commands = readme_commands()
    for stage in ("index", "search", "rollout", "group", "reward", "update", "evaluate", "oracle", "warmup",
                  "train", "demo"):
        assert any(re.match(rf"(\.venv/bin/)?cosearch {stage}\b", c) for c in commands), stage
        assert f"`cosearch {stage}`" in readme or f"`{stage}`" in readme, stage


def test_readme_help_and_demo_state_the_same_measured_time():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert DEMO_TIME in readme
    help_text = " ".join(run_cli("demo", "--help").stdout.split())
    assert DEMO_TIME in help_text
    iterations = PRESETS["demo"]["iterations"]
    assert f"for {iterations} iterations" in help_text and f"(default: the demo preset's {iterations})" in help_text


def test_one_variable_moves_every_cache(tmp_path, monkeypatch):
    # Home quotas on clusters: the converted model (517 MB) and cached embeddings both follow COSEARCH_CACHE.
    from cosearch_cli.index.dense import embedding_cache_path
    from cosearch_cli.models import cache_dir

    monkeypatch.setenv("COSEARCH_CACHE", str(tmp_path / "scratch"))
    assert cache_dir() == tmp_path / "scratch"
    assert embedding_cache_path("minilm", "ab" * 32).parent == tmp_path / "scratch" / "embeddings"
    readme = (ROOT / "README.md").read_text()
    assert "export COSEARCH_CACHE=" in readme
