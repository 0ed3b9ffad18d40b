"""The transformers backend against plain forward passes and `model.generate` on a tiny random Llama."""

from __future__ import annotations

import math

import pytest
import torch

from cosearch_cli.generation.base import GenerationRequest, SamplingSettings
from cosearch_cli.generation.hf import HFBackend


@pytest.fixture(scope="module")
def backend(tiny_lm):
    model, tokenizer = tiny_lm
    return HFBackend(model, tokenizer)


def _prompts(tokenizer):
    texts = ["The capital of France is", "Hello", "Who wrote the novel about a whale and a captain?"]
    return [tokenizer.encode(t) for t in texts]


def test_greedy_matches_model_generate_row_by_row(backend, tiny_lm):
    model, tokenizer = tiny_lm
    prompts = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=12, greedy=True)
    batched = backend.generate([GenerationRequest(p) for p in prompts], settings)
    for prompt, gen in zip(prompts, batched):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                   eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
        expected = reference[0, len(prompt):].tolist()
        # the random model never emits eos here, so both run the full length
        assert gen.token_ids == expected
        assert gen.finish_reason == "length"
        assert gen.text == tokenizer.decode(expected, skip_special_tokens=False)


def test_recorded_logprobs_are_the_tempered_model_distribution(backend, tiny_lm):
    model, tokenizer = tiny_lm
    prompts = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=10, temperature=0.7, top_p=0.5, seed=3)
    gens = backend.generate([GenerationRequest(p) for p in prompts], settings)
    for prompt, gen in zip(prompts, gens):
        full = torch.tensor([prompt + gen.token_ids])
        logits = model(full).logits[0, len(prompt) - 1:-1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids).view(-1, 1)).view(-1)
        assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        # top-p 0.5 never picks a token outside the nucleus, but the log-prob is recorded before top-p
        assert all(lp <= 0 for lp in gen.logprobs)


def test_same_seed_same_output_regardless_of_batch_neighbours(backend, tiny_lm):
    _, tokenizer = tiny_lm
    prompts = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=10, temperature=1.0, seed=11)
    requests = [GenerationRequest(p, seed=100 + i) for i, p in enumerate(prompts)]
    together = backend.generate(requests, settings)
    again = backend.generate(requests, settings)
    alone = backend.generate([requests[2]], settings)
    assert [g.token_ids for g in together] == [g.token_ids for g in again]
    assert alone[0].token_ids == together[2].token_ids
    other = backend.generate([GenerationRequest(prompts[2], seed=999)], settings)
    assert other[0].token_ids != together[2].token_ids


def test_stop_string_ends_the_row_and_keeps_the_stopping_token(backend, tiny_lm):
    _, tokenizer = tiny_lm
    prompt = _prompts(tokenizer)[0]
    free = backend.generate([GenerationRequest(prompt)], SamplingSettings(max_new_tokens=12, greedy=True))[0]
    # pick a stop string that the greedy continuation completes at its 5th token
    stop = tokenizer.decode(free.token_ids[3:5])
    assert stop.strip(), "test needs a printable stop string"
    stopped = backend.generate([GenerationRequest(prompt)],
                               SamplingSettings(max_new_tokens=12, greedy=True, stop=(stop,)))[0]
    first_hit = next(i for i in range(1, 13) if stop in tokenizer.decode(free.token_ids[:i]))
    assert stopped.token_ids == free.token_ids[:first_hit]
    assert stopped.finish_reason == "stop"


def test_counters_count_encoded_prompt_tokens_and_decoded_rows(tiny_lm):
    model, tokenizer = tiny_lm
    fresh = HFBackend(model, tokenizer, cache_bytes=0)  # no prefix reuse: every prompt token is encoded
    prompt = _prompts(tokenizer)[0]
    free = fresh.generate([GenerationRequest(prompt)], SamplingSettings(max_new_tokens=12, greedy=True))[0]
    stop = tokenizer.decode(free.token_ids[3:5])
    fresh.counters = type(fresh.counters)()
    prompts = _prompts(tokenizer)
    gens = fresh.generate([GenerationRequest(p) for p in prompts],
                          SamplingSettings(max_new_tokens=12, greedy=True, stop=(stop,)))
    assert gens[0].finish_reason == "stop" and len(gens[0].token_ids) < 12  # rows leave at different steps
    counters = fresh.counters
    assert counters.encoded_tokens == sum(len(p) for p in prompts)
    # a row's first token comes from the prompt pass; every later one is one row of a one-token pass
    assert counters.decode_rows == sum(len(g.token_ids) - 1 for g in gens)
    assert counters.decode_steps == max(len(g.token_ids) for g in gens) - 1
    assert counters.encode_seconds > 0 and counters.decode_seconds > 0


def test_constraint_masks_sampling_but_not_recorded_logprobs(backend, tiny_lm, force_text):
    model, tokenizer = tiny_lm
    prompt = _prompts(tokenizer)[1]
    target = tokenizer.encode("<search> paris </search>")
    request = GenerationRequest(prompt, constraint=force_text(target, len(tokenizer)))
    gen = backend.generate([request, GenerationRequest(prompt)], SamplingSettings(max_new_tokens=30, seed=1))[0]
    assert gen.token_ids == target
    assert gen.finish_reason in ("constraint", "stop")
    logits = model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(target).view(-1, 1)).view(-1)
    assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
    assert all(math.isfinite(lp) for lp in gen.logprobs)


def test_load_backend_names_its_errors(tmp_path):
    from cosearch_cli.errors import ConfigError, ModelError
    from cosearch_cli.generation import load_backend

    with pytest.raises(ConfigError, match="unknown generation backend 'tgi'"):
        load_backend("smollm2", "tgi")
    with pytest.raises(ModelError, match="not found"):
        load_backend(str(tmp_path / "missing"))
