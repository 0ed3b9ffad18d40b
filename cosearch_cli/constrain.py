"""Constrained decoding: agent turns and ranker outputs that always parse, even from a tiny model.

Each constraint is a small token-level state machine over one sequence. Its vocabulary masks are computed
once per tokenizer (`TokenClasses`): which tokens are safe inside free text (their text holds no `<` or `>`,
so they can never open or close a tag), which of those carry non-space content, and which are pure digits.
Tags are forced as the exact token ids the tokenizer gives for the tag strings of `cosearch_cli.formats`.

    agent turn:  <think> TEXT </think>\\n<search> LINE </search>      (or <answer> LINE </answer>)
    ranker:      <reason> TEXT </reason>\\n<ranking> [i] > [j] > ... [k] </ranking>

TEXT and LINE are bounded (`max_think`, `max_query`, ...) and start with a content token, so a query or an
answer is never empty; LINE has no newline. On the final turn the agent may only answer. Ranker ids are
exactly K distinct numbers in 1..N, so the output always names a valid permutation prefix.

Which log-probabilities are recorded (see generation/base.py): the backend samples among allowed tokens but
records each sampled token's log-probability under the model's *unconstrained* distribution,
log_softmax(logits / T), and the update recomputes exactly that from the token ids. The policy gradient of a
rewarded (valid, by construction) sequence then pushes up that sequence's probability under the free model,
which takes mass away from the invalid tokens the mask hid: decoding without the constraint gets more valid
as training goes on. With the renormalised constrained distribution the invalid tokens would have no
gradient at all (their mass is not part of the objective), and the update would have to replay the same
masks to stay on-policy. The constrained sampler is off-policy for the free model only by the mask, which
the ratio clip bounds like any other sampling change (top-p is handled the same way).

Why our own state machine and not a grammar library (measured in bench/results/valid_actions.md): the
formats are two fixed templates, so a per-state mask costs one tensor copy per token (microseconds), no
grammar compilation per tokenizer, no extra dependency, and the same object serves the transformers backend
and any backend that accepts a per-sequence mask callback. vLLM users can still pass an equivalent regex to
vLLM's own guided decoding (`agent_regex`, `ranker_regex`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from cosearch_cli import formats
from cosearch_cli.errors import ConfigError

ROLES = ("agent", "ranker")


@dataclass(frozen=True)
class ConstraintLimits:
    """Token budgets for the free-text parts (each part also has at least one content token).

    The defaults keep a whole turn within the cpu rollout preset's 80 new tokens (73 at most with the
    SmolLM2 tokenizer) and a ranker output within its 64 (61 at most for K=5, N<=99).
    """

    max_think: int = 40  # reasoning inside <think>
    max_query: int = 20  # search query
    max_answer: int = 16  # short answer
    max_reason: int = 24  # ranker's reason


class TokenClasses:
    """Vocabulary masks for one tokenizer, computed once (about 0.3 s for 49k tokens)."""

    def __init__(self, tokenizer, vocab_size: int | None = None):
        n_tok = len(tokenizer)
        self.vocab_size = max(vocab_size or n_tok, n_tok)
        self.tokenizer = tokenizer
        self._only: dict[frozenset[int], torch.Tensor] = {}
        texts = tokenizer.batch_decode([[i] for i in range(n_tok)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
        special = set(tokenizer.all_special_ids)
        # '\ufffd' marks a token holding part of a multi-byte character: left out so that free text always
        # decodes to whole characters (whole-character tokens still cover accented names).
        safe = [i not in special and t != "" and "<" not in t and ">" not in t and "\ufffd" not in t
                for i, t in enumerate(texts)]
        self.text = self._mask(i for i, ok in enumerate(safe) if ok)
        self.line = self._mask(i for i, ok in enumerate(safe) if ok and "\n" not in texts[i]
                               and "\r" not in texts[i])
        self.text_content = self._mask(i for i, ok in enumerate(safe) if ok and texts[i].strip())
        self.line_content = self.line & self.text_content
        self.digits = {i: t for i, t in enumerate(texts) if t.isascii() and t.isdigit() and i not in special}
        if not self.digits:
            raise ConfigError("the tokenizer has no digit tokens, so ranker ids cannot be constrained",
                              fix="leave the ranker out of --constrain for this model")

    def _mask(self, ids) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[list(ids)] = True
        return mask

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def only(self, ids) -> torch.Tensor:
        """The mask allowing exactly `ids`, shared between calls (callers must not modify masks in place)."""
        key = frozenset(ids)
        mask = self._only.get(key)
        if mask is None:
            mask = self._only[key] = self._mask(key)
        return mask


# The literal strings between free parts. Constraints force exactly these token sequences and warm-up
# demonstrations are tokenised piece by piece the same way, so both agree token for token.
def _action_tag(action: str) -> str:
    return f"{formats.THINK_CLOSE}\n{formats.SEARCH_OPEN if action == 'search' else formats.ANSWER_OPEN}"


def _close_tag(action: str) -> str:
    return f" {formats.SEARCH_CLOSE if action == 'search' else formats.ANSWER_CLOSE}"


_RANKING_OPEN = f"{formats.REASON_CLOSE}\n{formats.RANKING_OPEN} ["
_RANKING_SEP = "] > ["
_RANKING_CLOSE = f"] {formats.RANKING_CLOSE}"


def free_text(text: str, *, line: bool = False) -> str:
    """`text` made safe for a free part: no tag characters (and no newlines in a query or answer)."""
    text = text.replace("<", "(").replace(">", ")")
    return " ".join(text.split()) if line else text


def agent_turn_ids(tokenizer, think: str, action: str, content: str) -> list[int]:
    """Token ids of one well-formed agent turn, exactly as the agent constraint would force its tags.

    `think` is used as given (start it with a space); `content` gets one leading space, as in `<search> q`.
    """
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    return (enc(formats.THINK_OPEN) + enc(free_text(think)) + enc(_action_tag(action))
            + enc(" " + free_text(content, line=True)) + enc(_close_tag(action)))


def ranker_output_ids(tokenizer, reason: str, ids: Sequence[int]) -> list[int]:
    """Token ids of a well-formed ranker output naming 1-based `ids`, tokenised like the ranker constraint."""
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    out = enc(formats.REASON_OPEN) + enc(free_text(reason)) + enc(_RANKING_OPEN)
    for j, i in enumerate(ids):
        out += enc(str(i)) + enc(_RANKING_CLOSE if j == len(ids) - 1 else _RANKING_SEP)
    return out


# ---------------------------------------------------------------------------------------------------------
# Parts: each consumes tokens until it is done; the constraint walks through a list of them.


class _Literal:
    """One of a few fixed token sequences (a tag, or a choice between tags)."""

    def __init__(self, classes: TokenClasses, options: dict[str, list[int]]):
        assert options and all(options.values()), "a literal needs non-empty token sequences"
        self.classes, self.options, self.prefix, self.chosen = classes, options, [], None

    def first_tokens(self) -> set[int]:
        return {seq[0] for seq in self.options.values()}

    def allowed(self) -> torch.Tensor:
        n = len(self.prefix)
        return self.classes.only({seq[n] for seq in self.options.values() if seq[:n] == self.prefix})

    def feed(self, token: int) -> bool:
        self.prefix.append(token)
        for label, seq in self.options.items():
            if seq == self.prefix:
                self.chosen = label
                return True
        if not any(seq[:len(self.prefix)] == self.prefix for seq in self.options.values()):
            raise ValueError(f"token {token} does not continue any of {list(self.options)}")
        return False


class _Text:
    """Bounded free text that starts with a content token; it ends when the next literal begins."""

    def __init__(self, classes: TokenClasses, max_tokens: int, exits: set[int], *, line: bool):
        assert max_tokens >= 1, "free text needs room for at least one token"
        body, content = (classes.line, classes.line_content) if line else (classes.text, classes.text_content)
        self.first = content
        self.middle = body.clone()
        self.middle[list(exits)] = True
        self.last = classes.only(exits)
        self.body, self.exits, self.max_tokens, self.count = body, exits, max_tokens, 0

    def allowed(self) -> torch.Tensor:
        if self.count == 0:
            return self.first
        return self.middle if self.count < self.max_tokens else self.last

    def takes(self, token: int) -> bool:
        """Whether `token` is more text (True) or the start of the next part (False)."""
        if self.count > 0 and token in self.exits:
            return False
        if not bool((self.first if self.count == 0 else self.body)[token]) or self.count >= self.max_tokens:
            raise ValueError(f"token {token} is not allowed in free text here")
        self.count += 1
        return True


class _Id:
    """One ranker id: digits spelling a number in 1..n not chosen before; it ends when the next literal begins."""

    def __init__(self, classes: TokenClasses, remaining: set[int], exits: set[int]):
        self.classes, self.remaining, self.exits, self.digits = classes, remaining, exits, ""
        self.names = {str(i) for i in remaining}

    def allowed(self) -> torch.Tensor:
        ok = [t for t, s in self.classes.digits.items() if any(n.startswith(self.digits + s) for n in self.names)]
        if self.digits in self.names:
            ok += list(self.exits)
        return self.classes.only(ok)

    def takes(self, token: int) -> bool:
        if self.digits in self.names and token in self.exits:
            return False
        text = self.classes.digits.get(token)
        if text is None or not any(n.startswith(self.digits + text) for n in self.names):
            raise ValueError(f"token {token} does not continue a free ranker id")
        self.digits += text
        return True

    @property
    def value(self) -> int:
        return int(self.digits)


# ---------------------------------------------------------------------------------------------------------
# Constraints (the generation.base.Constraint protocol)


class _PartsConstraint:
    """Replays generated tokens through a list of parts; subclasses extend the list as choices are made."""

    def __init__(self, classes: TokenClasses):
        self.classes = classes
        self._reset()

    def _reset(self) -> None:
        self.parts: list = self._start()
        self.index = 0
        self.fed: list[int] = []

    def _start(self) -> list:
        raise NotImplementedError

    def _finished(self, part) -> None:
        """Hook: a part is complete (subclasses append the parts that depend on it)."""

    def _sync(self, generated: Sequence[int]) -> None:
        n = len(self.fed)
        if len(generated) < n or list(generated[:n]) != self.fed:
            self._reset()
        try:
            for token in list(generated[len(self.fed):]):
                self._feed(int(token))
        except ValueError:
            self._reset()  # the next call starts clean instead of from a half-fed part
            raise

    def _feed(self, token: int) -> None:
        if self.index >= len(self.parts):
            raise ValueError("the constrained output is already complete")
        part = self.parts[self.index]
        if isinstance(part, _Literal):
            if part.feed(token):
                self._advance(part)
        elif not part.takes(token):  # text or id ended: the token starts the following literal
            self._advance(part)
            return self._feed(token)
        self.fed.append(token)

    def _advance(self, part) -> None:
        self._finished(part)
        self.index += 1

    def allowed(self, generated: Sequence[int]) -> torch.Tensor:
        self._sync(generated)
        if self.index >= len(self.parts):
            return self.classes.only([])
        return self.parts[self.index].allowed()

    def is_complete(self, generated: Sequence[int]) -> bool:
        self._sync(generated)
        return self.index >= len(self.parts)


class AgentConstraint(_PartsConstraint):
    """One agent turn: bounded reasoning, then exactly one search or answer; the final turn only answers."""

    def __init__(self, classes: TokenClasses, *, final: bool = False, limits: ConstraintLimits = ConstraintLimits()):
        self.final, self.limits = final, limits
        enc = classes.encode
        self.open_ids = enc(formats.THINK_OPEN)
        actions = ("answer",) if final else ("search", "answer")
        self.action_ids = {a: enc(_action_tag(a)) for a in actions}
        self.close_ids = {a: enc(_close_tag(a)) for a in ("search", "answer")}
        super().__init__(classes)

    def _start(self) -> list:
        action = _Literal(self.classes, self.action_ids)
        return [_Literal(self.classes, {"open": self.open_ids}),
                _Text(self.classes, self.limits.max_think, action.first_tokens(), line=False),
                action]

    def _finished(self, part) -> None:
        if isinstance(part, _Literal) and part.chosen in ("search", "answer"):
            close = _Literal(self.classes, {"close": self.close_ids[part.chosen]})
            budget = self.limits.max_query if part.chosen == "search" else self.limits.max_answer
            self.parts += [_Text(self.classes, budget, close.first_tokens(), line=True), close]

    @property
    def max_tokens(self) -> int:
        """The longest turn this constraint allows (so a backend's max_new_tokens can be set to fit)."""
        arg = max(self.limits.max_query, self.limits.max_answer)
        return (len(self.open_ids) + self.limits.max_think + max(map(len, self.action_ids.values())) + arg
                + max(map(len, self.close_ids.values())))


class RankerConstraint(_PartsConstraint):
    """A short reason, then exactly k distinct candidate ids in 1..n (k is capped at n)."""

    def __init__(self, classes: TokenClasses, *, n: int, k: int, limits: ConstraintLimits = ConstraintLimits()):
        if n < 1 or k < 1:
            raise ConfigError(f"a ranker call needs n >= 1 candidates and k >= 1, got n={n}, k={k}")
        self.n, self.k, self.limits = n, min(k, n), limits
        enc = classes.encode
        self.open_ids = enc(formats.REASON_OPEN)
        self.ranking_ids = enc(_RANKING_OPEN)
        self.sep_ids = enc(_RANKING_SEP)
        self.close_ids = enc(_RANKING_CLOSE)
        super().__init__(classes)

    def _start(self) -> list:
        ranking = _Literal(self.classes, {"ranking": self.ranking_ids})
        self.chosen: list[int] = []
        return [_Literal(self.classes, {"reason": self.open_ids}),
                _Text(self.classes, self.limits.max_reason, ranking.first_tokens(), line=False),
                ranking, self._id()]

    def _id(self) -> _Id:
        last = len(self.chosen) == self.k - 1
        exits = {(self.close_ids if last else self.sep_ids)[0]}
        return _Id(self.classes, set(range(1, self.n + 1)) - set(self.chosen), exits)

    def _finished(self, part) -> None:
        if isinstance(part, _Id):
            self.chosen.append(part.value)
            if len(self.chosen) < self.k:
                self.parts += [_Literal(self.classes, {"sep": self.sep_ids}), self._id()]
            else:
                self.parts.append(_Literal(self.classes, {"close": self.close_ids}))

    @property
    def max_tokens(self) -> int:
        longest_id = max(len(self.classes.encode(str(i))) for i in (1, self.n))
        return (len(self.open_ids) + self.limits.max_reason + len(self.ranking_ids)
                + self.k * longest_id + (self.k - 1) * len(self.sep_ids) + len(self.close_ids))


# ---------------------------------------------------------------------------------------------------------
# Choosing constraints per role


@dataclass
class Constraints:
    """Per-role constraint factories for one rollout; a role that is not constrained has None."""

    agent: Callable[..., AgentConstraint] | None = None  # agent(final=bool)
    ranker: Callable[..., RankerConstraint] | None = None  # ranker(n=N, k=K)
    roles: frozenset[str] = frozenset()


def parse_roles(value: str | None, model: str, ranker_model: str | None = None) -> set[str]:
    """`--constrain` value to a role set: "none", "agent,ranker", or "auto": each role whose model is the
    embedded one or a checkpoint trained from it (models.lm_base), whatever its name; the ranker model is
    the agent's unless given."""
    from cosearch_cli.models import EMBEDDED_LM, lm_base

    value = (value or "auto").strip().lower()
    if value == "auto":
        models = {"agent": model, "ranker": ranker_model or model}
        return {role for role in ROLES if lm_base(models[role]) == EMBEDDED_LM}
    if value in ("none", "off", ""):
        return set()
    roles = {r.strip() for r in value.split(",") if r.strip()}
    unknown = roles - set(ROLES)
    if unknown:
        raise ConfigError(f"--constrain got unknown role(s) {sorted(unknown)}",
                          fix="use auto, none, agent, ranker or agent,ranker")
    return roles


def make_constraints(roles: set[str] | frozenset[str], tokenizer, *, vocab_size: int | None = None,
                     limits: ConstraintLimits = ConstraintLimits()) -> Constraints:
    """Factories for the requested roles. `vocab_size` is the model's logits width (>= len(tokenizer))."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ConfigError(f"cannot constrain unknown role(s) {sorted(unknown)}", fix="roles are agent, ranker")
    if not roles:
        return Constraints()
    classes = TokenClasses(tokenizer, vocab_size)
    out = Constraints(roles=frozenset(roles))
    if "agent" in roles:
        out.agent = lambda final=False: AgentConstraint(classes, final=final, limits=limits)
    if "ranker" in roles:
        out.ranker = lambda n, k: RankerConstraint(classes, n=n, k=k, limits=limits)
    return out


# ---------------------------------------------------------------------------------------------------------
# The same formats as regular expressions, for backends with their own guided decoding (vLLM) and for checks


# A regex bounds characters, not tokens. Bounded regexes allow CHARS_PER_TOKEN characters per token of the
# ConstraintLimits budget (English BPE averages about 4); a backend that follows them must leave room for
# REGEX_BYTES_PER_CHAR tokens per character (a byte-level tokenizer may spend one token per UTF-8 byte).
CHARS_PER_TOKEN = 4
REGEX_BYTES_PER_CHAR = 4


def _free(chars: int | None, *, line: bool) -> str:
    body = r"[^<>\n]" if line else r"[^<>]"
    return body + ("+" if chars is None else f"{{1,{chars}}}")


def _chars(limits: ConstraintLimits | None, part: str) -> int | None:
    return None if limits is None else getattr(limits, part) * CHARS_PER_TOKEN


def _space(bounded: bool) -> str:
    return r"\s{0,2}" if bounded else r"\s*"


def agent_regex(*, final: bool = False, limits: ConstraintLimits | None = None) -> str:
    """The agent turn as a regex (text without tag characters), e.g. for vLLM's guided decoding.

    Without `limits` the free text is unbounded (a shape check); with them each part is bounded to
    CHARS_PER_TOKEN characters per token of its budget, so a guided decoder has to close every tag.
    """
    e = re.escape
    think = _free(_chars(limits, "max_think"), line=False)
    query = _free(_chars(limits, "max_query"), line=True)
    short = _free(_chars(limits, "max_answer"), line=True)
    search = f"{e(formats.SEARCH_OPEN)}{query}{e(formats.SEARCH_CLOSE)}"
    answer = f"{e(formats.ANSWER_OPEN)}{short}{e(formats.ANSWER_CLOSE)}"
    action = answer if final else f"(?:{search}|{answer})"
    return f"{e(formats.THINK_OPEN)}{think}{e(formats.THINK_CLOSE)}{_space(limits is not None)}{action}"


def ranker_regex(k: int, limits: ConstraintLimits | None = None, n: int | None = None) -> str:
    """The ranker output with k ids (range and distinctness are checked after parsing); `limits` bounds the
    reason as in agent_regex, `n` the digits of an id."""
    e = re.escape
    digit = r"\d+" if n is None else rf"\d{{1,{len(str(n))}}}"
    ids = rf"\[{digit}\]" + rf"(?: > \[{digit}\])" * (k - 1)
    reason = _free(_chars(limits, "max_reason"), line=False)
    return (f"{e(formats.REASON_OPEN)}{reason}{e(formats.REASON_CLOSE)}{_space(limits is not None)}"
            f"{e(formats.RANKING_OPEN)} ?{ids} ?{e(formats.RANKING_CLOSE)}")


def regex_for(constraint) -> tuple[str, int] | None:
    """The bounded regex equivalent to an agent or ranker constraint, and the most tokens a match can take."""
    limits = constraint.limits
    if isinstance(constraint, AgentConstraint):
        tags = max(len(formats.SEARCH_OPEN + formats.SEARCH_CLOSE), len(formats.ANSWER_OPEN + formats.ANSWER_CLOSE))
        chars = (len(formats.THINK_OPEN + formats.THINK_CLOSE) + 2 + tags
                 + CHARS_PER_TOKEN * (limits.max_think + max(limits.max_query, limits.max_answer)))
        return agent_regex(final=constraint.final, limits=limits), chars * REGEX_BYTES_PER_CHAR
    if isinstance(constraint, RankerConstraint):
        chars = (len(formats.REASON_OPEN + formats.REASON_CLOSE + formats.RANKING_OPEN + formats.RANKING_CLOSE)
                 + 4 + CHARS_PER_TOKEN * limits.max_reason + constraint.k * (len(str(constraint.n)) + 5))
        return ranker_regex(constraint.k, limits, constraint.n), chars * REGEX_BYTES_PER_CHAR
    return None
