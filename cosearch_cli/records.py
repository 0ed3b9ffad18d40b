"""One typed definition per record kind. Every stage reads and writes these.

Records are plain dataclasses; orjson writes them directly and `from_row` reads them back with a check
of the fields a stage needs, so a bad line is reported with its file, line and the missing field.

Schema history:
  1  first release.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from cosearch_cli.errors import InputError, RecordError

if TYPE_CHECKING:
    from cosearch_cli.artifacts import Reader

SCHEMA_VERSION = 1
# Longest question accepted (characters). The benchmarks' longest is 315; a 50 MB "question" once drove a
# rollout past 5 GB of memory within seconds, so a question over this is refused before any model loads.
MAX_QUESTION_CHARS = 4000

T = TypeVar("T")


@dataclass
class Question:
    """A question with its gold answers; unknown fields of the source file are kept in `extra`."""

    id: str
    question: str
    answers: list[str]
    dataset: str = ""
    supporting_titles: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass
class Passage:
    id: str
    title: str
    text: str


@dataclass
class Hit:
    """One retrieval result."""

    id: str
    score: float


@dataclass
class Turn:
    """One agent turn: what it generated and the search it triggered."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    action: str  # "search" | "answer" | "invalid"
    query: str | None = None
    ranker_call: str | None = None  # RankerCall.id that chose the observation
    observation_ids: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class Trajectory:
    """One sampled rollout of the agent for a question.

    `token_ids` is the whole sequence (prompt, generated turns, inserted observations); `loss_mask` is 1
    exactly on tokens the agent generated; `logprobs` holds the sampling log-probability of each token
    (0.0 where the mask is 0). Stages after rollout fill the fields below the line.
    """

    sample: int
    turns: list[Turn]
    answer: str | None
    n_searches: int
    format_ok: bool
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    format_error: str | None = None
    # -- filled by group / reward
    group: str | None = None
    scores: dict = field(default_factory=dict)
    reward: float | None = None
    advantage: float | None = None


@dataclass
class RankerCall:
    """One ranker call: N candidates in, K chosen out.

    Candidates are parallel lists (ids, retriever scores, whether each contains a gold answer) so that
    records with many calls stay small and fast to read. `permutation` holds 0-based candidate indices.
    """

    id: str  # "<question_id>/s<sample>/t<turn>"
    sample: int
    turn: int
    query: str
    ranker: str  # "llm" | "none" | "oracle"
    candidate_ids: list[str]
    candidate_scores: list[float]
    candidate_has_answer: list[bool]
    permutation: list[int]
    chosen_ids: list[str]
    valid: bool = True
    error: str | None = None
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    output_text: str = ""
    # -- filled by group / reward
    group: str | None = None
    reward: float | None = None
    reward_parts: dict = field(default_factory=dict)
    advantage: float | None = None

    @property
    def any_has_answer(self) -> bool:
        return any(self.candidate_has_answer)

    @property
    def no_candidates(self) -> bool:
        """The retriever returned nothing (e.g. a sub-query of stopwords): no ranker ran, nothing to learn."""
        return not self.candidate_ids


@dataclass
class GroupInfo:
    """A GRPO group: which members were compared, whether it trains, and why not."""

    id: str  # "<question_id>/agent" or "<question_id>/ranker/<easy|hard>/c<n>"
    role: str  # "agent" | "ranker"
    members: list[str]  # trajectory samples (as strings) or ranker call ids
    kept: bool
    reason: str = ""
    baseline: float | None = None
    """The reward advantages are measured from instead of the group's mean: the greedy trajectory's reward
    (an agent group of a run with agent_baseline = "greedy", as ReMax); None: GRPO's group mean."""


@dataclass
class RolloutRecord:
    """Everything that happened for one question: G trajectories and every ranker call in them.

    `stage` tells how far down the pipeline the record has come: "rollout", "grouped", "scored".
    """

    question_id: str
    question: str
    answers: list[str]
    dataset: str
    trajectories: list[Trajectory]
    ranker_calls: list[RankerCall] = field(default_factory=list)
    stage: str = "rollout"
    sampling: dict = field(default_factory=dict)  # temperature, top_p, greedy, seed, max_turns, k, n ...
    groups: list[GroupInfo] = field(default_factory=list)
    kind: str = "rollout"
    schema: int = SCHEMA_VERSION


# ---------------------------------------------------------------------------------------------------------
# Reading with checks


@cache
def _field_specs(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls)
    specs = []
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        specs.append((f.name, hints[f.name], required))
    return tuple(specs)


