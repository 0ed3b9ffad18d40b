"""Agent prompt, observations and turn parsing."""

from __future__ import annotations

import pytest

from cosearch_cli.agent import AgentTemplate, observation_text, parse_turn, prompt_ids, truncate_to_tokens
from cosearch_cli.models import load_tokenizer
from cosearch_cli.records import Passage


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


@pytest.mark.parametrize("text, action, content", [
    ("<think>need facts</think>\n<search> capital of France </search>", "search", "capital of France"),
    ("<think>ok</think><answer> Paris </answer><|im_end|>", "answer", "Paris"),
    # the first closing tag decides; trailing text after the stop string is ignored
    ("<answer>Lyon</answer>\n<search>x</search>", "answer", "Lyon"),
    # the content is taken from the last opening tag before the closing one
    ("<search> a <search> b </search>", "search", "b"),
])
def test_parse_turn_actions(text, action, content):
    parsed = parse_turn(text)
    assert (parsed.action, parsed.content, parsed.error) == (action, content, None)


@pytest.mark.parametrize("text, error", [
    ("I think the answer is Paris.<|im_end|>", "no <search> or <answer> action in the turn"),
    ("Paris </answer>", "</answer> without <answer>"),
    ("<search>   </search>", "empty search"),
    ("<answer></answer>", "empty answer"),
    ("<search> cut off by the token lim", "no <search> or <answer> action in the turn"),
])
def test_parse_turn_format_failures(text, error):
    parsed = parse_turn(text)
    assert parsed.action == "invalid" and parsed.error == error and parsed.content is None


def test_prompt_is_a_chat_turn_with_the_question_and_turn_budget(tokenizer):
    ids = prompt_ids(tokenizer, "who wrote Moby-Dick?", 3)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert "Question: who wrote Moby-Dick?" in text and "up to 3 times" in text
    custom = prompt_ids(tokenizer, "q?", 1, AgentTemplate(instruction="Q: {question} {search_open}"))
    assert "Q: q? <search>" in tokenizer.decode(custom)


def test_observation_truncates_each_passage_to_the_budget(tokenizer):
    long = " ".join(["word"] * 200)
    passages = [Passage("a", "Alpha", long), Passage("b", "Beta", "short text")]
    (cut,) = truncate_to_tokens(tokenizer, [long], 10)
    assert cut.endswith(" ...") and len(tokenizer.encode(cut[:-4], add_special_tokens=False)) == 10
    text = observation_text(tokenizer, passages, 10, last=False)
    assert text == f"\n\n<information>\n[1] Alpha: {cut}\n[2] Beta: short text\n</information>\n\n"
    final = observation_text(tokenizer, passages, 10, last=True)
    assert final.startswith(text) and "final answer now between <answer> and </answer>" in final
