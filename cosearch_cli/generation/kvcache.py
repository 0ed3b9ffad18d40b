"""Key/value state kept between generation calls, so a token sequence is encoded once.

Rollouts re-send long prompts: turn t+1 of a trajectory is its turn-t prompt + the turn's output + an
observation; the G samples of a question share one prompt; every agent prompt starts with the same
instructions, and so does every ranker prompt. Encoding those tokens again costs as much as generating
(prefill runs ~550 tokens/s on one core for the 135M model, batched or not), so the transformers backend keeps
the key/value tensors of sequences it has seen and starts a later prompt from its longest stored prefix.

`PrefixCache` holds one entry per stored sequence (per layer, keys and values of shape [heads, length, dim],
padding removed) under a byte budget, dropping the least recently used. `GrowingLayer` is a cache layer that
appends in place into spare capacity instead of re-concatenating the whole cache at every decoded token (which
at 1,000 tokens of context made each decode step ~1.5x slower: 356 vs 235 ms at batch 16 on one core).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values, each [heads, length, dim]


@dataclass
class _Entry:
    kv: LayerKV
    nbytes: int
    shared: bool  # a prefix several prompts start with: kept when used (a continuation is used once)


class PrefixCache:
    """Stored sequences' key/value tensors, found by the longest stored prefix of a new prompt."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.nbytes = 0
        self.reused_tokens = 0  # prompt tokens not encoded again (for stats and tests)

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def longest(self, prompt: Sequence[int]) -> tuple[int, tuple[int, ...] | None]:
        """(length, key) of the longest stored proper prefix of `prompt` (at least one token must stay to be
        encoded, for its logits); (0, None) when none is stored."""
        for length in sorted({len(k) for k in self.entries}, reverse=True):
            if length >= len(prompt):
                continue
            key = tuple(prompt[:length])
            if key in self.entries:
                return length, key
        return 0, None

    def get(self, key: tuple[int, ...]) -> LayerKV:
        self.entries.move_to_end(key)
        return self.entries[key].kv

    def put(self, key: tuple[int, ...], kv: LayerKV, *, shared: bool = False) -> None:
        if key in self.entries:
            self.entries[key].shared |= shared
            self.entries.move_to_end(key)
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        self.entries[key] = _Entry(kv, nbytes, shared)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def consume(self, key: tuple[int, ...]) -> None:
        """Forget a continuation once a longer sequence that extends it has been stored in its place."""
        entry = self.entries.get(key)
        if entry is not None and not entry.shared:
            del self.entries[key]
            self.nbytes -= entry.nbytes


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a buffer with spare room, appended to in place."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._n = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._k is None or self._n + new > self._k.shape[-2]:
            needed = self._n + new
            capacity = needed + max(128, needed // 4)  # room for decoding; amortised growth
            k = key_states.new_empty(*key_states.shape[:2], capacity, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:2], capacity, value_states.shape[-1])
            if self._n:
                k[:, :, :self._n], v[:, :, :self._n] = self._k[:, :, :self._n], self._v[:, :, :self._n]
            self._k, self._v = k, v
        self._k[:, :, self._n:self._n + new] = key_states
        self._v[:, :, self._n:self._n + new] = value_states
        self._n += new
        self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]

    def get_seq_length(self, *args, **kwargs) -> int:
        return self._n if self.is_initialized else 0


def new_cache(model) -> DynamicCache:
    """An empty cache for `model`, with growing layers wherever the model uses plain full-attention layers."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers:
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in layers]
    return cache


def layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) of shape [batch, heads, length, dim]."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # older transformers


def row_kv(cache: DynamicCache, slot: int, keep: torch.Tensor) -> LayerKV:
    """One batch row's keys/values at the positions where `keep` (bool over the cache length) is true."""
    index = keep.nonzero().view(-1).to(layer_tensors(cache)[0][0].device)
    return [(k[slot].index_select(1, index), v[slot].index_select(1, index)) for k, v in layer_tensors(cache)]


def seeded_cache(model, prefixes: Sequence[LayerKV | None], lengths: Sequence[int], width: int) -> DynamicCache:
    """A cache of `width` positions whose row i holds prefix i right-aligned (zeros before it, masked out)."""
    cache = new_cache(model)
    template = next(p for p in prefixes if p is not None)
    for layer, (k0, v0) in enumerate(template):
        keys = k0.new_zeros(len(prefixes), k0.shape[0], width, k0.shape[-1])
        values = v0.new_zeros(len(prefixes), v0.shape[0], width, v0.shape[-1])
        for row, (prefix, length) in enumerate(zip(prefixes, lengths)):
            if prefix is not None and length:
                keys[row, :, width - length:] = prefix[layer][0]
                values[row, :, width - length:] = prefix[layer][1]
        cache.update(keys, values, layer)
    return cache
