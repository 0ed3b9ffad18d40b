"""Supervised warm-up: demonstrations built from the data itself, and a brief fine-tune on them.

A small model that never writes a valid action gives GRPO flat groups and nothing to learn. The warm-up
shows it the formats first. For each training question it writes the trajectory a careful searcher would:
  - sub-queries from the benchmark's own annotations: MuSiQue `question_decomposition` (with "#1" replaced
    by the previous hop's answer), 2Wiki `evidences` ("subject relation"), HotpotQA-style
    `supporting_titles`; single-hop questions search the question itself;
  - observations from the real index, chosen by a ranker demonstration that puts answer-bearing candidates
    first, then gold-title ones, then the retriever's order;
  - the gold answer (the shortest alias that fits the answer budget).
Prompts, observations and turns are exactly the rollout's (`agent.prompt_ids`, `agent.observation_text`,
tags tokenised like the constraints), so the fine-tuned model meets the same token sequences at rollout.
The loss is the update stage's masked token log-prob: cross-entropy on generated tokens only (turns, ranker
outputs); prompts and observations are masked out.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch

from cosearch_cli import agent as agent_prompts
from cosearch_cli import ranker as ranking
from cosearch_cli.constrain import ConstraintLimits, agent_turn_ids, free_text, ranker_output_ids
from cosearch_cli.errors import InputError
from cosearch_cli.metrics import passage_has_answer
from cosearch_cli.records import Passage, Question
from cosearch_cli.rollout import RolloutConfig
from cosearch_cli.splits import QuestionKeys
from cosearch_cli.update.batch import TrainSeq, collate, plan_micro_batches
from cosearch_cli.update.config import UpdateConfig
from cosearch_cli.update.logprobs import token_logprobs
from cosearch_cli.update.step import make_optimizer


@dataclass
class Demo:
    """One demonstration: a token sequence and the mask of tokens the model should learn to generate."""

    key: str  # "<question_id>/agent" or "<question_id>/ranker/t<turn>"
    role: str  # "agent" | "ranker"
    token_ids: list[int]
    mask: list[int]
    answer_shown: bool = False  # agent: some observation held a gold answer
    queries: list[str] = field(default_factory=list)
    first_choice: int | None = None  # ranker: the 0-based candidate the demonstration puts first


@dataclass
class DemoStats:
    questions: int = 0
    agent: int = 0
    ranker: int = 0
    skipped_no_evidence: int = 0
    ranker_uninformed_skipped: int = 0  # ranker calls with no answer-bearing or gold candidate, left out
    ranker_unbalanced_skipped: int = 0  # "balanced": calls choosing the retriever's first, beyond the others' count
    searches: int = 0


# ---------------------------------------------------------------------------------------------------------
# Sub-queries from the annotations


_HOP_REF = re.compile(r"#(\d+)")


def sub_queries(question: Question) -> list[str]:
    """The searches a demonstration makes, in order (deduplicated, tag characters removed)."""
    extra = question.extra
    if extra.get("question_decomposition"):
        queries, answers = [], []
        for step in extra["question_decomposition"]:
            text = _HOP_REF.sub(lambda m: _hop_answer(answers, int(m.group(1))), str(step.get("question", "")))
            queries.append(text.replace(">>", " "))
            answers.append(str(step.get("answer", "")))
    elif extra.get("evidences"):
        queries = [f"{triple[0]} {triple[1]}" for triple in extra["evidences"] if len(triple) >= 2]
    elif len(question.supporting_titles) >= 2:
        queries = list(question.supporting_titles)
    else:
        queries = [question.question]
    out, seen = [], set()
    for q in queries:
        q = free_text(q, line=True)
        if q and q.lower() not in seen:
            seen.add(q.lower())
            out.append(q)
    return out


def _hop_answer(answers: list[str], hop: int) -> str:
    return answers[hop - 1] if 0 < hop <= len(answers) else ""


def gold_titles(question: Question) -> set[str]:
    titles = set(question.supporting_titles)
    for triple in question.extra.get("evidences") or []:
        if triple:
            titles.add(str(triple[0]))
    return {t.lower() for t in titles}


def evidence_flags(question: Question, candidates: Sequence[Passage]) -> tuple[list[bool], list[bool]]:
    """Per candidate: whether it bears a gold answer, and whether it is a gold passage (by id or title)."""
    gold_ids = set(question.extra.get("gold_passage_ids") or [])
    titles = gold_titles(question)
    has = [passage_has_answer(p, question.answers) for p in candidates]
    gold = [p.id in gold_ids or p.title.lower() in titles for p in candidates]
    return has, gold


def demo_ranking(question: Question, candidates: Sequence[Passage], k: int) -> tuple[list[int], str]:
    """0-based order of the k passages to show (answer-bearing, then gold, then retriever order) and a reason."""
    has, gold = evidence_flags(question, candidates)
    order = sorted(range(len(candidates)), key=lambda i: (not has[i], not gold[i], i))[:min(k, len(candidates))]
    if not order:
        return [], ""
    best = order[0]
    if has[best]:
        reason = f" [{best + 1}] mentions {pick_answer(question, 16, None)}."
    elif gold[best]:
        reason = f" [{best + 1}] is about {candidates[best].title}."
    else:
        reason = f" [{best + 1}] is closest to the query."
    return order, reason


def informed(question: Question, candidates: Sequence[Passage]) -> bool:
    """Whether the demonstration's order rests on evidence: some candidate bears an answer or a gold title.

    Without one, `demo_ranking` falls back to the retriever's order, and a ranker fine-tuned on such calls
    learns to copy the retriever.
    """
    has, gold = evidence_flags(question, candidates)
    return any(has) or any(gold)


def pick_answer(question: Question, max_tokens: int, tokenizer) -> str:
    """The first gold alias, or the shortest one when the first does not fit the answer budget."""
    answers = [free_text(a, line=True) for a in question.answers if free_text(a, line=True)]
    if tokenizer is None or len(tokenizer.encode(f" {answers[0]}", add_special_tokens=False)) <= max_tokens:
        return answers[0]
    return min(answers, key=len)


def _fit(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]).rstrip()


# ---------------------------------------------------------------------------------------------------------
# Demonstrations


def shuffled_positions(key: str, n: int) -> list[int]:
    """A fixed permutation of range(n) for one ranker call, seeded by the call's key (same key, same order)."""
    order = list(range(n))
    random.Random(key).shuffle(order)
    return order


