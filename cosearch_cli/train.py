"""The joint training loop: iterations of rollout -> group -> reward -> update (agent, ranker) -> evaluation.

Every step calls the same stage functions as the CLI and leaves its artifact under
`<out>/<name>/iter-NNNN/`. A step is done exactly when its artifact exists (artifacts are written atomically),
so a run that is killed and started again continues from the last finished step. Every iteration loads its
models from the previous iteration's checkpoint folders, which makes a resumed run produce the same result
as an uninterrupted one with the same seed.

Layout of a run folder:
    config.toml                 the resolved configuration (a rerun must match it)
    eval-base/, warmup/         with warmup_questions: the given models' evaluation, then the warm-up checkpoint
    eval-init/                  evaluation of the models RL starts from (rollouts.jsonl, summary.json)
    iter-0000/rollouts.jsonl    training rollouts of this iteration's questions
              grouped.jsonl     after `group`
              scored.jsonl      after `reward`
              agent/ ranker/    checkpoints (or agent.skipped.json when nothing was trainable)
              eval/             dev evaluation after this iteration's updates
              metrics.json      one row of the metrics log
    metrics.parquet             all iterations' rows (iteration -1: eval-init, -2: eval-base); curves.png draws
                                them, with 95% bootstrap CIs over questions (`<metric>_ci_low/high`)
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import random
import shutil
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import orjson

from cosearch_cli import advantages, grouping, rewards
from cosearch_cli.artifacts import Reader, Writer, make_manifest, write_bytes_atomic, write_json_atomic
from cosearch_cli.errors import ConfigError, NothingToDo
from cosearch_cli.ranker import RANKER_DEMOS
from cosearch_cli.records import Question, RolloutRecord, read_rollout
from cosearch_cli.records import read_questions as _read_question_file

Log = Callable[[str], None]


@dataclass
class TrainConfig:
    """One flat set of options for a training run; every field can be set in the TOML file."""

    name: str = "demo"
    """Run name: artifacts go to <out>/<name>/."""
    out: str = "runs"
    """Folder holding run folders."""
    questions: str = "fixtures/train.jsonl"
    """Training questions (JSONL)."""
    dev_questions: str = "fixtures/dev.jsonl"
    """Evaluation questions, never trained on."""
    corpus: str = "fixtures/corpus.jsonl"
    """Corpus to index when `index` does not exist yet."""
    index: str = "indexes/fixture"
    """Retrieval index folder (built from `corpus` if missing), or http://host:port of `cosearch serve`."""
    agent: str = "smollm2"
    """Initial agent model: 'smollm2' (embedded) or a local Hugging Face folder."""
    ranker_model: str = "smollm2"
    """Initial ranker model (used when ranker = 'llm')."""
    ranker: str = "llm"
    """'llm' (generative listwise ranker) or 'none' (retriever top-K, Search-R1)."""
    train_agent: bool = True
    """Update the agent each iteration."""
    train_ranker: bool = True
    """Update the ranker each iteration (needs ranker = 'llm')."""
    constrain: str = "auto"
    """Constrained decoding roles: auto (on for each role whose model is the embedded one or a checkpoint trained
    from it), none, agent, ranker, agent,ranker."""
    iterations: int = 2
    """Training iterations (one GRPO step per trained model each)."""
    questions_per_iteration: int = 4
    """Training questions rolled out per iteration."""
    n: int = 4
    """G: rollouts per question (one agent group)."""
    max_turns: int = 2
    """T: search turns per trajectory."""
    top_n: int = 10
    """N: retriever candidates given to the ranker."""
    k: int = 3
    """K: passages the ranker shows the agent."""
    max_new_tokens: int = 64
    """Agent tokens per turn."""
    ranker_max_new_tokens: int = 64
    """Ranker tokens per call (reason + ranking of k ids)."""
    passage_tokens: int = 48
    """Tokens of each passage's text in the agent's observation."""
    ranker_passage_tokens: int = 32
    """Tokens of each candidate's text in the ranker's prompt (top_n of them)."""
    question_chunk: int = 8
    """Questions in flight at once during training rollouts (the agent's batch is n x this); greedy evaluations
    keep n x this questions in flight, one trajectory each: the same rows."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    group_preset: str = "paper"
    """Grouping preset: paper (size >= kmin) or official (size > kmin)."""
    kmin: int = 3
    """Smallest ranker cluster that trains."""
    tau: float = 0.8
    """Unigram-F1 threshold for clustering sub-queries."""
    reward_preset: str = "paper"
    """Reward preset: paper (gamma 0.5, r_main F1) or official (gamma 0.8, binarised r_main)."""
    lr: float = 1e-6
    """AdamW learning rate of both models."""
    kl_coef: float = 0.001
    """k3 KL weight to the frozen initial model (0 skips the reference forward pass)."""
    lr_warmup: int = 0
    """Iterations over which the learning rate rises linearly to `lr` (iteration i uses lr x min(1, (i+1)/w));
    0: full lr from the first update. Adam's first steps move every weight by about lr whatever its gradient."""
    max_grad_norm: float = 1.0
    """Clip each update's global gradient norm to this (0: no clipping; the norm is logged either way)."""
    norm_over: str = "batch"
    """Divisor of the token-mean loss: batch (every response token of the role's groups, as verl and Search-R1)
    or trained (non-zero-advantage sequences only: the step grows as fewer groups carry signal)."""
    dynamic_sampling: bool = False
    """Draw more training questions until `questions_per_iteration` of them have unequal agent rewards (DAPO's
    dynamic sampling), at most `max_draw`; the agent trains on those groups only, the ranker on every drawn
    question's groups."""
    max_draw: int = 0
    """Most questions one iteration may draw with dynamic sampling (0: 4 x questions_per_iteration)."""
    rl_questions: str = "all"
    """Which training questions RL draws: "all", or "answerable" (those whose gold answer shows within the
    first `passage_tokens` of the retriever's top `k` for the question's own text, and is no top-`top_n`
    title: cosearch_cli/answerable.py; a pass-rate-style filter with the gold answers). The warm-up draws from
    all of them either way."""
    agent_baseline: str = "group"
    """What the agent's advantages are measured from: group (GRPO: the group's mean, scaled by its standard
    deviation, as METHOD.md) or greedy (ReMax: each training question is also rolled out once greedily by the
    same models, iteration's baseline.jsonl, and advantage = reward - that greedy trajectory's reward, unscaled;
    dynamic sampling then counts a question as carrying signal when some sample's reward differs from it)."""
    warmup_questions: int = 0
    """Supervised warm-up (`cosearch warmup`) on this many training questions before RL; the run then starts
    from its checkpoint (agent, and ranker when it is the same model) and `eval-base/` evaluates the given
    models before it. 0: no warm-up."""
    warmup_epochs: int = 2
    """Passes over the warm-up demonstrations."""
    warmup_lr: float = 5e-5
    """AdamW learning rate of the warm-up."""
    warmup_token_budget: int = 4096
    """Tokens (rows x longest row) per warm-up step: smaller gives more, smaller steps over the same data."""
    warmup_ranker_demos: str = "all"
    """Ranker calls the warm-up trains on: "all", or "evidence" (some candidate bears a gold answer or title;
    the others demonstrate the retriever's order, and a ranker warmed up on them learns to copy it), or
    "shuffled" (the evidence calls, candidates listed in a fixed random order), or "balanced" (the evidence
    calls, as many choosing the retriever's first candidate as another; `cosearch warmup --help`)."""
    warmup_visible_evidence: bool = False
    """Warm-up evidence only where the prompts show it: ranker demonstrations judge candidates by their first
    `ranker_passage_tokens` tokens, agent ones need the answer in their first `passage_tokens` (`cosearch
    warmup --visible-evidence`)."""
    heldout_kl: int = 8
    """Sequences per role from the untrained models' dev evaluation on which each update's exact
    KL(new || old) is measured (a diagnostic; never trained on). 0: off."""
    token_budget: int = 2048
    """Padded tokens per update micro-batch."""
    eval_every: int = 1
    """Evaluate on dev questions every this many iterations (0: only at the end)."""
    eval_limit: int = 24
    """Dev questions per evaluation (0: all)."""
    eval_init: bool = True
    """Evaluate the models RL starts from first (eval-init/)."""
    seed: int = 0
    """Seed of question order, sampling and updates."""
    device: str = "auto"
    """Where models run: cpu, cuda, or auto (cuda when available)."""
    dtype: str = "float32"
    """float32, or bfloat16: engines and the reference hold bf16 weights; updates compute in bf16 (autocast)
    over fp32 master weights, gradients and AdamW state (README "Devices and precision")."""
    backend: str = "hf"
    """Generation backend of agent and ranker: hf (transformers) or vllm (GPU; reloaded from each new
    checkpoint after an update)."""
    grad_checkpointing: bool = False
    """Recompute activations in the update's backward pass: slower, much less memory."""
    offload: bool = False
    """Shard the trainer with FSDP (one process) and keep its fp32 weights, gradients and AdamW state in host
    memory; the GPU holds one gathered layer at a time (needs CUDA)."""
    placement: str = "shared"
    """Where the roles go on GPUs: shared (agent and ranker engines, reference and trainer on one GPU) or split
    (engines on cuda:0, reference and trainer on cuda:1; needs 2 GPUs)."""
    agent_gpu_fraction: float = 0.3
    """vLLM gpu_memory_utilization of the agent engine (its weights and KV cache live inside it)."""
    ranker_gpu_fraction: float = 0.3
    """vLLM gpu_memory_utilization of the ranker engine."""
    recompute_logprobs: str = "auto"
    """Recompute old log-probs with the trainer before each update: on, off, or auto (on when the engine is
    not the trainer's numerics: vLLM, or bfloat16). The engine/trainer gap is logged when on."""
    tis_cap: float = 0.0
    """Truncated importance sampling cap on p_trainer / p_engine per token (needs recomputed log-probs); 0: off."""
    gpus: int = 0
    """GPUs this run may use, for the memory plan (0: those torch sees)."""
    gpu_memory_gib: float = 0.0
    """Memory of one GPU in GiB, for the memory plan (0: the visible GPU's; 80 when none is visible)."""
    keep_checkpoints: int = 1
    """Checkpoints kept per role, newest first (0: every iteration's). An older one is deleted once a later
    iteration has finished; a SmolLM2 checkpoint with its AdamW state is ~1.6 GB."""

    def check(self) -> "TrainConfig":
        problems = []
        if self.ranker not in ("llm", "none"):
            problems.append(("ranker", f"must be 'llm' or 'none', not {self.ranker!r}"))
        if self.train_ranker and self.ranker != "llm":
            problems.append(("train_ranker", "needs ranker = 'llm' (there is no ranker model to train)"))
        for key in ("iterations", "questions_per_iteration", "n", "top_n", "k", "max_new_tokens", "kmin",
                    "token_budget", "ranker_max_new_tokens", "passage_tokens", "ranker_passage_tokens",
                    "question_chunk"):
            if getattr(self, key) < 1:
                problems.append((key, f"must be at least 1, got {getattr(self, key)}"))
        if self.max_turns < 1:
            problems.append(("max_turns", f"must be at least 1, got {self.max_turns}"))
        if self.k > self.top_n:
            problems.append(("k", f"({self.k}) cannot exceed top_n ({self.top_n})"))
        if self.n < 2 and self.train_agent:
            problems.append(("n", "must be at least 2: a GRPO group of one rollout carries no signal"))
        largest_cluster = self.n * self.max_turns
        if self.train_ranker and self.kmin > largest_cluster:
            problems.append(("kmin", f"({self.kmin}) is larger than the most ranker calls one question can make "
                                     f"(n x max_turns = {largest_cluster}), so no ranker group could ever train"))
        if not 0 < self.tau <= 1:
            problems.append(("tau", f"must be in (0, 1], got {self.tau}"))
        if self.warmup_questions < 0 or self.warmup_epochs < 1 or not self.warmup_lr > 0 or \
                self.warmup_token_budget < 1:
            problems.append(("warmup_questions/warmup_epochs/warmup_lr/warmup_token_budget",
                             "must be >= 0, >= 1, > 0 and >= 1"))
        if self.warmup_ranker_demos not in RANKER_DEMOS:
            problems.append(("warmup_ranker_demos",
                             f"must be one of {', '.join(RANKER_DEMOS)}, not {self.warmup_ranker_demos!r}"))
        if self.lr_warmup < 0 or self.max_grad_norm < 0 or self.max_draw < 0 or self.heldout_kl < 0:
            problems.append(("lr_warmup/max_grad_norm/max_draw/heldout_kl", "must be >= 0"))
        if self.rl_questions not in RL_QUESTIONS:
            problems.append(("rl_questions", f"must be one of {', '.join(RL_QUESTIONS)}, not {self.rl_questions!r}"))
        if self.agent_baseline not in AGENT_BASELINES:
            problems.append(("agent_baseline", f"must be one of {', '.join(AGENT_BASELINES)}, "
                                               f"not {self.agent_baseline!r}"))
        if self.norm_over not in ("batch", "trained"):
            problems.append(("norm_over", f"must be 'batch' or 'trained', not {self.norm_over!r}"))
        if self.dynamic_sampling and self.max_draw and self.max_draw < self.questions_per_iteration:
            problems.append(("max_draw", f"({self.max_draw}) must be at least questions_per_iteration "
                                         f"({self.questions_per_iteration})"))
        for f in fields(self):  # NaN passes every comparison above and below: refuse it (and infinity) first
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                problems.append((f.name, f"must be a finite number, got {value}"))
        if self.lr <= 0 or self.kl_coef < 0 or self.temperature <= 0:
            problems.append(("lr/kl_coef/temperature", "lr and temperature must be > 0, kl_coef >= 0"))
        if self.eval_every < 0 or self.eval_limit < 0:
            problems.append(("eval_every/eval_limit", "must be >= 0"))
        if self.keep_checkpoints < 0:
            problems.append(("keep_checkpoints", f"must be >= 0 (0 keeps all), got {self.keep_checkpoints}"))
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            problems.append(("device", f"must be auto, cpu or cuda, not {self.device!r}"))
        if self.dtype not in ("float32", "bfloat16"):
            problems.append(("dtype", f"must be float32 or bfloat16, not {self.dtype!r}"))
        if self.backend not in ("hf", "vllm"):
            problems.append(("backend", f"must be hf or vllm, not {self.backend!r}"))
        if not (0 < self.agent_gpu_fraction < 1 and 0 < self.ranker_gpu_fraction < 1):
            problems.append(("agent_gpu_fraction/ranker_gpu_fraction", "must be in (0, 1)"))
        if self.placement not in ("shared", "split"):
            problems.append(("placement", f"must be shared or split, not {self.placement!r}"))
        if self.recompute_logprobs not in ("auto", "on", "off"):
            problems.append(("recompute_logprobs", f"must be auto, on or off, not {self.recompute_logprobs!r}"))
        if self.tis_cap and (self.tis_cap < 1 or self.recompute_logprobs == "off"):
            problems.append(("tis_cap", "must be 0 (off) or >= 1, with recompute_logprobs auto or on"))
        if self.gpus < 0 or self.gpu_memory_gib < 0:
            problems.append(("gpus/gpu_memory_gib", "must be >= 0 (0: detected)"))
        if self.group_preset not in grouping.PRESETS:
            problems.append(("group_preset", f"must be one of {', '.join(grouping.PRESETS)}"))
        if self.reward_preset not in rewards.PRESETS:
            problems.append(("reward_preset", f"must be one of {', '.join(rewards.PRESETS)}"))
        if problems:
            key, message = problems[0]
            more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
            raise ConfigError(f"config key {key!r} {message}{more}", fix="fix the value in the config or options")
        return self


