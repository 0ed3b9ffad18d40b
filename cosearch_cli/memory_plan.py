"""A memory plan for a training run, computed from model shapes and budgets before any model is loaded.

Per role (agent engine, ranker engine, reference, trainer) it estimates GPU bytes as weights + optimiser state +
activations (or, for an inference engine, weights + key/value cache), adds them up for the GPU they share, and
says whether that fits the memory the run was given. Every figure is an estimate from the formulas below, not
a measurement; they are written to err on the large side (every token of a micro-batch counted as trained).

Bytes per parameter of the trainer. Mixed precision here means fp32 master weights, fp32 gradients and fp32
AdamW moments, with the forward and backward pass computed in bf16 (autocast, or FSDP's bf16 parameter
gathering). It keeps the optimiser's small updates exact (a 1e-6 step is below bf16's resolution near 1.0),
so bf16 saves activation memory and time, not weight memory: 4 + 4 + 8 = 16 bytes per parameter either way.

Besides those 16 bytes, the trainer holds working copies of the weights in the compute dtype. A plain model
under bf16 autocast keeps the bf16 cast of every weight a matrix product uses (all but an untied input
embedding) until the backward pass is done; under FSDP (over several GPUs, or one with CPU offload) the gathered
weights of the layer being computed and the next (prefetched) plus the unsharded embeddings and final norm.

Activations per token per decoder layer, kept for the backward pass (Hugging Face Llama/Qwen2 with sdpa): the
residual stream stays fp32 between layers (the master weights are fp32 and RMSNorm computes in fp32), so each
of the two norms keeps its fp32 input and normalised input (16 x hidden bytes). Under autocast every linear
layer keeps its own bf16 copy of its input (q, k and v three, gate and up two, o and down one each); in fp32
those that read the same tensor share it. Attention keeps q, k and v, k and v repeated to every head (grouped
query attention) and its output; the MLP its gate output, the SiLU of it and its up output. With gradient
checkpointing each layer's fp32 input stays, plus one layer's activations while it is recomputed. An fp32
update also keeps each layer's attention probabilities (rows x heads x length^2 x 4 bytes): sdpa's flash kernel
takes no fp32, and the 4.0 GiB that a 3B fp32 update measured above the plan without this term is what its
math kernel keeps (inferred from that number, not traced). The loss adds the logits: vocab x (compute bytes + 8)
per trained token (the logits, their fp32 copy and the fp32 log-softmax).

Checked on an H200 (bench/results/gpu_check.md): two update steps of randomly initialised Qwen2.5-3B and -7B
shapes, bf16 and fp32, 8 sequences of 1,024 tokens in micro-batches of 2,048 or 4,096, against this plan.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cosearch_cli.errors import ConfigError, ModelError

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
TRAINER_BYTES_PER_PARAM = 16  # fp32 weights 4 + fp32 gradients 4 + AdamW moments 8 (see the module docstring)
RESIDUAL_BYTES = 4  # the residual stream between decoder layers stays fp32 under bf16 autocast
VLLM_OVERHEAD_GIB = 2.0  # CUDA context, activations of the largest batch and graphs vLLM keeps inside its share
DEFAULT_GPU_GIB = 80.0  # planning figure when no GPU is visible (A100/H100 80 GB)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama/Qwen2-style decoder that memory depends on."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    tied: bool
    qkv_bias: bool

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    @property
    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        attention = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_params + embeddings + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_dim * dtype_bytes


# Shapes from the models' config.json files, so the paper presets plan without the weights on disk.
KNOWN: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-7B-Instruct": ModelShape("Qwen/Qwen2.5-7B-Instruct", layers=28, hidden=3584, intermediate=18944,
                                           vocab=152064, heads=28, kv_heads=4, tied=False, qkv_bias=True),
    "Qwen/Qwen2.5-3B-Instruct": ModelShape("Qwen/Qwen2.5-3B-Instruct", layers=36, hidden=2048, intermediate=11008,
                                           vocab=151936, heads=16, kv_heads=2, tied=True, qkv_bias=True),
    "smollm2": ModelShape("smollm2", layers=30, hidden=576, intermediate=1536, vocab=49152, heads=9, kv_heads=3,
                          tied=True, qkv_bias=False),
}


def model_shape(name: str) -> ModelShape:
    """The shape of `name`: a known model, else the config.json of its folder (or hub-cache snapshot)."""
    if name in KNOWN:
        return KNOWN[name]
    from cosearch_cli.models import _hub_cache_snapshot

    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        folder = _hub_cache_snapshot(name) or folder
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"cannot plan memory for model {name!r}: no config.json found",
                         fix=f"pass a local Hugging Face folder, or one of {', '.join(KNOWN)}")
    c = json.loads(path.read_text())
    try:
        heads = c["num_attention_heads"]
        return ModelShape(name, layers=c["num_hidden_layers"], hidden=c["hidden_size"],
                          intermediate=c["intermediate_size"], vocab=c["vocab_size"], heads=heads,
                          kv_heads=c.get("num_key_value_heads") or heads,
                          tied=bool(c.get("tie_word_embeddings", False)),
                          qkv_bias=bool(c.get("attention_bias", c.get("model_type") == "qwen2")))
    except KeyError as exc:
        raise ModelError(f"{path} lacks {exc.args[0]!r}, so its memory cannot be planned",
                         fix="plan only decoder models with a Llama/Qwen2-style config") from None


def agent_context(c) -> int:
    """Most tokens an agent trajectory can reach: instructions, T turns each with its K passages, the answer."""
    return 400 + c.max_turns * (c.max_new_tokens + c.k * (c.passage_tokens + 16)) + c.max_new_tokens


def ranker_context(c) -> int:
    """Most tokens one ranker call holds: instructions, N numbered candidates, its output."""
    return 200 + c.top_n * (c.ranker_passage_tokens + 8) + c.ranker_max_new_tokens


def trained_share(c) -> float:
    """The largest share of a sequence's tokens that is trained (has logits computed): an agent's own turns,
    (T + 1) x max_new_tokens of its longest context, or a ranker call's output."""
    agent = min(1.0, (c.max_turns + 1) * c.max_new_tokens / agent_context(c))
    return max(agent, c.ranker_max_new_tokens / ranker_context(c))


