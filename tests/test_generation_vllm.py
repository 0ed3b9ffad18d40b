"""The vLLM backend against the transformers backend (runs only where vLLM is installed)."""

from __future__ import annotations

import pytest

from cosearch_cli.generation.vllm import vllm_available

REASON = vllm_available()
if REASON:
    print(f"\nskipping the vLLM backend tests: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def backends():
    from cosearch_cli.generation.hf import HFBackend
    from cosearch_cli.generation.vllm import VLLMBackend

    return VLLMBackend.load("smollm2", dtype="float32", enforce_eager=True), HFBackend.load("smollm2")


@pytest.mark.slow
def test_greedy_matches_transformers_and_logprobs_agree(backends):
    from cosearch_cli.agent import prompt_ids
    from cosearch_cli.generation.base import GenerationRequest, SamplingSettings

    vllm_backend, hf_backend = backends
    requests = [GenerationRequest(prompt_ids(hf_backend.tokenizer, q, 2)) for q in ("capital of France?", "2+2?")]
    settings = SamplingSettings(max_new_tokens=16, greedy=True, stop=("</answer>",))
    ours, theirs = hf_backend.generate(requests, settings), vllm_backend.generate(requests, settings)
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids and a.text == b.text
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


@pytest.mark.slow
def test_seeded_sampling_repeats(backends):
    from cosearch_cli.generation.base import GenerationRequest, SamplingSettings

    vllm_backend, _ = backends
    request = GenerationRequest(vllm_backend.tokenizer.encode("Once upon a time"), seed=7)
    settings = SamplingSettings(max_new_tokens=12, temperature=1.0)
    assert vllm_backend.generate([request], settings)[0].token_ids == \
        vllm_backend.generate([request], settings)[0].token_ids
