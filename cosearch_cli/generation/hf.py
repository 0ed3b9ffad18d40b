"""The transformers backend: a batched sampling loop over a KV cache, written out so that it can honour
per-sequence constraints, per-sequence seeds and stop strings, and record the log-probabilities the update
stage recomputes.

Why not `model.generate`: it draws every row's randomness from one global generator (so a row's sample
depends on what else is in the batch), and it can neither record log-probs before top-p/constraint masking
nor ask a per-row constraint object which tokens are allowed.

One step of the loop, per row: logits / temperature -> log_softmax (recorded) -> constraint mask -> top-p ->
Gumbel noise from the row's own generator -> argmax. Rows that finish leave the batch (their
cache rows are dropped), so a batch costs what its longest live rows cost.

Encoding is done once per token sequence (see `kvcache`): a prompt starts from the longest stored prefix
(a previous turn kept with `keep_cache`, a prompt several rows share, the instructions every prompt starts
with), and only the tokens after it are run through the model.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cosearch_cli.generation.base import Generation, GenerationRequest, SamplingSettings
from cosearch_cli.generation.kvcache import PrefixCache, new_cache, row_kv, seeded_cache

# Shared prefixes shorter than this are not worth a separate encoding pass.
MIN_SHARED_PREFIX = 16


def request_seed(settings_seed: int, index: int, request: GenerationRequest) -> int:
    """The seed of one row: its own if the caller set one, else derived from the batch seed and position."""
    if request.seed is not None:
        return request.seed
    return derive_seed(settings_seed, index)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across runs and machines, unlike hash())."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class EngineCounters:
    """Where a backend's model time went (for the rollout benchmark's ceiling; costs two clock reads a call)."""

    encoded_tokens: int = 0  # prompt tokens run through the model (padding not counted)
    encode_seconds: float = 0.0
    decode_steps: int = 0  # one-token forward passes
    decode_rows: int = 0  # tokens those passes computed (sum of their batch sizes)
    decode_seconds: float = 0.0


class HFBackend:
    """GenerationBackend over a Hugging Face causal LM on one device."""

    name = "hf"

    def __init__(self, model, tokenizer, *, max_batch: int = 64, cache_bytes: int = 2 * 2**30):
        """`cache_bytes`: budget for stored key/value state between calls (0 turns prefix reuse off)."""
        self.model = model
        self._tokenizer = tokenizer
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = _eos_ids(model, tokenizer)
        # transformers 5.x renamed `past_key_values` to `cache`; older releases only know the old name.
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.prefix_cache = PrefixCache(cache_bytes) if cache_bytes > 0 else None
        self._weights_stamp: tuple | None = None
        self._used: set[tuple[int, ...]] = set()  # stored prefixes the current call started from
        self.counters = EngineCounters()

    @classmethod
    def load(cls, name_or_path: str, *, device: str = "cpu", dtype: str = "float32", **kwargs) -> "HFBackend":
        from cosearch_cli.models import load_causal_lm

        model, tokenizer = load_causal_lm(name_or_path, device=device, dtype=dtype)
        return cls(model, tokenizer, **kwargs)

    @property
    def tokenizer(self):
        return self._tokenizer

    def release(self, sequence: Sequence[int]) -> None:
        """Forget the state kept for `sequence` (prompt + output minus its last token): its trajectory ended."""
        if self.prefix_cache is not None:
            self.prefix_cache.consume(tuple(sequence))

    def reset_cache(self) -> None:
        """Forget every stored key/value state (frees its memory)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest], settings: SamplingSettings) -> list[Generation]:
        assert all(r.prompt_ids for r in requests), "every request needs at least one prompt token"
        cache = self.prefix_cache
        self._used = set()
        if cache is not None:
            self._drop_stale_cache()
            self._store_shared_prefixes([r.prompt_ids for r in requests])
        starts = [cache.longest(r.prompt_ids) if cache is not None else (0, None) for r in requests]
        self._used.update(key for _, key in starts if key is not None)
        # Similar numbers of tokens to encode share a micro-batch, so little compute goes to padding.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids) - starts[i][0])
        results: list[Generation | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            seeds = [request_seed(settings.seed, i, requests[i]) for i in chunk]
            gens = self._generate_batch([requests[i] for i in chunk], seeds, settings, [starts[i] for i in chunk])
            for i, gen in zip(chunk, gens):
                results[i] = gen
        if cache is not None:
            for key in self._used:  # a continuation is used once; shared prefixes stay
                cache.consume(key)
        return results

    def _drop_stale_cache(self) -> None:
        """Stored states are only valid for the weights that computed them: forget them after an update."""
        try:
            stamp = tuple(p._version for p in self.model.parameters())
        except RuntimeError:  # parameters created under inference mode track no versions
            stamp = None
        if stamp is None or stamp != self._weights_stamp:
            self.prefix_cache.clear()
        self._weights_stamp = stamp

    def _store_shared_prefixes(self, prompts: list[list[int]]) -> None:
        """Encode once what several prompts share: the longest prefix common to all prompts that have
        nothing stored yet (the instructions), then every prompt that occurs more than once (the G samples
        of a question), so each row only encodes its own last tokens."""
        cache = self.prefix_cache
        fresh = [p for p in prompts if cache.longest(p)[0] == 0]
        if len({tuple(p) for p in fresh}) > 1:  # identical prompts only: the repeated-prompt step below
            common = min(_common_prefix_length(fresh), min(len(p) for p in fresh) - 1)
            if common >= MIN_SHARED_PREFIX:
                self._store([fresh[0][:common]], shared=True)
        counts: dict[tuple[int, ...], int] = {}
        for p in prompts:
            counts[tuple(p)] = counts.get(tuple(p), 0) + 1
        repeated = [list(key[:-1]) for key, n in counts.items()
                    if n > 1 and len(key) > 1 and cache.longest(key)[0] < len(key) - 1]
        if repeated:
            self._store(repeated, shared=False)

    def _store(self, sequences: list[list[int]], *, shared: bool) -> None:
        """Encode sequences (each from its own longest stored prefix) and store their state."""
        for start in range(0, len(sequences), self.max_batch):
            chunk = sequences[start:start + self.max_batch]
            starts = [self.prefix_cache.longest(s) for s in chunk]
            self._used.update(key for _, key in starts if key is not None)
            _, cache, attention, _ = self._encode(chunk, starts)
            for slot, seq in enumerate(chunk):
                self.prefix_cache.put(tuple(seq), row_kv(cache, slot, attention[slot].bool()), shared=shared)

    def _encode(self, prompts: list[list[int]], starts: list[tuple[int, tuple | None]]):
        """Run each prompt's tokens after its stored prefix through the model, as one padded batch.

        Row layout over the cache positions: [pad][stored prefix][pad][new tokens]; the attention mask hides
        the pads and position ids continue from each row's prefix. Returns (model output, cache, attention
        mask, next position per row)."""
        lengths = [n if key is not None and key in self.prefix_cache.entries else 0 for n, key in starts]
        prefixes = [self.prefix_cache.get(key) if n else None for n, (_, key) in zip(lengths, starts)]
        stored = max(lengths)
        new = max(len(p) - n for p, n in zip(prompts, lengths))
        batch = len(prompts)
        input_ids = torch.full((batch, new), self.pad_id, dtype=torch.long)
        positions = torch.zeros((batch, new), dtype=torch.long)
        attention = torch.zeros((batch, stored + new), dtype=torch.long)
        for row, (prompt, n) in enumerate(zip(prompts, lengths)):
            todo = len(prompt) - n
            input_ids[row, new - todo:] = torch.tensor(prompt[n:])
            positions[row, new - todo:] = torch.arange(n, len(prompt))
            attention[row, stored - n:stored] = 1
            attention[row, stored + new - todo:] = 1
        if self.prefix_cache is not None:
            self.prefix_cache.reused_tokens += sum(lengths)
        cache = seeded_cache(self.model, prefixes, lengths, stored) if stored else new_cache(self.model)
        started = time.perf_counter()
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: cache})
        self.counters.encode_seconds += time.perf_counter() - started
        self.counters.encoded_tokens += sum(len(p) - n for p, n in zip(prompts, lengths))
        next_pos = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        return out, cache, attention, next_pos

    def _generate_batch(self, requests: list[GenerationRequest], seeds: list[int], settings: SamplingSettings,
                        starts: list[tuple[int, tuple | None]]) -> list[Generation]:
        batch = len(requests)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        stop_tail = max((len(s) for s in settings.stop), default=0) + 2

        generated: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        live = list(range(batch))  # request rows still generating, in cache order
        out, cache, attention, next_pos = self._encode([r.prompt_ids for r in requests], starts)
        for step in range(settings.max_new_tokens):
            logits = out.logits[:, -1, :].float().cpu()
            tokens, token_logprobs = self._pick(logits, [requests[r] for r in live],
                                                [generated[r] for r in live], [generators[r] for r in live],
                                                settings)
            keep = []
            for slot, row in enumerate(live):
                token = tokens[slot]
                generated[row].append(token)
                logprobs[row].append(token_logprobs[slot])
                reason = self._finished(generated[row], requests[row], settings, stop_tail)
                if not reason and step == settings.max_new_tokens - 1:
                    reason = "length"
                if reason:
                    finish[row] = reason
                    if requests[row].keep_cache and self.prefix_cache is not None:
                        self._keep(requests[row].prompt_ids + generated[row][:-1], cache, slot, attention[slot])
                else:
                    keep.append(slot)
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep)
                cache.batch_select_indices(index.to(self.device))
                attention, next_pos = attention[index], next_pos[index]
                tokens = [tokens[s] for s in keep]
                live = [live[s] for s in keep]
            attention = torch.cat([attention, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
            started = time.perf_counter()
            out = self.model(input_ids=torch.tensor(tokens).view(-1, 1).to(self.device),
                             attention_mask=attention.to(self.device),
                             position_ids=next_pos.view(-1, 1).to(self.device), use_cache=True,
                             **{self._cache_kw: cache})
            self.counters.decode_seconds += time.perf_counter() - started
            self.counters.decode_steps += 1
            self.counters.decode_rows += len(live)
            next_pos = next_pos + 1
        return [Generation(token_ids=generated[row], logprobs=logprobs[row], finish_reason=finish[row],
                           text=self._tokenizer.decode(generated[row], skip_special_tokens=False))
                for row in range(batch)]

    def _keep(self, sequence: list[int], cache, slot: int, attention_row: torch.Tensor) -> None:
        """Store a finished row's state (its last sampled token was never fed, so it is not included)."""
        kv = row_kv(cache, slot, attention_row.bool())
        assert kv[0][0].shape[1] == len(sequence), "cached positions must match the row's tokens"
        self.prefix_cache.put(tuple(sequence), kv)

    def _pick(self, logits: torch.Tensor, requests: list[GenerationRequest], generated: list[list[int]],
              generators: list[torch.Generator], settings: SamplingSettings) -> tuple[list[int], list[float]]:
        """Choose one token per row; return the tokens and their recorded log-probs."""
        temperature = 1.0 if settings.greedy else settings.temperature
        assert temperature > 0, "temperature must be positive; use greedy=True for argmax decoding"
        recorded = torch.log_softmax(logits / temperature, dim=-1)
        scores = recorded.clone()
        for slot, request in enumerate(requests):
            if request.constraint is None:
                continue
            mask = request.constraint.allowed(generated[slot])
            if mask is not None:
                scores[slot] = scores[slot].masked_fill(~_fit_mask(mask, scores.shape[-1]), float("-inf"))
        if not settings.greedy:
            if settings.top_p < 1.0:
                scores = _top_p(scores, settings.top_p)
            # Gumbel-max with each row's own noise: the pick moves only if two perturbed scores tie within
            # float error, so batch-dependent rounding almost never changes a sample (an inverse-CDF draw over
            # 50k near-equal probabilities would flip often).
            noise = torch.empty_like(scores)
            for slot, generator in enumerate(generators):
                torch.rand(scores.shape[-1], generator=generator, out=noise[slot])
            scores = scores - torch.log(-torch.log(noise.clamp_(min=1e-20, max=1 - 1e-7)))
        tokens = scores.argmax(dim=-1)
        chosen = recorded.gather(1, tokens.view(-1, 1)).view(-1)
        return tokens.tolist(), chosen.tolist()

    def _finished(self, generated: list[int], request: GenerationRequest, settings: SamplingSettings,
                  stop_tail: int) -> str | None:
        if generated[-1] in self.eos_ids:
            return "stop"
        if settings.stop:
            tail = self._tokenizer.decode(generated[-stop_tail:], skip_special_tokens=False)
            if any(stop in tail for stop in settings.stop):
                return "stop"
        if request.constraint is not None and request.constraint.is_complete(generated):
            return "constraint"
        return None


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs with -inf outside each row's smallest top set whose mass reaches top_p (the top token stays)."""
    sorted_scores, sorted_idx = scores.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_scores, dim=-1)
    outside = (probs.cumsum(dim=-1) - probs) > top_p
    return scores.scatter(-1, sorted_idx, sorted_scores.masked_fill(outside, float("-inf")))


def _fit_mask(mask, vocab: int) -> torch.Tensor:
    """A constraint's mask sized to the model's logits (embedding matrices are often padded)."""
    mask = torch.as_tensor(mask, dtype=torch.bool).cpu()
    if mask.shape[-1] < vocab:
        mask = torch.cat([mask, torch.zeros(vocab - mask.shape[-1], dtype=torch.bool)])
    return mask[:vocab]


def _eos_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return {i for i in ids if i is not None}


def _common_prefix_length(sequences: list[list[int]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        i = 0
        while i < length and seq[i] == first[i]:
            i += 1
        length = i
    return length