def layer_activation_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes one token leaves for the backward pass in one decoder layer (see the module docstring)."""
    h, kv, i, d = shape.hidden, shape.kv_dim, shape.intermediate, dtype_bytes
    norms = 2 * 2 * RESIDUAL_BYTES * h
    if d < RESIDUAL_BYTES:  # autocast: each linear layer keeps its own cast of its input
        inputs = d * (3 * h + 2 * h + h + i)
    else:  # q/k/v read one tensor, gate/up another
        inputs = d * (h + h + h + i)
    repeated = 2 * h if shape.kv_heads < shape.heads else 0
    attention = d * (h + 2 * kv + repeated + h)
    return norms + inputs + attention + 3 * d * i


def trainer_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int, checkpointing: bool,
                             trained: float = 1.0, longest: int | None = None) -> int:
    """Activations of one micro-batch of `tokens` tokens in rows of at most `longest` (default `tokens`), of
    which the share `trained` has logits."""
    per_token_layer = layer_activation_bytes(shape, dtype_bytes)
    if dtype_bytes >= RESIDUAL_BYTES:  # fp32 attention keeps its probabilities: rows x heads x length^2
        per_token_layer += shape.heads * min(longest or tokens, tokens) * dtype_bytes
    if checkpointing:
        layers = tokens * shape.layers * shape.hidden * RESIDUAL_BYTES + tokens * per_token_layer
    else:
        layers = tokens * shape.layers * per_token_layer
    logits = int(tokens * trained) * shape.vocab * (dtype_bytes + 8)
    return layers + logits


def working_weight_bytes(shape: ModelShape, dtype_bytes: int, *, sharded: bool) -> int:
    """Copies of the weights the trainer computes with, besides the fp32 masters (see the module docstring)."""
    if sharded:  # FSDP: two gathered layers, and the root's embeddings and final norm
        return (2 * shape.layer_params + shape.params - shape.layers * shape.layer_params) * dtype_bytes
    if dtype_bytes >= RESIDUAL_BYTES:
        return 0
    untied_input = 0 if shape.tied else shape.vocab * shape.hidden
    return (shape.params - untied_input) * dtype_bytes


@dataclass
class RolePlan:
    role: str
    model: str
    params: int
    weights: int
    optimizer: int = 0  # gradients + optimiser moments (trainer only)
    activations: int = 0  # or key/value cache for an engine
    host: int = 0  # bytes moved to CPU memory (FSDP offload)
    note: str = ""
    problem: str = ""  # why this role cannot run as configured, whatever the total
    gpu_index: int = 0  # which GPU of the process it is placed on (placement)

    @property
    def gpu(self) -> int:
        return self.weights + self.optimizer + self.activations


@dataclass
class MemoryPlan:
    gpu_bytes: int  # memory of one GPU
    gpus: int
    roles: list[RolePlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def used(self, gpu_index: int) -> int:
        return sum(r.gpu for r in self.roles if r.gpu_index == gpu_index)

    @property
    def busiest(self) -> int:
        """The GPU with the most planned bytes."""
        return max({r.gpu_index for r in self.roles} or {0}, key=self.used)

    @property
    def total(self) -> int:
        """Bytes planned on the busiest GPU (what must fit)."""
        return self.used(self.busiest)

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_bytes and not any(r.problem for r in self.roles)

    def to_dict(self) -> dict:
        per_gpu = {str(i): _gib(self.used(i)) for i in sorted({r.gpu_index for r in self.roles})}
        return {"gpu_gib": _gib(self.gpu_bytes), "gpus": self.gpus, "total_gib": _gib(self.total),
                "per_gpu_gib": per_gpu, "fits": self.fits, "notes": self.notes,
                "roles": [{**asdict(r), "gpu_gib": _gib(r.gpu), **{f"{k}_gib": _gib(getattr(r, k)) for k in
                                                                    ("weights", "optimizer", "activations", "host")}}
                          for r in self.roles]}

    def lines(self) -> list[str]:
        out = [f"memory plan: {len(self.roles)} role(s) on GPUs of {_gib(self.gpu_bytes)} GiB "
               f"({self.gpus} GPU(s) given)"]
        for r in self.roles:
            out.append(f"  cuda:{r.gpu_index} {r.role:<8} {r.model:<28} {r.params / 1e9:6.2f} B params: "
                       f"weights {_gib(r.weights)} + grads/optimizer {_gib(r.optimizer)} + activations/KV {_gib(r.activations)} = "
                       f"{_gib(r.gpu)} GiB" + (f" (+{_gib(r.host)} GiB host)" if r.host else "")
                       + (f"  [{r.note}]" if r.note else "") + (f"  PROBLEM: {r.problem}" if r.problem else ""))
        for i in sorted({r.gpu_index for r in self.roles}):
            out.append(f"  cuda:{i} total {_gib(self.used(i))} GiB of {_gib(self.gpu_bytes)} GiB")
        out.append("  the plan " + ("fits" if self.fits else "DOES NOT FIT"))
        out += [f"  note: {n}" for n in self.notes]
        return out


def _gib(n: int) -> float:
    return round(n / GIB, 2)


def engine_plan(role: str, shape: ModelShape, c, *, gpu_bytes: int, context: int, rows: int) -> RolePlan:
    """An inference engine: vLLM takes its fraction of the GPU (weights + paged KV cache inside it); the hf
    backend holds the weights plus the KV cache of its whole batch at the longest context."""
    dtype_bytes = DTYPE_BYTES[c.dtype]
    weights = shape.params * dtype_bytes
    kv_token = shape.kv_bytes_per_token(dtype_bytes)
    if c.backend == "vllm":
        fraction = c.agent_gpu_fraction if role == "agent" else c.ranker_gpu_fraction
        share = int(fraction * gpu_bytes)
        overhead = int(VLLM_OVERHEAD_GIB * GIB)
        room = max(share - weights - overhead, 0) // kv_token
        if room < context:
            needed = weights + overhead + context * kv_token
            return RolePlan(role, shape.name, shape.params, weights, 0, needed - weights,
                            problem=f"vLLM's share {fraction} x {_gib(gpu_bytes)} GiB cannot hold the weights and "
                                    f"one {context}-token sequence ({_gib(needed)} GiB): raise {role}_gpu_fraction")
        return RolePlan(role, shape.name, shape.params, weights, 0, share - weights,
                        note=f"vLLM gpu_memory_utilization {fraction}: KV cache for {room} tokens, "
                             f"{room // context} sequences of {context} tokens at once")
    kv = rows * context * kv_token
    return RolePlan(role, shape.name, shape.params, weights, 0, kv,
                    note=f"hf backend: KV cache of {rows} rows x {context} tokens")


def trainer_plan(shape: ModelShape, c, *, world: int, tokens: int, trained: float | None = None,
                 longest: int | None = None) -> RolePlan:
    """The updated model under FSDP over `world` GPUs (world 1: a plain model, or FSDP with offload); `trained`:
    the share of a micro-batch's tokens with logits (default: the largest the run's budgets allow); `longest`:
    the longest sequence (default `tokens`)."""
    dtype_bytes = DTYPE_BYTES[c.dtype]
    state = shape.params * TRAINER_BYTES_PER_PARAM
    weights, optimizer = shape.params * 4 // world, (state - shape.params * 4) // world
    share = trained_share(c) if trained is None else trained
    activations = trainer_activation_bytes(shape, tokens, dtype_bytes, c.grad_checkpointing, share, longest)
    host = 0
    note = f"micro-batch of {tokens} tokens" + (", gradient checkpointing" if c.grad_checkpointing else "")
    if c.offload:  # FSDP CPU offload: the GPU holds the gathered layers and the root's weights only
        host = weights + optimizer
        weights, optimizer = 0, 0
        note += ", FSDP CPU offload"
    working = working_weight_bytes(shape, dtype_bytes, sharded=c.offload or world > 1)
    if working:
        note += f", {_gib(working)} GiB of {c.dtype} working weights"
    return RolePlan("trainer", shape.name, shape.params, weights + working, optimizer, activations, host, note)


def plan_training(c, *, gpus: int, gpu_bytes: int, world: int = 1) -> MemoryPlan:
    """The plan of `cosearch train` (config `c`, a TrainConfig). Placement `shared`: every role on one GPU;
    `split`: the engines on the first GPU, reference and trainer on the second. The engines stay loaded during
    the update, so a GPU's peak is the sum of its roles."""
    plan = MemoryPlan(gpu_bytes=gpu_bytes, gpus=gpus)
    agent = model_shape(c.agent)
    rows = c.n * c.question_chunk
    plan.roles.append(engine_plan("agent", agent, c, gpu_bytes=gpu_bytes, context=agent_context(c), rows=rows))
    ranker = model_shape(c.ranker_model) if c.ranker == "llm" else None
    if ranker is not None:
        plan.roles.append(engine_plan("ranker", ranker, c, gpu_bytes=gpu_bytes, context=ranker_context(c),
                                      rows=rows))
    trained = [s for s, on in ((agent, c.train_agent), (ranker, c.train_ranker)) if on and s is not None]
    if trained:
        largest = max(trained, key=lambda s: s.params)
        longest = max(agent_context(c), ranker_context(c) if ranker is not None else 0)
        if c.kl_coef > 0:
            plan.roles.append(RolePlan("ref", largest.name, largest.params,
                                       largest.params * DTYPE_BYTES[c.dtype], note="frozen, no gradients"))
        plan.roles.append(trainer_plan(largest, c, world=world, tokens=max(c.token_budget, longest),
                                       longest=longest))
        if longest > c.token_budget:
            plan.notes.append(f"a sequence can reach {longest} tokens, above token_budget {c.token_budget}: such "
                              "a sequence is a micro-batch of its own, so the plan counts that many tokens")
    if c.placement == "split":
        for role in plan.roles:
            role.gpu_index = 1 if role.role in ("ref", "trainer") else 0
        if gpus < 2:
            plan.roles[-1].problem = f"placement 'split' needs 2 GPUs, {gpus} given: set placement = 'shared'"
    return plan