def in_view(tokenizer, passages: Sequence[Passage], passage_tokens: int) -> list[Passage]:
    """The passages as a prompt shows them: each text cut to `passage_tokens` tokens (titles are shown whole)."""
    texts = agent_prompts.truncate_to_tokens(tokenizer, [p.text for p in passages], passage_tokens)
    return [replace(p, text=t) for p, t in zip(passages, texts)]


def build_demonstrations(questions: Iterable[Question], *, index, tokenizer, config: RolloutConfig,
                         limits: ConstraintLimits = ConstraintLimits(), require_evidence: bool = True,
                         with_ranker: bool = True, ranker_demos: str = "all", visible_evidence: bool = False,
                         stats: DemoStats | None = None) -> list[Demo]:
    """Agent (and ranker) demonstrations for each question, in the rollout's exact token format.

    With `require_evidence`, a question whose shown passages never hold a gold answer gives no agent
    demonstration (it would teach answering from memory); its ranker demonstrations are kept.
    `ranker_demos="evidence"` keeps only the ranker calls whose order rests on evidence (`informed`); "all"
    also keeps those that fall back to the retriever's order; "shuffled" keeps the evidence calls and shows
    their candidates in a fixed random order (`shuffled_positions`), so that the demonstrated choice is not
    the first position whenever the retriever ranked the evidence first; "balanced" keeps, in the retriever's
    order, every evidence call whose demonstrated first choice is not the retriever's first and as many of the
    others (`balance_first_choices`), so that copying the retriever's order is right on half of them.

    With `visible_evidence`, an answer counts as evidence only where the prompt shows it: a ranker demonstration
    judges the candidates by their first `config.ranker_passage_tokens` tokens (what the ranker reads), and an
    agent demonstration needs the answer in its observations' first `config.passage_tokens` tokens. Otherwise a
    demonstration may choose a passage for an answer that lies beyond the cut, which no model can learn to see.
    """
    if ranker_demos not in ranking.RANKER_DEMOS:
        raise ValueError(f"ranker_demos must be one of {', '.join(ranking.RANKER_DEMOS)}, not {ranker_demos!r}")
    stats = stats if stats is not None else DemoStats()
    retriever = index.retriever(config.retriever)
    demos: list[Demo] = []
    for question in questions:
        stats.questions += 1
        queries = [_fit(tokenizer, f" {q}", limits.max_query).strip() for q in sub_queries(question)]
        queries = [q for q in queries if q][:config.max_turns]
        hit_lists = retriever.search(queries, config.top_n) if queries else []
        # a query the index finds nothing for is left out (a demonstration should not show empty results)
        queries, hit_lists = [q for q, h in zip(queries, hit_lists) if h], [h for h in hit_lists if h]
        prompt = agent_prompts.prompt_ids(tokenizer, question.question, config.max_turns, config.template)
        ids, mask = list(prompt), [0] * len(prompt)
        shown_answer = False
        for turn, (query, hits) in enumerate(zip(queries, hit_lists)):
            candidates = index.docs.get([h.id for h in hits])
            judged = in_view(tokenizer, candidates, config.ranker_passage_tokens) if visible_evidence else candidates
            order, reason = demo_ranking(question, judged, config.k)
            shown = [candidates[i] for i in order]
            read = in_view(tokenizer, shown, config.passage_tokens) if visible_evidence else shown
            shown_answer |= any(passage_has_answer(p, question.answers) for p in read)
            keep_ranker = ranker_demos == "all" or informed(question, judged)  # evidence, shuffled: informed
            if with_ranker and candidates and not keep_ranker:
                stats.ranker_uninformed_skipped += 1
            if with_ranker and candidates and keep_ranker:
                listed, r_order, r_reason = candidates, order, reason
                if ranker_demos == "shuffled":
                    positions = shuffled_positions(f"{question.id}/t{turn}", len(candidates))
                    listed = [candidates[i] for i in positions]
                    r_order, r_reason = demo_ranking(question, [judged[i] for i in positions], config.k)
                r_prompt = ranking.prompt_ids(tokenizer, question.question, query, listed, config.k,
                                              config.ranker_passage_tokens)
                output = ranker_output_ids(tokenizer, _fit(tokenizer, r_reason, limits.max_reason),
                                           [i + 1 for i in r_order])
                demos.append(Demo(f"{question.id}/ranker/t{turn}", "ranker", r_prompt + output,
                                  [0] * len(r_prompt) + [1] * len(output), queries=[query],
                                  first_choice=r_order[0] if r_order else None))
                stats.ranker += 1
            think = " I need to find more facts." if turn else " I should search for the facts I need."
            turn_ids = agent_turn_ids(tokenizer, _fit(tokenizer, think, limits.max_think), "search", query)
            last = turn + 1 >= config.max_turns
            observation = agent_prompts.observation_text(tokenizer, shown, config.passage_tokens, last=last,
                                                         template=config.template)
            obs_ids = tokenizer.encode(observation, add_special_tokens=False)
            ids += turn_ids + obs_ids
            mask += [1] * len(turn_ids) + [0] * len(obs_ids)
            stats.searches += 1
        if require_evidence and not shown_answer:
            stats.skipped_no_evidence += 1
            continue
        answer = pick_answer(question, limits.max_answer, tokenizer)
        think = " The search results give the answer." if queries else " I know the answer."
        final = agent_turn_ids(tokenizer, think, "answer", _fit(tokenizer, f" {answer}", limits.max_answer).strip())
        demos.append(Demo(f"{question.id}/agent", "agent", ids + final, mask + [1] * len(final),
                          answer_shown=shown_answer, queries=queries))
        stats.agent += 1
    if ranker_demos == "balanced":
        demos = balance_first_choices(demos, stats)
    return demos


