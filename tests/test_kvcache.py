"""Prefix reuse in the transformers backend: stored prompts, shared instructions and kept turns must give
the same tokens and log-probs as encoding everything again, on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch

from cosearch_cli.generation.base import GenerationRequest, SamplingSettings
from cosearch_cli.generation.hf import HFBackend
from cosearch_cli.generation.kvcache import PrefixCache


def _kv(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(2, length, 4), torch.zeros(2, length, 4))]  # 2 * 2*length*4 floats * 4 bytes


def test_prefix_cache_finds_the_longest_proper_prefix_and_evicts_least_recent():
    cache = PrefixCache(max_bytes=10_000)
    cache.put((1, 2), _kv(2), shared=True)
    cache.put((1, 2, 3, 4), _kv(4))
    assert cache.longest([1, 2, 3, 4, 5]) == (4, (1, 2, 3, 4))
    assert cache.longest([1, 2, 3, 4]) == (2, (1, 2))  # a prompt must keep one token to encode
    assert cache.longest([9, 1, 2]) == (0, None)
    cache.consume((1, 2))  # shared: kept
    cache.consume((1, 2, 3, 4))  # a continuation: used once
    assert list(cache.entries) == [(1, 2)]
    # each 4-token entry is 2 * (2*4*4) * 4 = 256 bytes; a budget of 600 holds the two most recent
    small = PrefixCache(max_bytes=600)
    for first in range(3):
        small.put((first, 0, 0, 0), _kv(4))
    assert list(small.entries) == [(1, 0, 0, 0), (2, 0, 0, 0)] and small.nbytes == 512


def _requests(tokenizer):
    instructions = tokenizer.encode("You answer questions by searching a corpus of Wikipedia passages. " * 3)
    questions = ["Who wrote Moby Dick?", "Where is the Eiffel Tower?"]
    prompts = [instructions + tokenizer.encode(q) for q in questions]
    # the G samples of one question share its prompt; each row keeps its state for a next turn
    return [GenerationRequest(p, seed=10 * i + s, keep_cache=True) for i, p in enumerate(prompts) for s in range(3)]


@pytest.mark.parametrize("greedy", [True, False])
def test_reuse_gives_the_outputs_of_a_full_encoding(tiny_lm, greedy):
    model, tokenizer = tiny_lm
    settings = SamplingSettings(max_new_tokens=8, greedy=greedy, seed=5)
    reusing, plain = HFBackend(model, tokenizer), HFBackend(model, tokenizer, cache_bytes=0)
    first = _requests(tokenizer)
    a, b = reusing.generate(first, settings), plain.generate(first, settings)
    # instructions once, each repeated prompt once: rows encoded only their last token
    assert reusing.prefix_cache.reused_tokens >= sum(len(r.prompt_ids) - 1 for r in first)
    # the next turn extends every row's prompt + output with an observation
    observation = tokenizer.encode("<information>Doc 1: Herman Melville wrote it.</information>")
    second = [GenerationRequest(r.prompt_ids + g.token_ids + observation, seed=r.seed + 1)
              for r, g in zip(first, a)]
    before = reusing.prefix_cache.reused_tokens
    c, d = reusing.generate(second, settings), plain.generate(second, settings)
    assert reusing.prefix_cache.reused_tokens - before >= sum(len(r.prompt_ids) - len(observation) - 1
                                                            for r in second)
    for x, y in zip(a + c, b + d):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # turn-one continuations were used once and dropped; the shared instructions stay
    assert all(entry.shared for entry in reusing.prefix_cache.entries.values())


def test_stored_state_is_dropped_when_the_weights_change(tiny_lm):
    model, tokenizer = tiny_lm
    backend = HFBackend(model, tokenizer)
    settings = SamplingSettings(max_new_tokens=4, greedy=True)
    requests = _requests(tokenizer)
    backend.generate(requests, settings)
    assert len(backend.prefix_cache) > 0
    weight = model.model.layers[0].self_attn.k_proj.weight
    original = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(3.0)  # in place, as an optimizer step updates: the stored keys are now wrong
        changed = backend.generate(requests, settings)
        fresh = HFBackend(model, tokenizer, cache_bytes=0).generate(requests, settings)
        assert [g.token_ids for g in changed] == [g.token_ids for g in fresh]
        assert sum((g.logprobs for g in changed), []) == pytest.approx(sum((g.logprobs for g in fresh), []),
                                                                        abs=1e-4)
    finally:
        with torch.no_grad():
            weight.copy_(original)