@dataclass
class UpdateSettings:
    """What the memory of one `cosearch update` depends on, besides the model."""

    dtype: str = "float32"
    grad_checkpointing: bool = False
    offload: bool = False
    token_budget: int = 2048
    kl_coef: float = 0.0


def batch_extent(seqs) -> tuple[int, float]:
    """(the longest sequence's tokens, the largest share of a sequence's tokens that is trained) of a batch of
    update.batch TrainSeqs: what plan_update needs of the batch."""
    return max(len(s.token_ids) for s in seqs), max(sum(s.mask) / len(s.token_ids) for s in seqs)


def plan_update(shape: ModelShape, u: UpdateSettings, *, gpu_bytes: int, world: int, longest: int,
                trained: float) -> MemoryPlan:
    """The plan of one `cosearch update` process: the trainer (its FSDP shard of `world`) and, with a KL term,
    the frozen reference. A micro-batch holds `token_budget` tokens, or the `longest` sequence when that is
    longer; `trained` is the largest share of a sequence's tokens that has logits, read from the batch."""
    plan = MemoryPlan(gpu_bytes=gpu_bytes, gpus=1)
    if u.kl_coef > 0:
        plan.roles.append(RolePlan("ref", shape.name, shape.params, shape.params * DTYPE_BYTES[u.dtype],
                                   note="frozen, no gradients"))
    plan.roles.append(trainer_plan(shape, u, world=world, tokens=max(u.token_budget, longest), trained=trained,
                                   longest=longest))
    if longest > u.token_budget:
        plan.notes.append(f"the batch's longest sequence has {longest} tokens, above --token-budget "
                          f"{u.token_budget}: it is a micro-batch of its own, so the plan counts that many tokens")
    return plan


