"""Builders shared by the update tests: a tiny random Llama and hand-made scored rollout records."""

from __future__ import annotations

import random

import torch

from cosearch_cli.records import GroupInfo, RankerCall, RolloutRecord, Trajectory


def smollm2_llama_config(tokenizer, *, hidden_size: int, intermediate_size: int, num_attention_heads: int,
                         num_key_value_heads: int):
    """A 2-layer Llama config over the SmolLM2 tokenizer (its special tokens, tied embeddings). Here rather than
    in conftest so that scripts/gpu_check.py can use it without pytest."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=2, num_attention_heads=num_attention_heads,
                       num_key_value_heads=num_key_value_heads, max_position_embeddings=4096,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)


def tiny_llama(vocab: int = 256, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def trajectory(sample: int, length: int, rng: random.Random, vocab: int, advantage: float | None,
               prompt_len: int = 5) -> Trajectory:
    """Prompt, then generated spans with an inserted observation between them (mask 0 there)."""
    ids = [rng.randrange(3, vocab) for _ in range(length)]
    mask = [0] * prompt_len
    while len(mask) < length:  # alternate generated (mask 1) and observation (mask 0) spans
        span = rng.randrange(2, 6)
        value = 1 if (len(mask) - prompt_len) % 2 == 0 or mask[-1] == 0 else 0
        mask += [value] * span
    mask = mask[:length]
    logprobs = [round(-rng.uniform(0.5, 6.0), 4) if m else 0.0 for m in mask]
    return Trajectory(sample=sample, turns=[], answer=None, n_searches=0, format_ok=True, token_ids=ids,
                      loss_mask=mask, logprobs=logprobs, prompt_len=prompt_len, advantage=advantage)


def scored_record(qid: str = "q1", advantages=(1.0, -0.5, 0.25, -0.75), lengths=(12, 17, 9, 14), vocab: int = 256,
                  seed: int = 0, temperature: float = 1.0, ranker: bool = True, kept: bool = True) -> RolloutRecord:
    rng = random.Random(seed)
    trajs = [trajectory(i, n, rng, vocab, a) for i, (a, n) in enumerate(zip(advantages, lengths))]
    calls = []
    if ranker:
        for i, adv in enumerate((0.8, -0.8, 0.4)):
            prompt = [rng.randrange(3, vocab) for _ in range(6 + i)]
            out = [rng.randrange(3, vocab) for _ in range(4 + 2 * i)]
            calls.append(RankerCall(id=f"{qid}/s{i}/t0", sample=i, turn=0, query="q", ranker="llm",
                                    candidate_ids=[], candidate_scores=[], candidate_has_answer=[],
                                    permutation=[], chosen_ids=[], prompt_ids=prompt, output_ids=out,
                                    logprobs=[round(-rng.uniform(0.5, 6.0), 4) for _ in out], advantage=adv))
    groups = [GroupInfo(f"{qid}/agent", "agent", [str(t.sample) for t in trajs], kept)]
    if ranker:
        groups.append(GroupInfo(f"{qid}/ranker/easy/c0", "ranker", [c.id for c in calls], kept))
    return RolloutRecord(question_id=qid, question="?", answers=["a"], dataset="test", trajectories=trajs,
                         ranker_calls=calls, stage="scored", sampling={"temperature": temperature}, groups=groups)