AGENT_BASELINES = ("group", "greedy")
RL_QUESTIONS = ("all", "answerable")

# The rollout preset `paper` (cosearch_cli/rollout.py PRESETS), repeated so that reading a training configuration
# does not import torch; tests/test_train_paper.py checks that `train --preset paper-7b` hands the rollout these.
PAPER_ROLLOUT = dict(n=8, top_n=50, k=5, max_turns=6, max_new_tokens=500, ranker_max_new_tokens=256,
                     passage_tokens=160, ranker_passage_tokens=128, question_chunk=64)
# Where the paper presets run: one GPU node, vLLM engines, bf16 compute, the trainer's state offloaded to host
# memory (the memory plan of `cosearch train --preset paper-7b --dry-run` shows why).
PAPER_GPU = dict(device="cuda", dtype="bfloat16", backend="vllm", grad_checkpointing=True, offload=True,
                 token_budget=10240)
# METHOD.md's update settings: lr 1e-6, k3 KL 0.001, temperature 1.0; clip 0.2 on both sides, one epoch and
# token-mean aggregation are UpdateConfig's defaults, and verl's gradient clipping at norm 1.0.
PAPER_UPDATE = dict(lr=1e-6, kl_coef=0.001, temperature=1.0, max_grad_norm=1.0)