@cache
def _type_check(hint: Any) -> Callable[[Any], bool]:
    """A fast `isinstance`-style check for one type hint, built once per hint (reading is per field)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        checks = tuple(_type_check(arg) for arg in typing.get_args(hint))
        return lambda value: any(check(value) for check in checks)
    if hint is type(None):
        return lambda value: value is None
    if hint is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if hint is Any:
        return lambda value: True
    if origin is not None:
        return lambda value: isinstance(value, origin)
    if is_dataclass(hint):
        return lambda value: isinstance(value, dict)
    return lambda value: isinstance(value, hint)


def _type_ok(value: Any, hint: Any) -> bool:
    return _type_check(hint)(value)


@cache
def _read_plan(cls: type) -> tuple[tuple[str, Any, bool, Callable[[Any], bool], type | None, type | None], ...]:
    """Per field: name, hint, required, type check, nested record class, record class of list items."""
    plan = []
    for name, hint, required in _field_specs(cls):
        nested = hint if is_dataclass(hint) else None
        items = None
        if typing.get_origin(hint) is list:
            (inner,) = typing.get_args(hint) or (Any,)
            items = inner if is_dataclass(inner) else None
        plan.append((name, hint, required, _type_check(hint), nested, items))
    return tuple(plan)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def from_dict(cls: type[T], data: dict, *, path: str = "<record>", line: int | None = None,
              context: str = "") -> T:
    """Build `cls` from a dict, checking required fields and types, converting nested records."""
    kwargs = {}
    for name, hint, required, check, nested, items in _read_plan(cls):
        if name not in data:
            if required:
                raise RecordError(f"{context}missing field {name!r} for a {cls.__name__} record", path=path,
                                  line=line, fix=_fix_for(cls))
            continue
        value = data[name]
        if not check(value):
            raise RecordError(f"{context}field {name!r} should be {_type_name(hint)}, got "
                              f"{type(value).__name__}", path=path, line=line, fix=_fix_for(cls))
        if items is not None:
            value = _convert_list(value, items, path, line, f"{context}{name}.")
        elif nested is not None:
            value = from_dict(nested, value, path=path, line=line, context=f"{context}{name}.")
        kwargs[name] = value
    return cls(**kwargs)


def _convert_list(value: list, inner: type, path: str, line: int | None, context: str) -> list:
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise RecordError(f"{context}[{i}] should be an object", path=path, line=line, fix=_fix_for(inner))
        out.append(from_dict(inner, item, path=path, line=line, context=f"{context[:-1]}[{i}]."))
    return out


def _fix_for(cls: type) -> str:
    if cls in (Question,):
        return "questions need id, question and a non-empty answers list"
    if cls in (Passage,):
        return "passages need id, title and text"
    return "regenerate this file with the cosearch stage that makes it"


def read_rollout(row_data: dict, path: str, line: int, *, min_stage: str = "rollout") -> RolloutRecord:
    """Parse one rollout-kind record, refusing other kinds, older schemas and too-early stages."""
    kind = row_data.get("kind")
    if kind != "rollout":
        raise RecordError(f"expected a rollout record, got kind={kind!r}", path=path, line=line,
                          fix="pass the output of `cosearch rollout` (or group/reward)")
    schema = row_data.get("schema")
    if schema != SCHEMA_VERSION:
        raise RecordError(f"record has schema version {schema!r}, this cosearch reads {SCHEMA_VERSION}",
                          path=path, line=line, fix="rerun the stage that made it with this version")
    record = from_dict(RolloutRecord, row_data, path=path, line=line)
    order = ("rollout", "grouped", "scored")
    if record.stage not in order:
        raise RecordError(f"unknown stage {record.stage!r}", path=path, line=line,
                          fix=f"stage must be one of {', '.join(order)}")
    if order.index(record.stage) < order.index(min_stage):
        raise RecordError(f"record is at stage {record.stage!r} but this command needs {min_stage!r}",
                          path=path, line=line, fix=_STAGE_FIX[min_stage])
    return record


_STAGE_FIX = {
    "rollout": "pass the output of `cosearch rollout`",
    "grouped": "pipe it through `cosearch group` first",
    "scored": "pipe it through `cosearch group | cosearch reward` first",
}


def read_question(row_data: dict, path: str, line: int) -> Question:
    """Parse a question in the shared data's shape; extra fields go to `extra`."""
    known = {f.name for f in fields(Question)}
    base = {k: v for k, v in row_data.items() if k in known and k != "extra"}
    base["extra"] = {k: v for k, v in row_data.items() if k not in known}
    question = from_dict(Question, base, path=path, line=line)
    if not question.answers or not all(isinstance(a, str) for a in question.answers):
        raise RecordError(f"question {question.id!r} has no gold answers", path=path, line=line,
                          fix="give each question a non-empty 'answers' list of strings")
    if len(question.question) > MAX_QUESTION_CHARS:
        raise RecordError(f"question {question.id!r} has {len(question.question):,} characters, more than the "
                          f"{MAX_QUESTION_CHARS:,} accepted", path=path, line=line,
                          fix="shorten it (benchmark questions are under 400 characters)")
    return question


def read_questions(path: str | Path | list[str]) -> tuple[list[Question], Reader]:
    """All questions of a file, glob or list of them, checked before any model loads, so a bad line fails the
    run before anything is written."""
    from cosearch_cli.artifacts import Reader

    reader = Reader.open(path)
    questions, seen = [], {}
    for row in reader.rows():
        question = read_question(row.data, row.path, row.line)
        if question.id in seen:
            raise RecordError(f"question {question.id!r} appears twice (first at line {seen[question.id]})",
                              path=row.path, line=row.line, fix="give each question a unique id")
        seen[question.id] = row.line
        questions.append(question)
    if not questions:
        raise InputError("no questions in the file", path=", ".join(reader.paths),
                         fix="pass a JSONL file with one question a line")
    return questions, reader
