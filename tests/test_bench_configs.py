"""Every committed training config loads, and every `--config` a justfile recipe names exists and loads."""

import re
from pathlib import Path

import pytest

from cosearch_cli.train import PRESETS, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "bench").glob("*.toml")) + sorted((ROOT / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_config_loads_under_every_preset(path):
    for preset in (None, *PRESETS):
        config = load_config(path, preset=preset)
        assert config.iterations >= 1


def test_justfile_configs_exist():
    named = re.findall(r"--config (\S+\.toml)", (ROOT / "justfile").read_text())
    assert "bench/learning_study9.toml" in named
    for name in named:
        assert (ROOT / name).is_file(), name
        load_config(ROOT / name)


def differences(before: str, after: str):
    """Two committed study configs (cosearch preset) and the settings in which they differ."""
    a, b = (load_config(ROOT / "bench" / name, preset="cosearch") for name in (before, after))
    return a, b, {k for k in vars(a) if getattr(a, k) != getattr(b, k)}


def test_study9_differs_from_study8_only_in_k():
    s8, s9, changed = differences("learning_study8.toml", "learning_study9.toml")
    assert changed == {"k"}
    assert (s8.k, s9.k) == (3, 1)


def test_study10_differs_from_study9_only_in_temperature_and_ranker_reading():
    s9, s10, changed = differences("learning_study9.toml", "learning_study10.toml")
    assert changed == {"temperature", "ranker_passage_tokens"}
    assert (s9.temperature, s10.temperature) == (0.7, 1.0)
    assert (s9.ranker_passage_tokens, s10.ranker_passage_tokens) == (32, 96)


def test_study11_differs_from_study8_only_in_its_question_files():
    _, s11, changed = differences("learning_study8.toml", "learning_study11.toml")
    assert changed == {"questions", "dev_questions"}
    assert (str(s11.questions), str(s11.dev_questions)) == ("runs/study11/train.jsonl",
                                                             "runs/study11-split/heldout.jsonl")


def test_study12_differs_from_study11_only_in_the_agent_baseline():
    s11, s12, changed = differences("learning_study11.toml", "learning_study12.toml")
    assert changed == {"agent_baseline"}
    assert (s11.agent_baseline, s12.agent_baseline) == ("group", "greedy")


def test_study13_is_study12_run_for_twice_as_many_iterations():
    s12, s13, changed = differences("learning_study12.toml", "learning_study13.toml")
    assert changed == {"iterations"}
    assert (s12.iterations, s13.iterations) == (6, 12)


def test_study14_is_study12_with_another_seed():
    s12, s14, changed = differences("learning_study12.toml", "learning_study14.toml")
    assert changed == {"seed"}
    assert (s12.seed, s14.seed) == (0, 1)


def test_study15_is_study14_run_for_twice_as_many_iterations():
    s14, s15, changed = differences("learning_study14.toml", "learning_study15.toml")
    assert changed == {"iterations"}
    assert (s14.iterations, s15.iterations, s15.seed) == (6, 12, 1)


def test_study16_arms_are_studies_13_and_15_run_for_18_iterations():
    s13, arm0, changed0 = differences("learning_study13.toml", "learning_study16_seed0.toml")
    s15, arm1, changed1 = differences("learning_study15.toml", "learning_study16_seed1.toml")
    assert changed0 == changed1 == {"iterations"}
    assert (arm0.iterations, arm0.seed, arm1.iterations, arm1.seed) == (18, 0, 18, 1)


def test_study17_is_study12_searching_twice_from_a_two_search_warm_up():
    s12, s17, changed = differences("learning_study12.toml", "learning_study17.toml")
    assert changed == {"max_turns", "agent", "ranker_model"}
    assert (s12.max_turns, s17.max_turns) == (1, 2)
    assert str(s17.agent) == str(s17.ranker_model) == "runs/study17/warmup"
