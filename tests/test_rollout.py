"""The batched rollout loop: records, masks, batching, streaming, rankers, format failures, seeds."""

from __future__ import annotations

import re

import pytest

from cosearch_cli.agent import prompt_ids
from cosearch_cli.errors import ConfigError
from cosearch_cli.generation.base import Generation
from cosearch_cli.generation.hf import HFBackend
from cosearch_cli.metrics import has_answer
from cosearch_cli.models import load_tokenizer
from cosearch_cli.records import Hit, Passage, Question
from cosearch_cli.rollout import RolloutConfig, RolloutStats, run_rollouts

PASSAGES = [
    Passage("p0", "Lyon", "Lyon is a city in France on the Rhone."),
    Passage("p1", "Paris", "Paris is the capital and largest city of France."),
    Passage("p2", "France", "France is a country in Western Europe."),
    Passage("p3", "Berlin", "Berlin is the capital of Germany."),
    Passage("p4", "Moby-Dick", "Moby-Dick is a novel by Herman Melville."),
]


class WordIndex:
    """A tiny real retriever: score = number of query words in the passage, ties in corpus order."""

    def __init__(self, passages=PASSAGES):
        self.passages = {p.id: p for p in passages}
        self.docs = self
        self.calls: list[list[str]] = []

    def get(self, ids):
        return [self.passages[i] for i in ids]

    def retriever(self, kind=None):
        return self

    def search(self, queries, k):
        self.calls.append(list(queries))
        out = []
        for query in queries:
            words = set(re.findall(r"\w+", query.lower()))
            scored = [(len(words & set(re.findall(r"\w+", (p.title + " " + p.text).lower()))), -i, p.id)
                      for i, p in enumerate(self.passages.values())]
            out.append([Hit(pid, float(s)) for s, _, pid in sorted(scored, reverse=True)[:k]])
        return out


class Scripted:
    """A GenerationBackend whose output is a function of the decoded prompt (real tokenizer, fixed log-prob)."""

    name = "scripted"

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.batches = tokenizer, reply, []

    def generate(self, requests, settings):
        self.batches.append(len(requests))
        out = []
        for request in requests:
            ids = self.tokenizer.encode(self.reply(self.tokenizer.decode(request.prompt_ids)), add_special_tokens=False)
            out.append(Generation(ids, self.tokenizer.decode(ids), [-0.5] * len(ids)))
        return out


def search_then_answer(prompt):
    question = prompt.split("Question: ")[1].split("<|im_end|>")[0]
    if "<information>" not in prompt.split("<|im_start|>assistant")[1]:
        return f"<think>look it up</think><search> {question} </search>"
    return "<think>found</think><answer> Paris </answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


def questions(*texts):
    return [Question(f"q{i}", text, ["Paris"]) for i, text in enumerate(texts)]


def test_search_then_answer_record(tokenizer):
    agent = Scripted(tokenizer, search_then_answer)
    config = RolloutConfig(n=2, top_n=4, k=2, ranker="none", max_turns=2)
    (record,) = run_rollouts(questions("capital of France"), agent=agent, ranker_backend=None, index=WordIndex(),
                             config=config)
    assert record.question_id == "q0" and len(record.trajectories) == 2
    traj = record.trajectories[1]
    assert traj.sample == 1 and traj.answer == "Paris" and traj.format_ok and traj.n_searches == 1
    assert [t.action for t in traj.turns] == ["search", "answer"]
    assert traj.turns[0].query == "capital of France"
    assert traj.turns[0].ranker_call == "q0/s1/t0"
    assert traj.turns[0].observation_ids == ["p1", "p3"]  # 3 and 2 words in common, top-2 kept
    call = next(c for c in record.ranker_calls if c.id == "q0/s1/t0")
    assert call.candidate_ids == ["p1", "p3", "p0", "p2"] and call.candidate_scores == [3.0, 2.0, 1.0, 1.0]
    assert call.candidate_has_answer == [True, False, False, False]
    assert call.permutation == [0, 1] and call.chosen_ids == ["p1", "p3"] and call.valid
    # token bookkeeping: the mask covers exactly the generated turns, log-probs sit on them
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs)
    generated = [tok for tok, m in zip(traj.token_ids, traj.loss_mask) if m]
    assert generated == traj.turns[0].token_ids + traj.turns[1].token_ids
    assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if not m] == [0.0] * traj.loss_mask.count(0)
    assert set(lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m) == {-0.5}
    assert traj.loss_mask[:traj.prompt_len] == [0] * traj.prompt_len
    text = tokenizer.decode(traj.token_ids)
    assert "<information>\n[1] Paris: Paris is the capital" in text and "[2] Berlin:" in text
    assert record.sampling["k"] == 2 and record.sampling["ranker"] == "none" and record.sampling["n"] == 2