# The three comparison presets share every setting but what the paper varies, so they cost the same compute.
PRESETS: dict[str, dict] = {
    # Sized for about 15 minutes on a quiet 2-core CPU. The shipped SmolLM2 first learns the formats from a
    # supervised warm-up on 24 training questions (2 epochs, lr 3e-5; measured on the 28 dev questions under
    # load: F1 0.076 -> 0.313), then GRPO with the references' clipping and divisor, a learning rate warmed up
    # to 2e-6 over the 2 iterations, no KL, and dynamic sampling so each update has groups with a spread.
    "demo": dict(name="demo", iterations=2, questions_per_iteration=4, n=4, max_turns=1, top_n=5, k=3,
                 eval_limit=28, eval_every=0, constrain="agent,ranker", warmup_questions=24, warmup_epochs=2,
                 warmup_token_budget=2048, warmup_lr=3e-5, lr=2e-6, lr_warmup=2, kl_coef=0.0,
                 dynamic_sampling=True, max_draw=8),
    "search-r1": dict(name="search-r1", ranker="none", train_ranker=False),
    "fixed-ranker": dict(name="fixed-ranker", ranker="llm", train_ranker=False),
    "cosearch": dict(name="cosearch", ranker="llm", train_ranker=True),
    # The paper's settings: 7B (or 3B) agent, 7B ranker, every rollout budget of the rollout preset `paper`, the
    # update settings of METHOD.md. They need GPUs (see README "From this laptop to Qwen2.5-7B on a cluster").
    "paper-7b": dict(name="paper-7b", agent="Qwen/Qwen2.5-7B-Instruct", ranker_model="Qwen/Qwen2.5-7B-Instruct",
                     **PAPER_ROLLOUT, **PAPER_UPDATE, **PAPER_GPU, questions_per_iteration=512, iterations=100,
                     constrain="none", eval_limit=0, eval_every=10),
    "paper-3b": dict(name="paper-3b", agent="Qwen/Qwen2.5-3B-Instruct", ranker_model="Qwen/Qwen2.5-7B-Instruct",
                     **PAPER_ROLLOUT, **PAPER_UPDATE, **PAPER_GPU, questions_per_iteration=512, iterations=100,
                     constrain="none", eval_limit=0, eval_every=10),
}


def load_config(path: str | Path | None = None, *, preset: str | None = None, **overrides) -> TrainConfig:
    """Preset values, then the TOML file's, then explicit overrides (None values are ignored)."""
    values: dict = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}", fix=f"use one of {', '.join(PRESETS)}")
        values.update(PRESETS[preset])
    if path is not None:
        values.update(_read_toml(Path(path)))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**values).check()


