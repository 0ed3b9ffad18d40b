"""Batched multi-turn rollouts: the agent searches, the ranker picks what it sees, and everything is recorded.

One turn of the loop, over every live trajectory of every question in flight:
  1. the agent generates once for all of them (one batch);
  2. each turn is parsed: an answer (or a format failure) ends the trajectory, a search goes on;
  3. all sub-queries go to the retriever as one batch (top-N candidates each);
  4. all ranker calls of the turn form one ranker batch (or the `none` / `oracle` rule picks);
  5. the K chosen passages are appended as an `<information>` block and the next turn begins.
Questions enter in a bounded pool (`question_chunk`) that is refilled as questions finish, so memory stays
bounded on large question files and the batch stays full. A question's record is yielded as soon as all its
G trajectories are done.

Every row samples with its own seed, derived from (seed, question id, sample, turn, role), so a trajectory
does not depend on which other questions share its batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace

from cosearch_cli import agent as agent_prompts
from cosearch_cli import ranker as ranking
from cosearch_cli.agent import AgentTemplate, observation_text, parse_turn
from cosearch_cli.errors import ConfigError
from cosearch_cli.formats import AGENT_STOPS, RANKER_STOPS
from cosearch_cli.generation import load_backend  # noqa: F401  (part of this module's API)
from cosearch_cli.generation.base import Constraint, GenerationBackend, GenerationRequest, SamplingSettings
from cosearch_cli.generation.hf import derive_seed
from cosearch_cli.metrics import ANSWER_CONTAINMENT, passage_has_answer
from cosearch_cli.records import Question, RankerCall, RolloutRecord, Trajectory, Turn


@dataclass
class ConstraintContext:
    """What a constraint factory knows when it builds a Constraint for one generation."""

    role: str  # "agent" | "ranker"
    tokenizer: object
    turn: int
    last_turn: bool = False  # agent: this turn must answer
    n_candidates: int = 0  # ranker: candidates numbered 1..n
    k: int = 0  # ranker: how many ids the ranking must list


ConstraintFactory = Callable[[ConstraintContext], "Constraint | None"]


@dataclass
class RolloutConfig:
    """Rollout settings. Defaults are sized for a 2-core CPU with SmolLM2-135M; `PRESETS['paper']` has the
    paper's N=50, K=5, T=6, G=8."""

    n: int = 4
    """G: trajectories sampled per question (one GRPO group)."""
    max_turns: int = 2
    """T: search turns allowed; the turn after the T-th search must answer."""
    top_n: int = 10
    """N: candidates the retriever returns per sub-query (the ranker's input)."""
    k: int = 3
    """K: passages the ranker chooses, shown to the agent in that order."""
    ranker: str = "llm"
    """`llm` (generative listwise ranker), `none` (retriever top-K) or `oracle` (gold-bearing first)."""
    greedy: bool = False
    """Argmax decoding for agent and ranker (evaluation); all G samples are then identical."""
    temperature: float = 1.0
    """Sampling temperature for agent and ranker (the recorded log-probs are at this temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    seed: int = 0
    """Base seed; every row derives its own from it."""
    max_new_tokens: int = 80
    """Agent tokens per turn (raised to a decoding constraint's own bound, so a constrained turn can finish)."""
    ranker_max_new_tokens: int = 64
    """Ranker tokens per call (reason + ranking)."""
    passage_tokens: int = 48
    """Tokens of each passage's text in the agent's observation."""
    ranker_passage_tokens: int = 32
    """Tokens of each candidate's text in the ranker's prompt (N of them)."""
    question_chunk: int = 8
    """Questions in flight at once; bounds memory, and G x this is the agent's batch size."""
    lenient_ranker: bool = False
    """Repair invalid rankings (keep valid ids, fill from retriever order) instead of falling back to top-K."""
    retriever: str | None = None
    """Which retriever of the index to use (None: the index's default)."""
    max_context: int | None = None
    """Longest sequence the agent model takes; a trajectory that would outgrow it ends as a format failure
    ("context full") instead of crashing the batch. None: the agent backend's own limit, if it tells one."""
    template: AgentTemplate = field(default_factory=AgentTemplate)
    """The agent's instruction and final-turn notice."""
    agent_constraint: ConstraintFactory | None = None
    """Builds a decoding Constraint for each agent turn (None: free decoding)."""
    ranker_constraint: ConstraintFactory | None = None
    """Builds a decoding Constraint for each ranker call (None: free decoding)."""

    def check(self, has_ranker_backend: bool) -> None:
        problems = []
        if self.ranker not in ranking.RANKERS:
            problems.append(f"ranker must be one of {', '.join(ranking.RANKERS)}, not {self.ranker!r}")
        if min(self.n, self.k, self.top_n, self.max_new_tokens, self.question_chunk) < 1:
            problems.append("n, k, top_n, max_new_tokens and question_chunk must be at least 1")
        if self.max_turns < 0:
            problems.append("max_turns must be 0 or more")
        if self.top_n < self.k:
            problems.append(f"top_n ({self.top_n}) must be at least k ({self.k})")
        if not self.greedy and not (math.isfinite(self.temperature) and self.temperature > 0):
            problems.append("temperature must be a positive finite number (use greedy for argmax decoding)")
        if not 0 < self.top_p <= 1:
            problems.append("top_p must be in (0, 1]")
        if self.ranker == "llm" and not has_ranker_backend:
            problems.append("the llm ranker needs a ranker model")
        if problems:
            raise ConfigError("; ".join(problems), fix="change the rollout options")

    def sampling(self) -> dict:
        """The settings recorded on every RolloutRecord (everything except code objects)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("template", "agent_constraint", "ranker_constraint")}
        out["constrain"] = [role for role, factory in (("agent", self.agent_constraint),
                                                        ("ranker", self.ranker_constraint)) if factory]
        out["template"] = asdict(self.template) if self.template != AgentTemplate() else "default"
        out["answer_containment"] = ANSWER_CONTAINMENT
        return out


PRESETS: dict[str, dict] = {
    # Small enough to run a few questions a minute on a 2-core CPU with the 135M model.
    "cpu": {},
    # The paper's search settings (N=50, K=5, T=6, G=8); token budgets are this project's choice.
    "paper": dict(n=8, top_n=50, k=5, max_turns=6, max_new_tokens=500, ranker_max_new_tokens=256,
                  passage_tokens=160, ranker_passage_tokens=128, question_chunk=64),
}


def preset(name: str, **overrides) -> RolloutConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}", fix=f"use one of {', '.join(PRESETS)}")
    return replace(RolloutConfig(**PRESETS[name]), **overrides)


def constraint_factories(roles: str, agent_name: str, agent: GenerationBackend, ranker: GenerationBackend | None,
                         ranker_name: str | None = None
                         ) -> tuple[ConstraintFactory | None, ConstraintFactory | None]:
    """Factories for `--constrain` roles ("auto": on for each role whose model descends from the embedded one,
    "none", "agent,ranker"); `ranker_name` is the ranker's model (default: the agent's)."""
    from cosearch_cli.constrain import make_constraints, parse_roles

    wanted = parse_roles(roles, agent_name, ranker_name)
    agent_factory = ranker_factory = None
    if "agent" in wanted:
        for_agent = make_constraints({"agent"}, agent.tokenizer, vocab_size=_vocab_size(agent))
        agent_factory = lambda ctx: for_agent.agent(final=ctx.last_turn)  # noqa: E731
    if "ranker" in wanted and ranker is not None:
        ranker_factory = ranker_constraint_factory(ranker)
    return agent_factory, ranker_factory


def ranker_constraint_factory(ranker: GenerationBackend) -> ConstraintFactory:
    """The ranker's constraint: `<reason>` then exactly K distinct ids in 1..N (`ctx.n_candidates`, `ctx.k`)."""
    from cosearch_cli.constrain import make_constraints

    for_ranker = make_constraints({"ranker"}, ranker.tokenizer, vocab_size=_vocab_size(ranker))
    return lambda ctx: for_ranker.ranker(n=ctx.n_candidates, k=ctx.k)