def test_one_batch_per_turn_for_agent_retriever_and_ranker(tokenizer):
    agent = Scripted(tokenizer, search_then_answer)
    ranker = Scripted(tokenizer, lambda prompt: "<reason>r</reason><ranking>[2] > [1]</ranking>")
    index = WordIndex()
    config = RolloutConfig(n=2, top_n=3, k=2, ranker="llm", question_chunk=3)
    records = list(run_rollouts(questions("capital of France", "Moby-Dick author", "Berlin"), agent=agent,
                                ranker_backend=ranker, index=index, config=config))
    assert [r.question_id for r in records] == ["q0", "q1", "q2"]
    assert agent.batches == [6, 6] and ranker.batches == [6] and len(index.calls) == 1
    call = records[1].ranker_calls[0]
    assert call.valid and call.permutation == [1, 0] and call.chosen_ids == call.candidate_ids[1::-1]
    assert call.output_text == "<reason>r</reason><ranking>[2] > [1]</ranking>"
    assert call.prompt_ids and tokenizer.decode(call.prompt_ids).count("Search query: Moby-Dick author") == 1


def test_questions_stream_through_a_bounded_pool(tokenizer):
    # q0 answers at once; the others search first. With one question in flight, batches never exceed n.
    def reply(prompt):
        return "<answer> Paris </answer>" if "Question: quick" in prompt else search_then_answer(prompt)

    agent = Scripted(tokenizer, reply)
    config = RolloutConfig(n=2, ranker="none", question_chunk=2)
    stream = run_rollouts(questions("quick", "capital of France", "Berlin"), agent=agent, ranker_backend=None,
                          index=WordIndex(), config=config)
    first = next(stream)
    assert first.question_id == "q0" and agent.batches == [4]  # yielded right after the first turn
    rest = list(stream)
    assert [r.question_id for r in rest] == ["q1", "q2"]
    assert max(agent.batches) == 4  # never more than question_chunk x n rows


def test_llm_ranker_invalid_output_falls_back_and_is_flagged(tokenizer):
    agent = Scripted(tokenizer, search_then_answer)
    ranker = Scripted(tokenizer, lambda prompt: "<reason>r</reason><ranking>[2] > [2]</ranking>")
    config = RolloutConfig(n=1, top_n=4, k=2, ranker="llm")
    stats = RolloutStats()
    (record,) = run_rollouts(questions("capital of France"), agent=agent, ranker_backend=ranker,
                             index=WordIndex(), config=config, stats=stats)
    call = record.ranker_calls[0]
    assert not call.valid and call.error == "duplicate ids" and call.chosen_ids == ["p1", "p3"]
    assert stats.ranker_calls == 1 and stats.ranker_invalid == 1
    lenient = RolloutConfig(n=1, top_n=4, k=2, ranker="llm", lenient_ranker=True)
    (record,) = run_rollouts(questions("capital of France"), agent=agent, ranker_backend=ranker,
                             index=WordIndex(), config=lenient)
    assert not record.ranker_calls[0].valid and record.ranker_calls[0].chosen_ids == ["p3", "p1"]


def test_a_search_without_candidates_skips_the_ranker(tokenizer):
    class NothingFound(WordIndex):
        def search(self, queries, k):
            return [[] for _ in queries]

    agent = Scripted(tokenizer, search_then_answer)
    ranker = Scripted(tokenizer, lambda prompt: "<ranking>[1]</ranking>")
    (record,) = run_rollouts(questions("zzz"), agent=agent, ranker_backend=ranker, index=NothingFound(),
                             config=RolloutConfig(n=1))
    call = record.ranker_calls[0]
    assert ranker.batches == [] and call.chosen_ids == [] and not call.valid
    assert call.error == "no candidates retrieved"
    assert "<information>\n(no results)\n</information>" in tokenizer.decode(record.trajectories[0].token_ids)
    assert record.trajectories[0].answer == "Paris"