def _read_toml(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("config file not found", path=path, fix="check the path") from None
    except IsADirectoryError:
        raise ConfigError("is a folder, not a config file", path=path, fix="pass the TOML file inside it") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML ({exc})", path=path, fix="see examples/train.toml") from None
    known = {f.name: f for f in fields(TrainConfig)}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}", path=path,
                              fix=f"known keys: {', '.join(known)}")
        expected = type(getattr(TrainConfig(), key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            data[key] = float(value)
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"config key {key!r} should be {expected.__name__}, got {type(value).__name__}",
                              path=path, fix="fix its value")
    return data


def to_toml(config: TrainConfig) -> str:
    lines = []
    for key, value in asdict(config).items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = orjson.dumps(value).decode()
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Helpers shared by the steps


def read_questions(path: str | Path) -> list[Question]:
    return _read_question_file(path)[0]


def read_records(path: Path, min_stage: str = "rollout") -> list[RolloutRecord]:
    return [read_rollout(row.data, row.path, row.line, min_stage=min_stage) for row in Reader.open(path).rows()]


def write_records(path: Path, records: Sequence[RolloutRecord] | Iterator[RolloutRecord], manifest: dict) -> int:
    with Writer(path) as writer:
        writer.write_all(records)
        writer.manifest = manifest
    return writer.count


def eval_questions(questions: Sequence[Question], limit: int) -> list[Question]:
    """The first `limit` questions taken round-robin over datasets, so a small evaluation covers all of them."""
    if not limit:
        return list(questions)
    by_dataset: dict[str, list[Question]] = {}
    for q in questions:
        by_dataset.setdefault(q.dataset, []).append(q)
    out: list[Question] = []
    for rank in range(max(len(qs) for qs in by_dataset.values())):
        out.extend(qs[rank] for qs in by_dataset.values() if rank < len(qs))
    return out[:limit]


def iteration_questions(questions: Sequence[Question], config: TrainConfig, iteration: int) -> list[Question]:
    """A fixed shuffle per epoch of the training set; iteration i takes the next slice."""
    per = config.questions_per_iteration
    return list(itertools.islice(question_stream(questions, config.seed, iteration * per), per))


def question_stream(questions: Sequence[Question], seed: int, start: int) -> Iterator[Question]:
    """The training questions in a fixed shuffle per epoch, endlessly, from position `start` on."""
    position = start
    while True:
        epoch, offset = divmod(position, len(questions))
        order = list(range(len(questions)))
        random.Random(seed * 1000003 + epoch).shuffle(order)
        yield from (questions[i] for i in order[offset:])
        position = (epoch + 1) * len(questions)


def lr_at(config: TrainConfig, iteration: int) -> float:
    """The learning rate of iteration `iteration`'s updates: linear warm-up over `lr_warmup` iterations."""
    if config.lr_warmup <= 0:
        return config.lr
    return config.lr * min(1.0, (iteration + 1) / config.lr_warmup)


def has_spread(record: RolloutRecord) -> bool:
    """The question's agent group carries signal: its trajectories' rewards are not all equal, or, when the
    group has a baseline (agent_baseline = "greedy"), not all equal to the baseline."""
    rewards_ = [t.reward for t in record.trajectories if t.reward is not None]
    baseline = next((g.baseline for g in record.groups if g.role == grouping.AGENT), None)
    return advantages.no_signal_from(rewards_, baseline) == ""  # no rewards, or one without a baseline: no signal


def rollout_settings(config: TrainConfig, *, greedy: bool, seed: int, ranker: str | None = None):
    """The RolloutConfig the training loop hands `run_rollouts` (without decoding constraints, which need the
    loaded tokenizers): every budget comes from `config`; greedy evaluation rolls out one trajectory per question
    and keeps n times as many questions in flight, so its batches have the training rollouts' rows (greedy
    trajectories do not depend on the batch: tests/test_rollout.py)."""
    from cosearch_cli.rollout import RolloutConfig

    c = config
    return RolloutConfig(n=1 if greedy else c.n, max_turns=c.max_turns, top_n=c.top_n, k=c.k,
                         ranker=ranker or c.ranker, greedy=greedy, temperature=c.temperature, seed=seed,
                         max_new_tokens=c.max_new_tokens, ranker_max_new_tokens=c.ranker_max_new_tokens,
                         passage_tokens=c.passage_tokens, ranker_passage_tokens=c.ranker_passage_tokens,
                         question_chunk=c.question_chunk * (c.n if greedy else 1))


def update_settings(config: TrainConfig, iteration: int, device: str = "cpu"):
    """The UpdateConfig of iteration `iteration`'s updates (both roles) on `device`. The rollout engine is the
    loop's own (backend, dtype, device), so `recompute_logprobs = auto` recomputes exactly when its numerics
    are not the trainer's."""
    from cosearch_cli.update import UpdateConfig
    from cosearch_cli.update.old_logprobs import resolve

    c = config
    engine = {"backend": c.backend, "device": "cuda" if c.backend == "vllm" else device, "dtype": c.dtype}
    return UpdateConfig(lr=lr_at(c, iteration), kl_coef=c.kl_coef, token_budget=c.token_budget,
                        max_grad_norm=c.max_grad_norm, norm_over=c.norm_over, seed=c.seed * 1000 + iteration,
                        dtype=c.dtype, grad_checkpointing=c.grad_checkpointing,
                        parallel="fsdp" if c.offload else "ddp", offload=c.offload,
                        recompute_old=resolve(c.recompute_logprobs, engine, device=device, dtype=c.dtype)
                        or c.tis_cap > 0,
                        tis_cap=c.tis_cap)


def release(backend) -> None:
    """Free a generation engine that is no longer used (a vLLM engine holds its GPU share until shut down)."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()
        import gc

        gc.collect()


@dataclass
class RunPaths:
    root: Path

    def iteration(self, i: int) -> Path:
        return self.root / f"iter-{i:04d}"

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.parquet"

    @property
    def warmup(self) -> Path:
        return self.root / "warmup"

    @property
    def heldout_ranker(self) -> Path:
        """The demo's held-out Hit@1 of each ranker the run had (demo.write_heldout_ranker)."""
        return self.root / "ranker-heldout.json"


@dataclass
class Models:
    """Where each model currently lives (a checkpoint folder or the initial model name)."""

    agent: str
    ranker: str | None


def given_models(config: TrainConfig) -> Models:
    """The models the run was given, before any warm-up or update."""
    return Models(config.agent, config.ranker_model if config.ranker == "llm" else None)


def current_models(paths: RunPaths, config: TrainConfig, upto: int) -> Models:
    """The newest checkpoints written by iterations before `upto` (or the warm-up's, or the given models)."""
    models = given_models(config)
    if (paths.warmup / "config.json").is_file():
        models = Models(str(paths.warmup), str(paths.warmup) if models.ranker == config.agent else models.ranker)
    if agent := checkpoints(paths, "agent", upto):
        models.agent = str(agent[-1])
    if ranker := checkpoints(paths, "ranker", upto):
        models.ranker = str(ranker[-1])
    return models


def checkpoints(paths: RunPaths, role: str, upto: int) -> list[Path]:
    """The role's checkpoint folders written by iterations before `upto`, oldest first."""
    return [paths.iteration(i) / role for i in range(upto) if (paths.iteration(i) / role / "config.json").is_file()]


def prune_checkpoints(paths: RunPaths, keep: int, *, upto: int, log: Log = lambda message: None) -> None:
    """Delete all but the newest `keep` checkpoints per role among iterations before `upto` (all finished;
    0 keeps them all), and the optimizer state (twice the weights) of all but the newest: only the newest is
    what current_models resumes from, so a run killed later still continues exactly."""
    for role in ("agent", "ranker"):
        folders = checkpoints(paths, role, upto)
        for folder in folders[:-keep] if keep else []:
            log(f"deleting the older {role} checkpoint {folder} (keep_checkpoints = {keep})")
            shutil.rmtree(folder)
        for folder in folders[:-1]:
            (folder / "optimizer.pt").unlink(missing_ok=True)


@dataclass
class StepTimer:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, started: float) -> None:
        self.seconds[name] = round(time.perf_counter() - started, 3)


# ---------------------------------------------------------------------------------------------------------
# The steps. Each returns quickly when its artifact already exists.