def balance_first_choices(demos: list[Demo], stats: DemoStats | None = None) -> list[Demo]:
    """Every ranker demonstration whose first choice is not candidate 0 (the retriever's first), and as many of
    those that choose candidate 0, taken in a fixed order of their keys (sha1); agent demonstrations all stay,
    and the order of the list is kept."""
    other = [d for d in demos if d.role == "ranker" and d.first_choice != 0]
    first = sorted((d for d in demos if d.role == "ranker" and d.first_choice == 0),
                   key=lambda d: hashlib.sha1(d.key.encode()).hexdigest())
    keep = {id(d) for d in other + first[:len(other)]}
    if stats is not None:
        stats.ranker_unbalanced_skipped += len(first) - min(len(first), len(other))
        stats.ranker = len(keep)
    return [d for d in demos if d.role != "ranker" or id(d) in keep]


def check_no_overlap(train: Sequence[Question], excluded: Sequence[Question]) -> None:
    """Refuse training questions that are also evaluation questions (same id or same normalised text)."""
    seen = QuestionKeys(excluded)
    clash = [q for q in train if seen.matches(q)]
    if clash:
        raise InputError(f"{len(clash)} training question(s) are also evaluation questions, e.g. "
                         f"{clash[0].id!r}: {clash[0].question!r}",
                         fix="remove them from the training file (evaluation questions must stay unseen)")


