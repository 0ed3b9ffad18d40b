"""Constrained decoding on a tiny random Llama: garbage without the constraint, always parseable with it."""

from __future__ import annotations

import re

import pytest
import torch

from cosearch_cli import formats
from cosearch_cli.constrain import (AgentConstraint, ConstraintLimits, RankerConstraint, TokenClasses,
                                    agent_regex, make_constraints, parse_roles, ranker_regex, regex_for)
from cosearch_cli.errors import ConfigError
from cosearch_cli.generation.base import GenerationRequest, SamplingSettings
from cosearch_cli.generation.hf import HFBackend
from cosearch_cli.ranker import parse_ranking as strict_ranking

SEEDS = range(24)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def classes(tiny_lm):
    return TokenClasses(tiny_lm[1])


@pytest.fixture(scope="module")
def backend(tiny_lm):
    return HFBackend(*tiny_lm)


def _prompt(tokenizer):
    return tokenizer.encode("Question: who wrote the song to make you feel my love?\nAnswer:")


def _sample(backend, tokenizer, make, *, temperature=1.0, greedy=False, n=len(SEEDS), max_new_tokens=128):
    requests = [GenerationRequest(_prompt(tokenizer), constraint=make() if make else None, seed=s)
                for s in range(n)]
    return backend.generate(requests, SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature,
                                                       greedy=greedy))


def parse_agent(text: str) -> tuple[str, str]:
    """A strict reading of one agent turn: the whole text is think + exactly one action, nothing else."""
    m = re.fullmatch(r"<think>([^<>]+)</think>\s*<(search|answer)>([^<>\n]*)</(search|answer)>", text)
    assert m, f"does not parse: {text!r}"
    assert m.group(2) == m.group(4), text
    assert m.group(3).strip(), f"empty {m.group(2)}: {text!r}"
    assert text.count("<") == 4, text
    return m.group(2), m.group(3).strip()


def parse_ranking(text: str, n: int, k: int) -> list[int]:
    m = re.fullmatch(r"<reason>([^<>]+)</reason>\s*<ranking>\s*(.*?)\s*</ranking>", text, flags=re.S)
    assert m and m.group(1).strip(), f"does not parse: {text!r}"
    body = m.group(2)
    assert re.fullmatch(r"\[\d+\](?: > \[\d+\])*", body), body
    ids = [int(i) for i in re.findall(r"\[(\d+)\]", body)]
    assert len(ids) == k and len(set(ids)) == k and all(1 <= i <= n for i in ids), (ids, n, k)
    return ids


def test_free_decoding_of_the_tiny_model_is_garbage(backend, tiny_lm):
    outs = _sample(backend, tiny_lm[1], None, max_new_tokens=40, n=8)
    assert not any(re.fullmatch(agent_regex(), g.text) for g in outs)


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_constrained_agent_turns_always_parse(backend, tiny_lm, classes, temperature):
    limits = ConstraintLimits(max_think=12, max_query=6, max_answer=5)
    outs = _sample(backend, tiny_lm[1], lambda: AgentConstraint(classes, limits=limits), temperature=temperature)
    actions = [parse_agent(g.text)[0] for g in outs]
    assert all(g.finish_reason == "constraint" for g in outs)
    assert set(actions) <= {"search", "answer"}
    assert all(re.fullmatch(agent_regex(), g.text) for g in outs)
    for g in outs:  # bounded: tags + at most max_think + max(max_query, max_answer) free tokens
        assert len(g.token_ids) <= AgentConstraint(classes, limits=limits).max_tokens


def test_final_turn_only_answers(backend, tiny_lm, classes):
    limits = ConstraintLimits(max_think=8, max_answer=4)
    outs = _sample(backend, tiny_lm[1], lambda: AgentConstraint(classes, final=True, limits=limits))
    assert [parse_agent(g.text)[0] for g in outs] == ["answer"] * len(outs)
    assert all(re.fullmatch(agent_regex(final=True), g.text) for g in outs)


def test_greedy_constrained_turn_parses(backend, tiny_lm, classes):
    (out,) = _sample(backend, tiny_lm[1], lambda: AgentConstraint(classes), greedy=True, n=1)
    parse_agent(out.text)


@pytest.mark.parametrize(("n", "k"), [(20, 5), (12, 8), (3, 5), (1, 1)])
def test_constrained_ranker_names_k_distinct_ids_in_range(backend, tiny_lm, classes, n, k):
    limits = ConstraintLimits(max_reason=6)
    outs = _sample(backend, tiny_lm[1], lambda: RankerConstraint(classes, n=n, k=k, limits=limits),
                   max_new_tokens=200)
    for g in outs:
        parse_ranking(g.text, n, min(n, k))
        assert strict_ranking(g.text, n, k).valid  # the rollout's strict parser, which requires the reason
        assert re.fullmatch(ranker_regex(min(n, k)), g.text)
        assert len(g.token_ids) <= RankerConstraint(classes, n=n, k=k, limits=limits).max_tokens