def test_oracle_promotes_the_answer_passage(tokenizer):
    agent = Scripted(tokenizer, search_then_answer)
    config = RolloutConfig(n=1, top_n=4, k=2, ranker="oracle")
    question = Question("q", "France Rhone Europe country", ["Paris"])
    (record,) = run_rollouts([question], agent=agent, ranker_backend=None, index=WordIndex(), config=config)
    call = record.ranker_calls[0]
    assert call.candidate_ids == ["p2", "p0", "p1", "p3"]  # 3, 2, 1 and 0 query words
    assert call.candidate_has_answer == [False, False, True, False]
    assert call.chosen_ids == ["p1", "p2"]


def test_format_failures_are_recorded_not_raised(tokenizer):
    def reply(prompt):
        if "Question: chatty" in prompt:
            return "The answer is Paris, as in the example <answer> Paris </answer>"[:30]
        return "<search> again </search>"  # never answers

    agent = Scripted(tokenizer, reply)
    config = RolloutConfig(n=1, ranker="none", max_turns=2)
    stats = RolloutStats()
    chatty, searcher = run_rollouts(questions("chatty", "searcher"), agent=agent, ranker_backend=None,
                                    index=WordIndex(), config=config, stats=stats)
    traj = chatty.trajectories[0]
    assert traj.answer is None and not traj.format_ok
    assert traj.format_error == "turn 0: no <search> or <answer> action in the turn"
    assert [t.action for t in traj.turns] == ["invalid"]
    traj = searcher.trajectories[0]
    assert [t.action for t in traj.turns] == ["search", "search", "invalid"] and traj.n_searches == 2
    assert traj.format_error == "turn 2: searched after the last allowed search (2)"
    assert traj.answer is None
    # the last observation tells the agent to answer
    assert tokenizer.decode(traj.token_ids).count("No searches are left") == 1
    assert stats.format_failures == 2 and stats.trajectories == 2


def test_a_trajectory_that_outgrows_the_context_ends_as_a_format_failure(tokenizer):
    agent = Scripted(tokenizer, search_then_answer)
    prompt_len = len(prompt_ids(tokenizer, "capital of France", 2))
    # the first turn fits (prompt + 80 new); after a search and its observation, 80 more do not
    config = RolloutConfig(n=1, ranker="none", max_new_tokens=80, max_context=prompt_len + 100)
    (record,) = run_rollouts(questions("capital of France"), agent=agent, ranker_backend=None, index=WordIndex(),
                             config=config)
    traj = record.trajectories[0]
    assert [t.action for t in traj.turns] == ["search"] and traj.answer is None and not traj.format_ok
    assert traj.format_error.startswith(f"turn 1: context full ({len(traj.token_ids)} tokens + 80 new > ")


def test_config_errors():
    with pytest.raises(ConfigError, match="llm ranker needs a ranker model"):
        list(run_rollouts([], agent=None, ranker_backend=None, index=WordIndex(), config=RolloutConfig()))
    with pytest.raises(ConfigError, match="top_n \\(2\\) must be at least k \\(3\\)"):
        RolloutConfig(top_n=2, k=3, ranker="none").check(False)


# --- with a real (tiny, random) model -------------------------------------------------------------------


def forced_turns(tokenizer, force_text):
    """Agent constraint: search on the first turn, answer on the next (the random model would not)."""
    texts = {0: "<think>hm</think>\n<search> capital of France </search>", 1: "<answer> Paris </answer>"}

    def factory(ctx):
        return force_text(tokenizer.encode(texts[min(ctx.turn, 1)], add_special_tokens=False), len(tokenizer))

    return factory