def update_refusal(plan: MemoryPlan, u: UpdateSettings, world: int) -> ConfigError:
    """The one-line refusal of an update whose plan does not fit, with the numbers and what would make it fit."""
    trainer = next(r for r in plan.roles if r.role == "trainer")
    fixes = []
    if not u.offload:
        fixes.append("--parallel fsdp --offload (weights, gradients and AdamW state in host memory)")
    fixes.append(f"torchrun over more GPUs (FSDP shards the {_gib(trainer.params * TRAINER_BYTES_PER_PARAM)} GiB "
                 f"of trainer state; {world} now)")
    if not u.grad_checkpointing:
        fixes.append("--grad-checkpointing")
    fixes.append(f"a smaller --token-budget (activations {_gib(trainer.activations)} GiB at {u.token_budget})")
    parts = ", ".join(f"{r.role} {_gib(r.gpu)}" for r in plan.roles)
    return ConfigError(f"the update needs {_gib(plan.total)} GiB on one GPU ({parts} GiB) but the GPU has "
                       f"{_gib(plan.gpu_bytes)} GiB", fix="; ".join(fixes))


def refusal(plan: MemoryPlan, c) -> ConfigError:
    """The one-line refusal of a plan that does not fit, with the numbers and what would make it fit."""
    fixes = []
    trainer = next((r for r in plan.roles if r.role == "trainer"), None)
    if trainer is not None and not c.offload:
        state = trainer.params * TRAINER_BYTES_PER_PARAM
        fixes.append(f"offload = true (the trainer's {_gib(state)} GiB of fp32 weights, gradients and AdamW state "
                     "go to host memory)")
        others = plan.total - trainer.gpu
        free = plan.gpu_bytes - others - trainer.activations
        if free > 0:
            need = -(-state // free)
            fixes.append(f"or the Slurm recipe (examples/slurm/paper-7b/): the update under torchrun FSDP over "
                         f"{max(need, 2)} GPUs")
    if trainer is not None and not c.grad_checkpointing:
        fixes.append("grad_checkpointing = true")
    if trainer is not None:
        fixes.append(f"a smaller token_budget ({c.token_budget}; the trainer's activations are "
                     f"{_gib(trainer.activations)} GiB)")
    if c.backend == "vllm":
        fixes.append("smaller agent_gpu_fraction / ranker_gpu_fraction")
    else:
        fixes.append("backend = 'vllm' (a paged KV cache) or a smaller question_chunk")
    if c.placement == "shared" and plan.gpus > 1:
        fixes.append("placement = 'split' (engines on one GPU, reference and trainer on another)")
    parts = ", ".join(f"{r.role} {_gib(r.gpu)}" for r in plan.roles if r.gpu_index == plan.busiest)
    problems = [r.problem for r in plan.roles if r.problem]
    if problems and plan.total <= plan.gpu_bytes:
        return ConfigError(problems[0], fix="raise that engine's fraction, keeping the total within the GPU")
    return ConfigError(f"the run needs {_gib(plan.total)} GiB on cuda:{plan.busiest} ({parts}) but a GPU has "
                       f"{_gib(plan.gpu_bytes)} GiB", fix="; ".join(fixes))