def test_ranker_ids_need_two_digits_when_n_has_them(classes):
    c = RankerConstraint(classes, n=12, k=2)
    prefix = c.open_ids + classes.encode(" ok") + c.ranking_ids + classes.encode("1")
    allowed = c.allowed(prefix)
    # after "1": "0", "1", "2" continue to 10..12; "]" closes id 1; "3" would make 13 > n
    digit = {t: s for t, s in classes.digits.items()}
    assert {digit[t] for t in allowed.nonzero().view(-1).tolist() if t in digit} == {"0", "1", "2"}
    assert bool(allowed[c.sep_ids[0]])
    prefix += classes.encode("2") + c.sep_ids  # chose 12
    allowed = c.allowed(prefix)
    assert not bool(allowed[classes.encode("0")[0]])  # no leading zero
    assert {digit[t] for t in allowed.nonzero().view(-1).tolist()} == set("123456789")
    prefix += classes.encode("1")
    # 12 is taken, so "2" may not follow "1"; "0" and "1" may (10, 11), and "]" closes id 1
    assert {digit.get(t, "]") for t in c.allowed(prefix).nonzero().view(-1).tolist()} == {"0", "1", "]"}


def test_disallowed_token_and_restart(classes):
    c = AgentConstraint(classes)
    assert c.allowed([]).nonzero().view(-1).tolist() == [c.open_ids[0]]
    with pytest.raises(ValueError):
        c.allowed([c.open_ids[0] + 1])
    # a fresh (shorter) sequence restarts the machine rather than keeping the broken state
    assert c.allowed([]).nonzero().view(-1).tolist() == [c.open_ids[0]]
    text = f"{formats.THINK_OPEN} find the singer{formats.THINK_CLOSE}\n{formats.ANSWER_OPEN} Bob Dylan"
    ids = classes.encode(text)
    assert not c.is_complete(ids)
    assert c.is_complete(ids + c.close_ids["answer"])
    assert not c.allowed(ids + c.close_ids["answer"]).any()


def test_empty_query_is_impossible(classes):
    c = AgentConstraint(classes)
    prefix = c.open_ids + classes.encode(" x") + c.action_ids["search"]
    allowed = c.allowed(prefix)
    assert not allowed[c.close_ids["search"][0]]
    assert not allowed[classes.encode(" ")[0]]
    assert allowed[classes.encode(" Dylan")[0]]


