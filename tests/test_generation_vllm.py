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


@pytest.mark.slow
def test_constraints_through_structured_outputs_give_parseable_actions(backends):
    """The agent and ranker constraints reach vLLM as regex structured outputs: every sampled turn and ranking
    parses, and the recorded log-probs are still the model's own (unconstrained) ones, as the hf backend's."""
    from cosearch_cli import formats
    from cosearch_cli import ranker as ranking
    from cosearch_cli.agent import parse_turn, prompt_ids
    from cosearch_cli.constrain import make_constraints
    from cosearch_cli.generation.base import GenerationRequest, SamplingSettings
    from cosearch_cli.records import Passage

    vllm_backend, hf_backend = backends
    tokenizer = hf_backend.tokenizer
    made = make_constraints({"agent", "ranker"}, tokenizer, vocab_size=hf_backend.model.config.vocab_size)
    questions = ("Who wrote Moby-Dick?", "What is the capital of France?")
    agent = [GenerationRequest(prompt_ids(tokenizer, q, 2), constraint=made.agent(final=final), seed=s)
             for q in questions for final in (False, True) for s in range(2)]
    settings = SamplingSettings(max_new_tokens=160, temperature=1.0, seed=3)
    agent_gens = vllm_backend.generate(agent, settings)
    for request, gen in zip(agent, agent_gens):
        turn = parse_turn(gen.text)
        assert turn.error is None and turn.action in (("answer",) if request.constraint.final else ("search", "answer"))
    passages = [Passage(f"p{i}", f"Title {i}", f"Some passage text number {i}.") for i in range(5)]
    ranker = [GenerationRequest(ranking.prompt_ids(tokenizer, q, q, passages, 3, 16), constraint=made.ranker(n=5, k=3),
                                seed=s) for q in questions for s in range(2)]
    gens = vllm_backend.generate(ranker, SamplingSettings(max_new_tokens=160, temperature=1.0, seed=3,
                                                          stop=formats.RANKER_STOPS))  # as the rollout asks
    for gen in gens:
        # the regex fixes the shape; ids out of range or repeated are what strict parsing still rejects
        assert ranking.RANKING_OPEN in gen.text and gen.text.rstrip().endswith(ranking.RANKING_CLOSE)
    import torch

    # vLLM's own log-probs come after the regex mask (a forced tag token gets 0.0); the backend rescores them
    for request, gen in zip(agent + ranker, agent_gens + gens):
        with torch.no_grad():
            logits = hf_backend.model(torch.tensor([request.prompt_ids + gen.token_ids])).logits[0]
        expected = torch.log_softmax(logits[len(request.prompt_ids) - 1:-1].float(), -1)
        expected = expected.gather(1, torch.tensor(gen.token_ids).view(-1, 1)).view(-1)
        assert gen.logprobs == pytest.approx(expected.tolist(), abs=1e-3)