def test_mask_covers_exactly_the_generated_text_with_a_real_model(tiny_lm, force_text):
    model, tokenizer = tiny_lm
    backend = HFBackend(model, tokenizer)
    config = RolloutConfig(n=2, top_n=4, k=2, ranker="llm", max_new_tokens=24, ranker_max_new_tokens=8,
                           agent_constraint=forced_turns(tokenizer, force_text))
    (record,) = run_rollouts(questions("capital of France"), agent=backend, ranker_backend=backend,
                             index=WordIndex(), config=config)
    for traj in record.trajectories:
        masked_in = [tok for tok, m in zip(traj.token_ids, traj.loss_mask) if m]
        assert tokenizer.decode(masked_in) == "".join(t.text for t in traj.turns)
        assert traj.answer == "Paris" and traj.n_searches == 1
        assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m] == traj.turns[0].logprobs + \
            traj.turns[1].logprobs
        assert all(lp < 0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)
    # the random ranker writes no valid ranking in 8 tokens: flagged and replaced by the retriever's top-K
    for call in record.ranker_calls:
        assert not call.valid and call.chosen_ids == call.candidate_ids[:2]
        assert len(call.output_ids) == len(call.logprobs) == 8
    assert record.sampling["constrain"] == ["agent"]


def test_same_seed_same_records_whatever_the_batch(tiny_lm):
    model, tokenizer = tiny_lm
    backend = HFBackend(model, tokenizer)
    qs = questions("capital of France", "who wrote Moby-Dick")

    def run(chunk, seed=5):
        config = RolloutConfig(n=2, ranker="none", max_new_tokens=8, question_chunk=chunk, seed=seed)
        return [t for r in run_rollouts(qs, agent=backend, ranker_backend=None, index=WordIndex(), config=config)
                for t in r.trajectories]

    together = run(2)
    # per-row seeds: batch composition does not change a trajectory (padding moves log-probs by ~1e-6 only)
    alone = run(1)  # two generate calls per turn instead of one
    assert [t.token_ids for t in alone] == [t.token_ids for t in together]
    for a, b in zip(alone, together):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert [t.token_ids for t in run(2, seed=6)] != [t.token_ids for t in together]


def test_prefix_reuse_changes_no_record_and_frees_finished_trajectories(tiny_lm, force_text):
    model, tokenizer = tiny_lm
    qs = questions("capital of France", "who wrote Moby-Dick")
    config = RolloutConfig(n=2, top_n=4, k=2, ranker="llm", max_new_tokens=24, ranker_max_new_tokens=8,
                           question_chunk=1, agent_constraint=forced_turns(tokenizer, force_text))
    reusing = HFBackend(model, tokenizer)
    plain = HFBackend(model, tokenizer, cache_bytes=0)
    records = []
    for record in run_rollouts(qs, agent=reusing, ranker_backend=reusing, index=WordIndex(), config=config):
        # a finished question leaves nothing behind but prefixes every prompt shares
        assert all(entry.shared for entry in reusing.prefix_cache.entries.values())
        records.append(record)
    assert reusing.prefix_cache.reused_tokens > 0 and len(reusing.prefix_cache) == 0  # emptied after the run
    expected = list(run_rollouts(qs, agent=plain, ranker_backend=plain, index=WordIndex(), config=config))
    for a, b in zip(records, expected):
        for x, y in zip(a.trajectories, b.trajectories):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        for x, y in zip(a.ranker_calls, b.ranker_calls):
            assert x.output_ids == y.output_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_answer_containment_reads_the_passage_text_not_its_title(tokenizer, fixture_bm25):
    # fixture passage musique-003220 is titled "Protestantism"; its text says "Protestant" only
    (passage,) = fixture_bm25.docs.get(["musique-003220"])
    answers = ["a set of Protestant Christian assumptions", "Protestantism"]
    assert has_answer(f"{passage.title}\n{passage.text}", answers) and not has_answer(passage.text, answers)

    def reply(prompt):
        if "<information>" not in prompt.split("<|im_start|>assistant")[1]:
            return "<think>t</think><search> Protestantism </search>"
        return "<answer> Protestantism </answer>"

    question = Question("q0", "What did the individual who prepared the Grand Model use as a basis for his "
                              "political beliefs?", answers)
    (record,) = run_rollouts([question], agent=Scripted(tokenizer, reply), ranker_backend=None,
                             index=fixture_bm25, config=RolloutConfig(n=1, top_n=10, k=3, ranker="oracle"))
    call = record.ranker_calls[0]
    flags = dict(zip(call.candidate_ids, call.candidate_has_answer))
    assert flags["musique-003220"] is False  # DPR: the text only
    texts = {p.id: p.text for p in fixture_bm25.docs.get(call.candidate_ids)}
    assert flags == {pid: has_answer(texts[pid], answers) for pid in call.candidate_ids}
    assert record.sampling["answer_containment"] == "text"