class Runner:
    """Runs (or resumes) one training run. `log` receives one-line progress messages."""

    def __init__(self, config: TrainConfig, *, log: Log = lambda message: None,
                 on_rollout: Callable[[int, int], None] | None = None):
        self.config = config
        self.paths = RunPaths(Path(config.out) / config.name)
        self.log = log
        self.on_rollout = on_rollout  # (done, total[, unit]) per finished question or warm-up step, for progress
        self.rollout_live = None  # LiveRollout of the running rollout (trajectories, tokens), for progress bars
        self._index = None
        self._ref = None
        self._loaded: dict[str, object] = {}  # model path -> backend; checkpoint folders never change
        self._constraints: dict[bool, tuple] = {}  # has a ranker model -> (agent factory, ranker factory)
        self._heldout: dict[str, list] = {}  # role -> held-out sequences for the update's KL (eval-init)

    # -- setup ------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Create the run folder, or check that an existing one was made with the same configuration.

        The one setting that may grow is `iterations`: neither the lr schedule, nor the question order, nor the
        seeds depend on it, so a run continued to more iterations is the longer run from the start (plus the
        held-out evaluation its old last iteration made). `name` and `out` only say where the folder is, so a
        run folder copied under another name continues as the same run (a branch that leaves the original
        untouched)."""
        self.paths.root.mkdir(parents=True, exist_ok=True)
        text = to_toml(self.config)
        if not self.paths.config.is_file():
            write_bytes_atomic(self.paths.config, text.encode())
            return
        stored = self.paths.config.read_text()
        if stored == text:
            return
        old = tomllib.loads(stored)
        before = old.get("iterations")
        where = dict(name=old.get("name"), out=old.get("out"))
        if (not isinstance(before, int) or not all(isinstance(v, str) for v in where.values())
                or to_toml(replace(self.config, iterations=before, **where)) != stored):
            raise ConfigError(f"{self.paths.root} holds a run with another configuration",
                              fix="resume with the same options (only --iterations may grow), or choose another --name")
        if self.config.iterations < before:
            raise ConfigError(f"{self.paths.root} holds a run of {before} iterations; --iterations "
                              f"{self.config.iterations} would shorten it",
                              fix=f"give --iterations {before} or more, or choose another --name")
        copied = "" if where["name"] == self.config.name else f" (a copy of the run named {where['name']})"
        longer = f" from {before} to {self.config.iterations} iterations" if before < self.config.iterations else ""
        self.log(f"continuing {self.paths.root}{copied}{longer}")
        write_bytes_atomic(self.paths.config, text.encode())

    @property
    def index(self):
        if self._index is None:
            from cosearch_cli.index import Corpus, build_index, open_index
            from cosearch_cli.index.remote import is_remote

            if is_remote(self.config.index):  # a `cosearch serve` server: nothing to build here
                self._index = open_index(self.config.index)
                return self._index
            folder = Path(self.config.index)
            if not folder.exists():
                self.log(f"building the index {folder} from {self.config.corpus}")
                build_index(Corpus(self.config.corpus), folder)
            self._index = open_index(folder)
        return self._index

    def options(self) -> dict:
        return asdict(self.config)

    # -- rollouts ---------------------------------------------------------------------------------------

    def rollouts(self, out: Path, questions: Sequence[Question], models: Models, *, greedy: bool,
                 seed: int) -> list[RolloutRecord]:
        """Roll out (or read back) `questions` with `models`; the artifact is written when all are done."""
        if out.is_file():
            return read_records(out)
        records = list(self.stream(questions, models, greedy=greedy, seed=seed))
        write_records(out, records, self.manifest("rollout", models=models, greedy=greedy, rollout_seed=seed))
        return records

    def stream(self, questions: Sequence[Question], models: Models, *, greedy: bool, seed: int,
               ranker: str | None = None) -> Iterator[RolloutRecord]:
        from cosearch_cli.rollout import LiveRollout, RolloutStats, run_rollouts

        agent, ranker_backend = self._backends(models)
        rollout_config = self._rollout_config(agent, ranker_backend, greedy=greedy, seed=seed, ranker=ranker)
        stats = RolloutStats()
        self.rollout_live = LiveRollout(stats, (agent, ranker_backend), len(questions) * rollout_config.n)
        if self.on_rollout:
            self.on_rollout(0, len(questions))
        for done, record in enumerate(run_rollouts(questions, agent=agent, ranker_backend=ranker_backend,
                                                   index=self.index, config=rollout_config, stats=stats),
                                      start=1):
            if self.on_rollout:
                self.on_rollout(done, len(questions))
            yield record
        self.rollout_live = None

    def rollouts_with(self, ranker: str, questions: Sequence[Question], models: Models) -> Iterator[RolloutRecord]:
        """Greedy evaluation rollouts with another ranker (`none`, `llm`, `oracle`), for the oracle study."""
        return self.stream(questions, models, greedy=True, seed=self.config.seed, ranker=ranker)

    def manifest(self, stage: str, *, models: Models, **extra) -> dict:
        return make_manifest(stage, {"train": self.options(), "models": asdict(models), **extra},
                             seed=self.config.seed)

    def backend(self, path: str, role: str = "ranker"):
        """The generation backend of a model folder (or 'smollm2') for `role`, loaded once while in use."""
        if path not in self._loaded:
            from cosearch_cli.generation import load_backend

            self._loaded[path] = load_backend(path, self.config.backend, **self._engine_options(role))
        return self._loaded[path]

    def constraint_roles(self) -> set[str]:
        """The roles whose decoding is constrained in this run (`constrain`)."""
        from cosearch_cli.constrain import parse_roles

        return set(parse_roles(self.config.constrain, self.config.agent))

    def _backends(self, models: Models):
        wanted = [m for m in (models.agent, models.ranker) if m is not None]
        for path in [p for p in self._loaded if p not in wanted]:
            release(self._loaded.pop(path))
        return self.backend(models.agent, "agent"), self.backend(models.ranker, "ranker") if models.ranker else None

    def _engine_options(self, role: str) -> dict:
        """Device and dtype of a generation engine; a vLLM engine also gets its share of the GPU. A new
        checkpoint is a new path, so after an update the engine is loaded again from the saved folder (the
        old one is dropped first, which frees a vLLM engine's memory once it is garbage-collected)."""
        c = self.config
        options = {"device": self.engine_device, "dtype": c.dtype}
        if c.backend == "vllm":
            fraction = c.agent_gpu_fraction if role == "agent" else c.ranker_gpu_fraction
            options = {"dtype": c.dtype, "gpu_memory_utilization": fraction}
        return options

    @property
    def device(self) -> str:
        from cosearch_cli.models import resolve_device

        return resolve_device(self.config.device)

    @property
    def engine_device(self) -> str:
        """Where the hf engines run (vLLM places itself on the first visible GPU)."""
        return "cuda:0" if self.config.placement == "split" else self.device

    @property
    def trainer_device(self) -> str:
        """Where the reference and the trainer run."""
        return "cuda:1" if self.config.placement == "split" else self.device

    def _rollout_config(self, agent, ranker_backend, *, greedy: bool, seed: int, ranker: str | None = None):
        from cosearch_cli.rollout import constraint_factories

        c = self.config
        key = ranker_backend is not None  # token tables depend only on the (shared) tokenizer
        if key not in self._constraints:
            self._constraints[key] = constraint_factories(c.constrain, c.agent, agent, ranker_backend, c.ranker_model)
        agent_factory, ranker_factory = self._constraints[key]
        return replace(rollout_settings(c, greedy=greedy, seed=seed, ranker=ranker), agent_constraint=agent_factory,
                       ranker_constraint=ranker_factory)

    def draw(self, out: Path, train_questions: Sequence[Question], models: Models, i: int) -> list[RolloutRecord]:
        """Dynamic sampling: roll out chunks of the next training questions until `questions_per_iteration`
        of them have a reward spread in their agent group, or `max_draw` questions were drawn."""
        if out.is_file():
            return read_records(out)
        c = self.config
        per, cap = c.questions_per_iteration, c.max_draw or 4 * c.questions_per_iteration
        start = sum(orjson.loads((self.paths.iteration(j) / "metrics.json").read_bytes())["questions_drawn"]
                    for j in range(i))
        stream = question_stream(train_questions, c.seed, start)
        group_config = grouping.resolve_config(c.group_preset, kmin=c.kmin, tau=c.tau)
        reward_config = rewards.resolve_config(c.reward_preset)
        records: list[RolloutRecord] = []
        greedy: list[RolloutRecord] = []
        with_spread = 0
        while with_spread < per and len(records) < cap:
            chunk = list(itertools.islice(stream, min(per, cap - len(records))))
            baselines = None
            if c.agent_baseline == "greedy":
                self.log(f"iteration {i}: greedy baseline rollouts of {len(chunk)} questions")
                chunk_greedy = list(self.stream(chunk, models, greedy=True, seed=c.seed * 1000 + i))
                greedy += chunk_greedy
                baselines = rewards.greedy_rewards(chunk_greedy, reward_config)
            self.log(f"iteration {i}: rollouts of {len(chunk)} questions x {c.n} "
                     f"({with_spread}/{per} with a reward spread after {len(records)} drawn)")
            for record in self.stream(chunk, models, greedy=False, seed=c.seed * 1000 + i + 7919 * len(records)):
                records.append(record)
                grouped = grouping.group_record(copy.deepcopy(record), group_config)
                advantages.set_baselines([grouped], baselines)
                with_spread += has_spread(rewards.score_record(grouped, reward_config))
        if c.agent_baseline == "greedy":
            write_records(self.baseline_path(i), greedy, self.manifest("rollout", models=models, greedy=True,
                                                                        rollout_seed=c.seed * 1000 + i))
        write_records(out, records, self.manifest("rollout", models=models, greedy=False, dynamic_sampling=True,
                                                  questions_drawn=len(records), with_spread=with_spread))
        return records

    def baseline_path(self, i: int) -> Path:
        """Iteration i's greedy rollouts of its training questions (agent_baseline = "greedy")."""
        return self.paths.iteration(i) / "baseline.jsonl"

    def baselines(self, i: int) -> dict[str, float] | None:
        """Question id -> greedy reward of iteration i's training questions; None for GRPO's group baseline."""
        if self.config.agent_baseline != "greedy":
            return None
        return rewards.greedy_rewards(read_records(self.baseline_path(i)),
                                      rewards.resolve_config(self.config.reward_preset))

    # -- group, reward ----------------------------------------------------------------------------------

    def group(self, rollouts_path: Path, out: Path) -> list[RolloutRecord]:
        if out.is_file():
            return read_records(out, "grouped")
        c = self.config
        config = grouping.resolve_config(c.group_preset, kmin=c.kmin, tau=c.tau)
        reader = Reader.open(rollouts_path)
        records = [grouping.group_record(read_rollout(r.data, r.path, r.line), config) for r in reader.rows()]
        write_records(out, records, make_manifest("group", asdict(config), inputs=reader.hashes,
                                                  upstream=reader.upstream))
        return records

    def reward(self, grouped_path: Path, out: Path, baselines: dict[str, float] | None = None) -> list[RolloutRecord]:
        if out.is_file():
            return read_records(out, "scored")
        config = rewards.resolve_config(self.config.reward_preset)
        reader = Reader.open(grouped_path)
        records = [rewards.score_record(read_rollout(r.data, r.path, r.line, min_stage="grouped"), config)
                   for r in reader.rows()]
        advantages.set_baselines(records, baselines, str(grouped_path.with_name("baseline.jsonl")))
        advantages.assign_advantages(records)
        write_records(out, records, make_manifest("reward", asdict(config), inputs=reader.hashes,
                                                  upstream=reader.upstream))
        return records

    # -- updates ----------------------------------------------------------------------------------------

    def update(self, role: str, scored: list[RolloutRecord], model_path: str, out: Path,
               iteration: int) -> dict:
        """One GRPO step; writes the checkpoint, or `<role>.skipped.json` when nothing was trainable."""
        skipped = out.with_name(f"{role}.skipped.json")
        if (out / "config.json").is_file():
            return orjson.loads((out / "metrics.json").read_bytes())
        if skipped.is_file():
            return orjson.loads(skipped.read_bytes())
        from cosearch_cli.models import load_causal_lm
        from cosearch_cli.update import load_optimizer_state, run_update, save_checkpoint

        c = self.config
        update_config = update_settings(c, iteration, self.trainer_device)
        if c.offload:
            from cosearch_cli.update import distributed

            if self.trainer_device.startswith("cuda:"):  # FSDP computes on the current GPU
                import torch

                torch.cuda.set_device(self.trainer_device)
            distributed.init_local_group()  # FSDP (CPU offload) on a process group of this one process
        # the trainer's weights stay fp32 (master weights); bf16 is the compute dtype (update/precision.py)
        # with CPU offload FSDP moves each layer's shards to the CPU itself: loading on the GPU first would need
        # the whole fp32 model there at once
        model, tokenizer = load_causal_lm(model_path, device="cpu" if c.offload else self.trainer_device)
        optimizer_state = None
        if (Path(model_path) / "optimizer.pt").is_file():
            optimizer_state = load_optimizer_state(model_path)
        ref = self._reference(role) if c.kl_coef > 0 else None
        if role == "agent" and c.dynamic_sampling:  # DAPO: the agent's batch is the groups with a spread
            scored = [r for r in scored if has_spread(r)]
        try:
            result = run_update(scored, role=role, model=model, ref_model=ref, config=update_config,
                                optimizer_state=optimizer_state, pad_id=tokenizer.pad_token_id or 0,
                                heldout=self.heldout(role))
        except NothingToDo as exc:
            metrics = {"role": role, "skipped": True, "skip_reason": exc.message}
            write_json_atomic(skipped, metrics)
            return metrics
        if result.skipped:  # non-finite step: keep the previous weights, record why
            write_json_atomic(skipped, result.metrics)
            return result.metrics
        save_checkpoint(out, model=model, tokenizer=tokenizer, config=update_config, optimizer=result.optimizer,
                        metrics=result.metrics, info={"role": role, "iteration": iteration},
                        manifest=make_manifest("update", {"role": role, **update_config.to_dict()},
                                               seed=update_config.seed))
        return result.metrics

    def heldout(self, role: str) -> list | None:
        """Up to `heldout_kl` of the untrained models' dev sequences of `role`, for the held-out KL (read once)."""
        path = self.paths.root / "eval-init" / "rollouts.jsonl"
        if not self.config.heldout_kl or not path.is_file():
            return None
        if role not in self._heldout:
            from cosearch_cli.update.batch import diagnostic_sequences

            self._heldout[role] = diagnostic_sequences(read_records(path), role, self.config.heldout_kl)
        return self._heldout[role] or None

    def _reference(self, role: str):
        from cosearch_cli.models import load_causal_lm

        start = current_models(self.paths, self.config, 0)
        name = start.agent if role == "agent" else start.ranker
        if self._ref is None or self._ref[0] != name:
            self._ref = (name, load_causal_lm(name, device=self.trainer_device, dtype=self.config.dtype)[0])
        return self._ref[1]

    # -- warm-up ----------------------------------------------------------------------------------------

    def warmup(self, train_questions: Sequence[Question]) -> None:
        """Supervised warm-up of the given agent (and of the ranker when it is the same model) on the first
        `warmup_questions` of a shuffle of the training questions; written atomically to `warmup/`."""
        out = self.paths.warmup
        if (out / "config.json").is_file():
            return
        import torch

        from cosearch_cli.models import load_causal_lm
        from cosearch_cli.warmup import DemoStats, FinetuneConfig, build_demonstrations, finetune

        c = self.config
        questions = list(itertools.islice(question_stream(train_questions, c.seed + 1, 0), c.warmup_questions))
        torch.manual_seed(c.seed)
        lm, tokenizer = load_causal_lm(c.agent)
        stats = DemoStats()
        # the rollouts' own format and passage lengths, so the demonstrations show what RL will show
        rollout_config = rollout_settings(c, greedy=True, seed=c.seed)
        demos = build_demonstrations(questions, index=self.index, tokenizer=tokenizer, config=rollout_config,
                                     with_ranker=c.ranker == "llm" and c.ranker_model == c.agent,
                                     ranker_demos=c.warmup_ranker_demos,
                                     visible_evidence=c.warmup_visible_evidence, stats=stats)
        if not demos:
            raise NothingToDo("the warm-up found no demonstration: no question's searches showed a gold answer",
                              fix="check that the index holds the training questions' corpus, or warmup_questions = 0")
        self.log(f"warm-up: {stats.agent} agent and {stats.ranker} ranker demonstrations from "
                 f"{stats.questions} training questions, {c.warmup_epochs} epoch(s)")
        ft = FinetuneConfig(epochs=c.warmup_epochs, lr=c.warmup_lr, token_budget=c.warmup_token_budget, seed=c.seed)
        def on_step(done: int, total: int, loss: float) -> None:
            if self.on_rollout:
                self.on_rollout(done, total, unit="steps")

        losses = finetune(lm, demos, ft, pad_id=tokenizer.pad_token_id or 0, on_step=on_step)
        tmp = out.with_name(f".warmup.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            lm.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            manifest = self.manifest("warmup", models=given_models(c), finetune=asdict(ft),
                                     demonstrations=asdict(stats), questions=[q.id for q in questions],
                                     shown={"passage_tokens": rollout_config.passage_tokens,
                                            "ranker_passage_tokens": rollout_config.ranker_passage_tokens,
                                            "visible_evidence": c.warmup_visible_evidence},
                                     losses={"first": losses[0], "last": losses[-1], "steps": len(losses)})
            write_json_atomic(tmp / "warmup.manifest.json", manifest)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.log(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    # -- evaluation -------------------------------------------------------------------------------------

    def evaluate(self, folder: Path, models: Models, dev: Sequence[Question]) -> dict:
        summary_path = folder / "summary.json"
        if summary_path.is_file():
            return orjson.loads(summary_path.read_bytes())
        from cosearch_cli.evaluate import evaluate

        folder.mkdir(parents=True, exist_ok=True)
        records = self.rollouts(folder / "rollouts.jsonl", dev, models, greedy=True, seed=self.config.seed)
        evaluation = evaluate(records)
        summary = {**evaluation.summary(), "f1_ci": _f1_ci(evaluation)}
        write_json_atomic(summary_path, summary)
        return summary

    # -- the loop ---------------------------------------------------------------------------------------

    def run(self) -> Path:
        from cosearch_cli.dry_run import check_backend, check_memory

        c = self.config
        check_backend(c)
        check_memory(c)  # on a GPU: refuse before any work when the memory plan does not fit
        train_questions = read_questions(c.questions)
        dev = read_questions(c.dev_questions)
        overlap = {q.id for q in train_questions} & {q.id for q in dev}
        if overlap:
            raise ConfigError(f"{len(overlap)} dev question(s) are also training questions, e.g. "
                              f"{sorted(overlap)[0]!r}", fix="evaluate on questions never trained on")
        self.index  # opened (or built) now: the run folder is made only once its inputs were checked
        self.prepare()
        dev = eval_questions(dev, c.eval_limit)
        if c.warmup_questions:
            if c.eval_init:
                self.log("evaluating the given models before the warm-up")
                base = self.evaluate(self.paths.root / "eval-base", given_models(c), dev)
                write_json_atomic(self.paths.root / "eval-base" / "metrics.json", _eval_row(-2, base))
            self.warmup(train_questions)
        if c.eval_init:
            self.log("evaluating the models RL starts from" + (" (after the warm-up)" if c.warmup_questions else ""))
            init = self.evaluate(self.paths.root / "eval-init", current_models(self.paths, c, 0), dev)
            write_json_atomic(self.paths.root / "eval-init" / "metrics.json", _eval_row(-1, init))
        rl_questions = self.rl_questions(train_questions)
        for i in range(c.iterations):
            self.iteration(i, rl_questions, dev)
            prune_checkpoints(self.paths, c.keep_checkpoints, upto=i + 1, log=self.log)
        self.write_metrics_log()
        return self.paths.root

    def rl_questions(self, train_questions: Sequence[Question]) -> Sequence[Question]:
        """The training questions RL draws from (`rl_questions`), in their file's order."""
        c = self.config
        if c.rl_questions == "all":
            return train_questions
        from cosearch_cli.answerable import answerable_questions
        from cosearch_cli.models import load_tokenizer

        kept = answerable_questions(train_questions, index=self.index, retriever=None,
                                    tokenizer=load_tokenizer(c.agent), k=c.k, top_n=c.top_n,
                                    passage_tokens=c.passage_tokens)
        self.log(f"RL draws from the {len(kept)} of {len(train_questions)} training questions whose gold answer "
                 f"shows within the first {c.passage_tokens} tokens of the retriever's top {c.k} "
                 f"(rl_questions = \"answerable\")")
        if not kept:
            raise ConfigError("no training question is answerable from the retriever's passages",
                              path=c.questions, fix='use rl_questions = "all", or more training questions')
        return kept

    def iteration(self, i: int, train_questions: Sequence[Question], dev: Sequence[Question]) -> dict:
        c = self.config
        folder = self.paths.iteration(i)
        metrics_path = folder / "metrics.json"
        if metrics_path.is_file():
            return orjson.loads(metrics_path.read_bytes())
        folder.mkdir(parents=True, exist_ok=True)
        timer = StepTimer()
        models = current_models(self.paths, c, i)

        started = time.perf_counter()
        if c.dynamic_sampling:
            rolled = self.draw(folder / "rollouts.jsonl", train_questions, models, i)
        else:
            questions = iteration_questions(train_questions, c, i)
            if c.agent_baseline == "greedy":
                self.log(f"iteration {i}: greedy baseline rollouts of {len(questions)} questions")
                self.rollouts(self.baseline_path(i), questions, models, greedy=True, seed=c.seed * 1000 + i)
            self.log(f"iteration {i}: rollouts of {len(questions)} questions x {c.n}")
            rolled = self.rollouts(folder / "rollouts.jsonl", questions, models, greedy=False,
                                   seed=c.seed * 1000 + i)
        timer.add("rollout", started)
        started = time.perf_counter()
        self.group(folder / "rollouts.jsonl", folder / "grouped.jsonl")
        baselines = self.baselines(i)
        scored = self.reward(folder / "grouped.jsonl", folder / "scored.jsonl", baselines)
        timer.add("group_reward", started)

        row = {"iteration": i, "questions_drawn": len(rolled), **_train_row(rolled, scored),
               **_baseline_row(scored, baselines)}
        for role, enabled, path in (("agent", c.train_agent, models.agent),
                                    ("ranker", c.train_ranker, models.ranker)):
            if not enabled:
                continue
            started = time.perf_counter()
            self.log(f"iteration {i}: {role} update")
            metrics = self.update(role, scored, path, folder / role, i)
            timer.add(f"update_{role}", started)
            row.update({f"{role}_{k}": v for k, v in metrics.items() if k in UPDATE_METRICS})

        last = i == c.iterations - 1
        if last or (c.eval_every and (i + 1) % c.eval_every == 0):
            started = time.perf_counter()
            self.log(f"iteration {i}: evaluating on {len(dev)} dev questions")
            summary = self.evaluate(folder / "eval", current_models(self.paths, c, i + 1), dev)
            timer.add("eval", started)
            row.update({k: v for k, v in _eval_row(i, summary).items() if k != "iteration"})
        row["seconds"] = timer.seconds
        write_json_atomic(metrics_path, row)
        self.write_metrics_log()
        return row

    def write_metrics_log(self) -> None:
        """Rebuild metrics.parquet (and curves.png) from the per-iteration rows, so resume never duplicates."""
        import polars as pl

        rows = []
        base = self.paths.root / "eval-base" / "metrics.json"
        if base.is_file():  # the given models, before the warm-up (written as -1 before 2026-12-07)
            rows.append({**orjson.loads(base.read_bytes()), "iteration": -2})
        init = self.paths.root / "eval-init" / "metrics.json"
        if init.is_file():
            rows.append(orjson.loads(init.read_bytes()))
        for folder in sorted(self.paths.root.glob("iter-*")):
            if (folder / "metrics.json").is_file():
                rows.append(orjson.loads((folder / "metrics.json").read_bytes()))
        if not rows:
            return
        if self.paths.heldout_ranker.is_file():  # the rankers' Hit@1 on the same held-out calls, at their rows
            extra = {r["iteration"]: r for r in orjson.loads(self.paths.heldout_ranker.read_bytes())["rows"]}
            rows = [{**r, **extra.get(r["iteration"], {})} for r in rows]
        flat = [{k: (orjson.dumps(v).decode() if isinstance(v, dict) else v) for k, v in r.items()} for r in rows]
        frame = pl.DataFrame(flat, infer_schema_length=None)
        with Writer(self.paths.metrics) as writer:
            writer.write_all(frame.to_dicts())
            writer.manifest = make_manifest("train", self.options(), seed=self.config.seed)
        from cosearch_cli.curves import training_curves

        training_curves(rows, self.paths.root / "curves.png", title=self.config.name)
        _tensorboard(rows, self.paths.root / "tensorboard")


# Per-update figures copied into metrics.parquet as "<role>_<name>".
UPDATE_METRICS = ("loss", "kl", "clip_frac", "entropy", "grad_norm", "grad_norm_clipped", "sequences", "skipped",
                  "lr", "kl_batch", "kl_heldout", "norm_tokens", "adv_token_share", "tokens",
                  "logprob_gap_abs", "logprob_gap_kl", "tis_weight_mean")


def _train_row(rolled: Sequence[RolloutRecord], scored: Sequence[RolloutRecord]) -> dict:
    trajectories = [t for r in scored for t in r.trajectories]
    calls = [c for r in rolled for c in r.ranker_calls]
    ranked = [c for c in calls if not c.no_candidates]
    k = max((len(c.chosen_ids) for c in calls), default=0)
    # per question (the CIs resample whole questions), then pooled for the means
    rewards = [[t.reward for t in r.trajectories if t.reward is not None] for r in scored]
    hits = [[float(any(c.candidate_has_answer[j] for j in c.permutation[:k])) for c in r.ranker_calls
             if c.valid and not c.no_candidates] for r in rolled]
    kept = [g for r in scored for g in r.groups if g.kept]
    return {
        "train_reward": _mean([x for q in rewards for x in q]),
        **_ci_columns("train_reward", rewards),
        "train_f1": _mean([t.scores.get("f1", 0.0) for t in trajectories]),
        "format_ok": _mean([float(t.format_ok) for t in trajectories]),
        "search_turns": _mean([float(t.n_searches) for t in trajectories]),
        "ranker_calls": len(calls),
        "ranker_no_candidates": len(calls) - len(ranked),
        "ranker_valid": _mean([float(c.valid) for c in ranked]),
        "ranker_hit_at_k": _mean([x for q in hits for x in q]),
        **_ci_columns("ranker_hit_at_k", hits),
        "agent_groups_kept": sum(g.role == "agent" for g in kept),
        "ranker_groups_kept": sum(g.role == "ranker" for g in kept),
    }


def _baseline_row(scored: Sequence[RolloutRecord], baselines: dict[str, float] | None) -> dict:
    """With a greedy baseline: its mean reward over the iteration's questions, and the share of samples that
    score above / below their question's greedy trajectory."""
    if baselines is None:
        return {}
    pairs = [(t.reward, baselines[r.question_id]) for r in scored for t in r.trajectories if t.reward is not None]
    return {"train_greedy_reward": _mean([baselines[r.question_id] for r in scored]),
            "samples_above_greedy": _mean([float(x > b + advantages.EQUAL_TOLERANCE) for x, b in pairs]),
            "samples_below_greedy": _mean([float(x < b - advantages.EQUAL_TOLERANCE) for x, b in pairs])}


def _eval_row(iteration: int, summary: dict) -> dict:
    overall = next(g for g in summary["groups"] if g["dataset"] == "average")
    low, high = summary.get("f1_ci") or (None, None)  # (an evaluation made before the CI was kept has none)
    return {"iteration": iteration, "dev_f1": overall["f1"], "dev_em": overall["em"],
            "dev_search_turns": overall["searches"], "dev_format_fail": overall["format_fail"],
            "dev_hit_at_k": overall.get("hit@3"), "dev_f1_ci_low": low, "dev_f1_ci_high": high}


def _f1_ci(evaluation) -> list[float] | None:
    """95% bootstrap CI of the dev F1 the tables print (the unweighted mean over datasets), resampling questions
    within each dataset: how far the curve's point could move on other questions of the same kind."""
    from cosearch_cli.evaluate import paired_bootstrap

    by_dataset: dict[str, list[float]] = {}
    for q in evaluation.questions:
        by_dataset.setdefault(q.dataset, []).append(q.f1)
    average = paired_bootstrap(by_dataset).get("average")  # None without questions
    return [average["ci_low"], average["ci_high"]] if average else None


def _ci_columns(name: str, per_question: Sequence[Sequence[float]]) -> dict:
    """`<name>_ci_low/high`: the 95% bootstrap CI of the pooled mean over these values, resampling whole
    questions (a question's trajectories or ranker calls are not independent of each other)."""
    from cosearch_cli.evaluate import mean_ci

    clusters = [values for values in per_question if values]
    low, high = mean_ci([sum(v) / len(v) for v in clusters], [len(v) for v in clusters]) or (None, None)
    return {f"{name}_ci_low": low, f"{name}_ci_high": high}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _tensorboard(rows: list[dict], folder: Path) -> None:
    """Also log to TensorBoard when it is installed (optional)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return
    writer = SummaryWriter(str(folder))
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
                writer.add_scalar(key, value, row["iteration"])
    writer.close()