# ---------------------------------------------------------------------------------------------------------
# Fine-tuning


@dataclass
class FinetuneConfig:
    epochs: int = 1
    """Passes over the demonstrations."""
    lr: float = 5e-5
    """AdamW learning rate (a short warm-up, not a long fine-tune)."""
    token_budget: int = 4096
    """Tokens (rows x longest row) per optimiser step."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    seed: int = 0
    """Shuffles the order of the steps."""


def to_train_seqs(demos: Sequence[Demo]) -> list[TrainSeq]:
    """Demonstrations as the update stage's sequences: advantage 1, temperature 1, no old log-probs."""
    return [TrainSeq(d.key, d.token_ids, d.mask, [0.0] * len(d.token_ids), 1.0, 1.0) for d in demos]


def sft_loss(model, seqs: Sequence[TrainSeq], pad_id: int = 0) -> torch.Tensor:
    """Token-mean cross-entropy over the masked-in tokens only (the update's masking rules)."""
    logp, _ = token_logprobs(model, collate(list(seqs), pad_id=pad_id))
    return -logp.mean()


def finetune(model, demos: Sequence[Demo], config: FinetuneConfig, *, pad_id: int = 0,
             on_step: Callable[[int, int, float], None] | None = None) -> list[float]:
    """A few epochs of AdamW on the demonstrations; returns the loss of every step."""
    torch.manual_seed(config.seed)
    plans = plan_micro_batches(to_train_seqs(demos), config.token_budget)
    rng = random.Random(config.seed)
    optimizer = make_optimizer(model, UpdateConfig(lr=config.lr, weight_decay=0.0))  # the update's (fused) AdamW
    model.train()
    losses: list[float] = []
    total = len(plans) * config.epochs
    for _ in range(config.epochs):
        rng.shuffle(plans)
        for plan in plans:
            loss = sft_loss(model, plan, pad_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(len(losses), total, losses[-1])
    model.eval()
    return losses