def test_recorded_logprobs_are_what_the_update_recomputes(backend, tiny_lm, classes):
    """The backend records log_softmax(logits / T) of the free model; the update computes the same numbers."""
    from cosearch_cli.update.batch import TrainSeq, collate
    from cosearch_cli.update.logprobs import token_logprobs

    model, tokenizer = tiny_lm
    temperature = 0.7
    outs = _sample(backend, tokenizer, lambda: AgentConstraint(classes, limits=ConstraintLimits(8, 4, 4)),
                   temperature=temperature, n=4)
    prompt = _prompt(tokenizer)
    seqs = [TrainSeq(f"s{i}", prompt + g.token_ids, [0] * len(prompt) + [1] * len(g.token_ids),
                     [0.0] * len(prompt) + g.logprobs, 1.0, temperature) for i, g in enumerate(outs)]
    mb = collate(seqs, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        recomputed, _ = token_logprobs(model, mb)
    torch.testing.assert_close(recomputed, mb.old_logprobs, atol=1e-5, rtol=0)
    # ... and they are the free distribution, not the renormalised constrained one: forced tag tokens, which
    # have probability 1 under the constraint, have clearly negative recorded log-probs.
    forced = [lp for g in outs for t, lp in zip(g.token_ids, g.logprobs) if t == classes.encode("think")[0]]
    assert forced and max(forced) < -1.0


def _structural_logmass(model, prompt, outs, make):
    """Mean log-probability the free model puts on the allowed set at the tag steps (few allowed tokens),
    the steps where free decoding goes wrong."""
    values = []
    for g in outs:
        logits = model(input_ids=torch.tensor([prompt + g.token_ids])).logits[0, len(prompt) - 1:-1]
        c = make()
        masks = torch.stack([c.allowed(g.token_ids[:t]) for t in range(len(g.token_ids))])
        tags = masks.sum(-1) < 100
        values.append(torch.log((torch.softmax(logits, -1) * masks).sum(-1))[tags].mean())
    return torch.stack(values).mean().item()


def test_full_distribution_gradient_makes_free_decoding_more_valid(tiny_lm, classes, backend):
    """Why the free-model log-prob is the right one: rewarding sampled valid turns raises the probability the
    *unconstrained* model puts on the tags; with the renormalised constrained log-prob a forced tag has
    log-prob 0 and no gradient, so free decoding barely moves."""
    import copy

    model, tokenizer = tiny_lm
    limits = ConstraintLimits(8, 4, 4)
    make = lambda: AgentConstraint(classes, limits=limits)  # noqa: E731
    outs = _sample(backend, tokenizer, make, n=4)
    prompt = _prompt(tokenizer)
    with torch.no_grad():
        base = _structural_logmass(model, prompt, outs, make)
    changes = {}
    for kind in ("free", "constrained"):
        trained = copy.deepcopy(model).train()
        opt = torch.optim.Adam(trained.parameters(), lr=1e-3)
        for _ in range(3):
            loss = 0.0
            for g in outs:  # advantage +1 on every sampled (valid) turn, token-mean loss
                logits = trained(input_ids=torch.tensor([prompt + g.token_ids])).logits[0, len(prompt) - 1:-1]
                if kind == "constrained":
                    c = make()
                    masks = torch.stack([c.allowed(g.token_ids[:t]) for t in range(len(g.token_ids))])
                    logits = logits.masked_fill(~masks, float("-inf"))
                logp = torch.log_softmax(logits, -1)
                loss = loss - logp.gather(1, torch.tensor(g.token_ids)[:, None]).mean() / len(outs)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            changes[kind] = _structural_logmass(trained.eval(), prompt, outs, make) - base
    assert changes["free"] > 0.3, changes
    assert changes["free"] > 3 * abs(changes["constrained"]), changes


def test_roles_switch():
    assert parse_roles("auto", "smollm2") == {"agent", "ranker"}
    assert parse_roles(None, "smollm2") == {"agent", "ranker"}
    assert parse_roles("auto", "/models/qwen2.5-7b") == set()
    assert parse_roles("none", "smollm2") == set()
    assert parse_roles("ranker", "/models/qwen2.5-7b") == {"ranker"}
    assert parse_roles("agent, ranker", "x") == {"agent", "ranker"}
    with pytest.raises(ConfigError, match="unknown role"):
        parse_roles("agent,judge", "smollm2")
    # auto judges each role by its own model
    assert parse_roles("auto", "/models/qwen2.5-7b", "smollm2") == {"ranker"}
    assert parse_roles("auto", "smollm2", "/models/qwen2.5-7b") == {"agent"}


def test_make_constraints_per_role(tiny_lm):
    tokenizer = tiny_lm[1]
    none = make_constraints(set(), tokenizer)
    assert none.agent is None and none.ranker is None
    only_ranker = make_constraints({"ranker"}, tokenizer, vocab_size=len(tokenizer) + 64)
    assert only_ranker.agent is None
    c = only_ranker.ranker(n=10, k=3)
    assert isinstance(c, RankerConstraint) and c.k == 3
    assert c.allowed([]).shape == (len(tokenizer) + 64,)  # sized to the model's padded logits
    both = make_constraints({"agent", "ranker"}, tokenizer)
    assert both.agent(final=True).final and not both.agent().final


def test_bounded_regexes_for_guided_decoders_close_every_part(classes):
    """vLLM gets these: unbounded free text let SmolLM2 reason until max_tokens and never act."""
    limits = ConstraintLimits(max_think=5, max_query=3, max_answer=2, max_reason=4)  # 20 / 12 / 8 / 16 chars
    agent, longest = regex_for(AgentConstraint(classes, limits=limits))
    assert re.fullmatch(agent, "<think>" + "a" * 20 + "</think>\n<search>" + "q" * 12 + "</search>")
    assert not re.fullmatch(agent, "<think>" + "a" * 21 + "</think>\n<search>q</search>")
    assert not re.fullmatch(agent, "<think>a</think>\n<search>" + "q" * 13 + "</search>")
    assert not re.fullmatch(agent, "<think>a</think>\n<answer>" + "q" * 9 + "</answer>")
    assert not re.fullmatch(agent, "<think>a</think>\n\n\n<answer>q</answer>")
    # <think></think> 15 chars + 2 spaces + the longer action's tags 17 + 4 x (5 + 3) = 66 chars, 4 bytes each
    assert longest == 66 * 4
    final, _ = regex_for(AgentConstraint(classes, final=True, limits=limits))
    assert not re.fullmatch(final, "<think>a</think>\n<search>q</search>")
    assert re.fullmatch(final, "<think>a</think> <answer>Paris</answer>")

    ranker, longest = regex_for(RankerConstraint(classes, n=12, k=3, limits=limits))
    assert re.fullmatch(ranker, "<reason>" + "r" * 16 + "</reason>\n<ranking> [12] > [1] > [3] </ranking>")
    assert not re.fullmatch(ranker, "<ranking> [12] > [1] > [3] </ranking>")  # the reason is required
    assert not re.fullmatch(ranker, "<reason>" + "r" * 17 + "</reason>\n<ranking> [12] > [1] > [3] </ranking>")
    assert not re.fullmatch(ranker, "<reason>r</reason>\n<ranking> [123] > [1] > [3] </ranking>")
    assert not re.fullmatch(ranker, "<reason>r</reason>\n<ranking> [1] > [3] </ranking>")
    # tags 8 + 9 + 9 + 10 = 36, 4 spaces, reason 16, 3 ids of up to 2 digits with "[", "]" and " > " = 3 x 7
    assert longest == (36 + 4 + 16 + 21) * 4
    assert regex_for(object.__new__(type("Other", (), {"limits": limits}))) is None
