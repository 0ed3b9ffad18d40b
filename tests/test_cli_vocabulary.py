"""One vocabulary across commands: what --sizes, --rules, --preset, --out and -o/--output mean everywhere."""

from __future__ import annotations

import orjson
import typer.main
from conftest import run_cli

from cosearch_cli.cli import app


def _commands(group=None, prefix=""):
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def _visible(command) -> dict[str, object]:
    return {opt: p for p in command.params if not getattr(p, "hidden", False) for opt in p.opts}


def test_preset_sizes_and_rules_each_mean_one_thing():
    commands = dict(_commands())
    for name in ("rollout", "oracle", "warmup"):  # how big a rollout is
        assert "--sizes" in _visible(commands[name]) and "--preset" not in _visible(commands[name]), name
    for name in ("group", "reward"):  # which rules score and group
        assert "--rules" in _visible(commands[name]) and "--preset" not in _visible(commands[name]), name
    assert "--preset" in _visible(commands["train"])  # a whole training run
    for name, command in commands.items():
        visible = _visible(command)
        assert not ("--preset" in visible and ("--sizes" in visible or "--rules" in visible)), name


def test_out_is_a_folder_and_output_is_a_file_or_stdout_everywhere():
    for name, command in _commands():
        for param in command.params:
            if "--out" in param.opts:
                assert "folder" in (param.help or "").lower(), (name, param.help)
            if "--output" in param.opts:
                assert param.opts == ["--output", "-o"], name
                assert "-" in (param.help or ""), (name, param.help)


def test_questions_take_several_files_and_globs_wherever_they_are_read():
    commands = dict(_commands())
    for name in ("rollout", "oracle", "warmup"):
        questions = next(p for p in commands[name].params if "--questions" in p.opts)
        assert questions.multiple and "glob" in questions.help, name


def test_old_preset_spelling_still_works_as_a_hidden_alias(tmp_path):
    from test_cli_group_reward import rollout_lines, write

    source = write(tmp_path / "r.jsonl", rollout_lines())
    new = run_cli("group", source, "--rules", "official", "-o", tmp_path / "new.jsonl")
    old = run_cli("group", source, "--preset", "official", "-o", tmp_path / "old.jsonl")
    assert new.exit_code == old.exit_code == 0, new.stderr + old.stderr
    manifests = [orjson.loads((tmp_path / f"{n}.manifest.json").read_bytes()) for n in ("new", "old")]
    assert manifests[0]["options"] == manifests[1]["options"] and manifests[0]["options"]["kmin_strict"] is True
    assert "--preset" not in run_cli("group", "--help").stdout