def _vocab_size(backend) -> int | None:
    """The width of the model's logits (embedding matrices are often padded past the tokenizer)."""
    return getattr(getattr(getattr(backend, "model", None), "config", None), "vocab_size", None)


@dataclass
class RolloutStats:
    """Where the time went, for progress summaries and the benchmark."""

    agent_seconds: float = 0.0
    ranker_seconds: float = 0.0
    retrieval_seconds: float = 0.0
    agent_tokens: int = 0
    ranker_tokens: int = 0
    ranker_calls: int = 0
    ranker_no_candidates: int = 0  # calls whose sub-query retrieved nothing: no ranker ran
    ranker_invalid: int = 0  # llm outputs that failed the strict parse (calls with candidates only)
    trajectories: int = 0
    format_failures: int = 0
    finished: int = 0  # trajectories done so far, counted as each ends (before its question's record is out)



class LiveRollout:
    """Work below the question level, for progress bars, read while a rollout runs: trajectories finished,
    tokens generated and prompt tokens read since it was made (per forward pass where a backend counts them,
    as the transformers backend does; else generated tokens per finished batch; reading counts too: a ranker
    call reads ~480 tokens to write ~43)."""

    def __init__(self, stats: RolloutStats, backends: Iterable = (), trajectories: int = 0):
        self.stats = stats
        self.trajectories = trajectories  # questions x G of this run
        self.counters = list({id(b): b.counters for b in backends
                              if b is not None and hasattr(b, "counters")}.values())
        self.start = (sum(c.decode_rows for c in self.counters), sum(c.encoded_tokens for c in self.counters))

    def text(self) -> str:
        finished = f"{self.stats.finished:,} trajectories finished"
        if not self.counters:
            return f"{finished}, {self.stats.agent_tokens + self.stats.ranker_tokens:,} tokens generated"
        generated = sum(c.decode_rows for c in self.counters) - self.start[0]
        read = sum(c.encoded_tokens for c in self.counters) - self.start[1]
        return f"{finished}, {generated:,} tokens generated, {read:,} read"

    def share(self) -> float | None:
        """Trajectories finished / all: a finer measure of work done than questions, whose trajectories all
        run at once and finish together (the time left is then estimated from it)."""
        return self.stats.finished / self.trajectories if self.trajectories else None


# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Live:
    """A trajectory being generated."""

    question: Question
    sample: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    format_error: str | None = None
    turn: int = 0  # index of the next agent turn (= searches so far)
    done: bool = False

    def extend(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.token_ids += ids
        self.loss_mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def finish(self) -> Trajectory:
        return Trajectory(sample=self.sample, turns=self.turns, answer=self.answer,
                          n_searches=sum(t.action == "search" for t in self.turns),
                          format_ok=self.format_error is None, format_error=self.format_error,
                          token_ids=self.token_ids, loss_mask=self.loss_mask, logprobs=self.logprobs,
                          prompt_len=self.prompt_len)


@dataclass
class _InFlight:
    question: Question
    trajectories: list[_Live]
    ranker_calls: list[RankerCall] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(t.done for t in self.trajectories)


def run_rollouts(questions: Iterable[Question], *, agent: GenerationBackend,
                 ranker_backend: GenerationBackend | None, index, config: RolloutConfig,
                 stats: RolloutStats | None = None) -> Iterator[RolloutRecord]:
    """Roll out every question G times; yield one RolloutRecord per question as soon as it is finished."""
    config.check(ranker_backend is not None)
    stats = stats if stats is not None else RolloutStats()
    retriever = index.retriever(config.retriever)
    # Backends that keep encoded prompts between calls start and end every run empty, so a run's output
    # does not depend on what ran before it, and the memory is given back.
    _reset_caches(agent, ranker_backend)
    try:
        yield from _rollout_loop(questions, agent, ranker_backend, index, retriever, config, stats)
    finally:
        _reset_caches(agent, ranker_backend)


def _reset_caches(*backends) -> None:
    for backend in backends:
        reset = getattr(backend, "reset_cache", None)
        if reset is not None:
            reset()


def _rollout_loop(questions, agent, ranker_backend, index, retriever, config: RolloutConfig,
                  stats: RolloutStats) -> Iterator[RolloutRecord]:
    pending = iter(questions)
    pool: list[_InFlight] = []
    exhausted = False
    while True:
        while not exhausted and len(pool) < config.question_chunk:
            question = next(pending, None)
            if question is None:
                exhausted = True
                break
            pool.append(_start(question, agent.tokenizer, config))
        if not pool:
            return
        live = [t for q in pool for t in q.trajectories if not t.done]
        searches = _agent_turn(live, agent, config, stats)
        if searches:
            _search_turn(searches, pool, index, retriever, agent.tokenizer, ranker_backend, config, stats)
        for item in [q for q in pool if q.done]:
            pool.remove(item)
            stats.trajectories += len(item.trajectories)
            stats.format_failures += sum(t.format_error is not None for t in item.trajectories)
            yield _record(item, config)


def _start(question: Question, tokenizer, config: RolloutConfig) -> _InFlight:
    prompt = agent_prompts.prompt_ids(tokenizer, question.question, config.max_turns, config.template)
    trajectories = [_Live(question, s, list(prompt), [0] * len(prompt), [0.0] * len(prompt), len(prompt))
                    for s in range(config.n)]
    return _InFlight(question, trajectories)


def _settings(config: RolloutConfig, max_new_tokens: int, stop: tuple[str, ...]) -> SamplingSettings:
    return SamplingSettings(max_new_tokens=max_new_tokens, temperature=config.temperature, top_p=config.top_p,
                            greedy=config.greedy, stop=stop, seed=config.seed)


def _budget(max_new_tokens: int, requests: list[GenerationRequest]) -> int:
    """Room for the longest output a constraint allows: cutting a constrained output short would make it
    invalid by construction."""
    bounds = [getattr(r.constraint, "max_tokens", 0) or 0 for r in requests if r.constraint is not None]
    return max([max_new_tokens, *bounds])


def _context_limit(backend) -> int | None:
    config = getattr(getattr(backend, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)


def _agent_turn(live: list[_Live], agent: GenerationBackend, config: RolloutConfig,
                stats: RolloutStats) -> list[_Live]:
    """One generation for every live trajectory; returns those that searched (they await an observation)."""
    requests = []
    for traj in live:
        turn = traj.turn
        constraint = None
        if config.agent_constraint is not None:
            constraint = config.agent_constraint(ConstraintContext("agent", agent.tokenizer, turn,
                                                                   last_turn=turn == config.max_turns))
        requests.append(GenerationRequest(list(traj.token_ids), constraint=constraint,
                                          seed=derive_seed(config.seed, traj.question.id, traj.sample, turn,
                                                           "agent"),
                                          keep_cache=turn < config.max_turns))
    budget = _budget(config.max_new_tokens, requests)
    limit = config.max_context or _context_limit(agent)
    if limit is not None:
        fits = [len(r.prompt_ids) + budget <= limit for r in requests]
        for traj, ok in zip(live, fits):
            if not ok:
                traj.format_error = (f"turn {traj.turn}: context full ({len(traj.token_ids)} tokens + {budget} "
                                     f"new > {limit})")
                traj.done = True
                stats.finished += 1
        live = [t for t, ok in zip(live, fits) if ok]
        requests = [r for r, ok in zip(requests, fits) if ok]
        if not requests:
            return []
    started = time.perf_counter()
    generations = agent.generate(requests, _settings(config, budget, AGENT_STOPS))
    stats.agent_seconds += time.perf_counter() - started
    searching = []
    release = getattr(agent, "release", None)
    for traj, request, gen in zip(live, requests, generations):
        stats.agent_tokens += len(gen.token_ids)
        turn = traj.turn
        traj.extend(gen.token_ids, gen.logprobs)
        parsed = parse_turn(gen.text)
        error = parsed.error
        if parsed.action == "search" and turn >= config.max_turns:
            error = f"searched after the last allowed search ({config.max_turns})"
        if error is None and parsed.action == "invalid":
            error = "invalid turn"
        action = "invalid" if error else parsed.action
        traj.turns.append(Turn(text=gen.text, token_ids=gen.token_ids, logprobs=gen.logprobs, action=action,
                               query=parsed.content if action == "search" else None, error=error))
        if action == "search":
            traj.turn = turn + 1
            searching.append(traj)
            continue
        if action == "answer":
            traj.answer = parsed.content
        else:
            traj.format_error = f"turn {turn}: {error}"
        traj.done = True
        stats.finished += 1
        if request.keep_cache and release is not None:  # no next turn will continue from this state
            release(request.prompt_ids + gen.token_ids[:-1])
    return searching


def _search_turn(searching: list[_Live], pool: list[_InFlight], index, retriever,
                 tokenizer, ranker_backend: GenerationBackend | None, config: RolloutConfig,
                 stats: RolloutStats) -> None:
    """Retrieve, rank and show: one retrieval batch, one ranker batch, then every observation appended."""
    queries = [traj.turns[-1].query for traj in searching]
    started = time.perf_counter()
    hit_lists = retriever.search(queries, config.top_n)
    unique_ids = list(dict.fromkeys(h.id for hits in hit_lists for h in hits))
    passages = dict(zip(unique_ids, index.docs.get(unique_ids)))
    stats.retrieval_seconds += time.perf_counter() - started

    calls = []
    for traj, query, hits in zip(searching, queries, hit_lists):
        turn = traj.turn - 1
        candidates = [passages[h.id] for h in hits]
        calls.append(RankerCall(
            id=f"{traj.question.id}/s{traj.sample}/t{turn}", sample=traj.sample, turn=turn, query=query,
            ranker=config.ranker, candidate_ids=[h.id for h in hits], candidate_scores=[float(h.score) for h in hits],
            candidate_has_answer=[passage_has_answer(p, traj.question.answers) for p in candidates],
            permutation=[], chosen_ids=[]))
    _rank(calls, searching, passages, ranker_backend, config, stats)

    owner = {id(t): q for q in pool for t in q.trajectories}
    for traj, call in zip(searching, calls):
        traj.turns[-1].ranker_call = call.id
        traj.turns[-1].observation_ids = call.chosen_ids
        owner[id(traj)].ranker_calls.append(call)
        shown = [passages[pid] for pid in call.chosen_ids]
        last = traj.turn >= config.max_turns
        text = observation_text(tokenizer, shown, config.passage_tokens, last=last, template=config.template)
        traj.extend(tokenizer.encode(text, add_special_tokens=False), None)


def _rank(calls: list[RankerCall], searching: list[_Live], passages: dict, ranker_backend, config: RolloutConfig,
          stats: RolloutStats) -> None:
    """Fill permutation / chosen_ids (and the LLM ranker's tokens) of every call of this turn."""
    if config.ranker == "llm":
        rank_llm(calls, [t.question for t in searching], passages, ranker_backend, config, stats)
    for call in calls:
        if config.ranker == "none":
            call.permutation = ranking.top_k(len(call.candidate_ids), config.k)
        elif config.ranker == "oracle":
            call.permutation = ranking.oracle(call.candidate_has_answer, config.k)
        call.chosen_ids = [call.candidate_ids[i] for i in call.permutation]
        stats.ranker_calls += 1
        stats.ranker_no_candidates += call.no_candidates


def rank_llm(calls: list[RankerCall], questions: list[Question], passages: dict, backend: GenerationBackend,
             config: RolloutConfig, stats: RolloutStats) -> None:
    """Fill each call's permutation, validity and tokens from the LLM ranker (one batch); `questions[i]` is
    the question call i searched for, `passages` maps candidate ids to passages. Also used to re-run a ranker
    on recorded calls (cosearch_cli/ranker_quality.py), so both see the same prompt, constraint and parsing."""
    for call in calls:
        if not call.candidate_ids:  # nothing retrieved (e.g. a query of stopwords): nothing to rank or learn
            call.valid, call.error = False, "no candidates retrieved"
    calls_with = [(c, q) for c, q in zip(calls, questions) if c.candidate_ids]
    if not calls_with:
        return
    calls, questions = [c for c, _ in calls_with], [q for _, q in calls_with]
    tokenizer = backend.tokenizer
    requests = []
    for call, question in zip(calls, questions):
        candidates = [passages[pid] for pid in call.candidate_ids]
        prompt = ranking.prompt_ids(tokenizer, question.question, call.query, candidates, config.k,
                                    config.ranker_passage_tokens)
        constraint = None
        if config.ranker_constraint is not None:
            constraint = config.ranker_constraint(ConstraintContext(
                "ranker", tokenizer, call.turn, n_candidates=len(candidates), k=min(config.k, len(candidates))))
        call.prompt_ids = prompt
        requests.append(GenerationRequest(prompt, constraint=constraint,
                                          seed=derive_seed(config.seed, question.id, call.sample, call.turn,
                                                           "ranker")))
    started = time.perf_counter()
    budget = _budget(config.ranker_max_new_tokens, requests)
    generations = backend.generate(requests, _settings(config, budget, RANKER_STOPS))
    stats.ranker_seconds += time.perf_counter() - started
    for call, gen in zip(calls, generations):
        parsed = ranking.parse_ranking(gen.text, len(call.candidate_ids), config.k, lenient=config.lenient_ranker)
        call.output_ids, call.logprobs, call.output_text = gen.token_ids, gen.logprobs, gen.text
        call.permutation, call.valid, call.error = parsed.permutation, parsed.valid, parsed.error
        stats.ranker_tokens += len(gen.token_ids)
        stats.ranker_invalid += not parsed.valid


def _record(item: _InFlight, config: RolloutConfig) -> RolloutRecord:
    q = item.question
    calls = sorted(item.ranker_calls, key=lambda c: (c.sample, c.turn))
    return RolloutRecord(question_id=q.id, question=q.question, answers=q.answers, dataset=q.dataset,
                         trajectories=[t.finish() for t in item.trajectories], ranker_calls=calls,
                         sampling=config.sampling())
