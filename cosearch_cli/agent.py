"""The search agent's side of a rollout: its prompt, the observations shown to it, and parsing its turns.

The whole trajectory is one assistant message that the rollout extends token by token: the agent writes a
turn ending in `</search>` or `</answer>`, the rollout appends an `<information>` block (never generated,
so masked out of the loss) and the agent continues. Concatenating token ids, never re-tokenising text,
keeps the recorded sequence exactly what the model saw.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cosearch_cli.formats import (ANSWER_CLOSE, ANSWER_OPEN, INFO_CLOSE, INFO_OPEN, SEARCH_CLOSE, SEARCH_OPEN,
                                  THINK_CLOSE, THINK_OPEN)
from cosearch_cli.records import Passage

DEFAULT_INSTRUCTION = (
    "Answer the question using a search engine. First reason briefly between {think_open} and {think_close}. "
    "If you need facts, write one search query between {search_open} and {search_close}; the top results "
    "will then appear between {info_open} and {info_close}. You may search up to {max_turns} times. When you "
    "know the answer, write only the short answer between {answer_open} and {answer_close}, for example "
    "{answer_open} Paris {answer_close}.\n\nQuestion: {question}"
)
DEFAULT_FINAL_NOTICE = "No searches are left. Write your final answer now between {answer_open} and {answer_close}."

_TAGS = dict(think_open=THINK_OPEN, think_close=THINK_CLOSE, search_open=SEARCH_OPEN, search_close=SEARCH_CLOSE,
             info_open=INFO_OPEN, info_close=INFO_CLOSE, answer_open=ANSWER_OPEN, answer_close=ANSWER_CLOSE)


@dataclass
class AgentTemplate:
    """What the agent is told. `instruction` may use {question}, {max_turns} and the tag names of _TAGS."""

    instruction: str = DEFAULT_INSTRUCTION
    final_notice: str = DEFAULT_FINAL_NOTICE  # appended to the last observation: the next turn must answer
    system: str | None = None  # a system message, for chat templates that want one


def prompt_ids(tokenizer, question: str, max_turns: int, template: AgentTemplate | None = None) -> list[int]:
    """The agent's prompt: the chat template's user turn plus the opening of the assistant turn."""
    template = template or AgentTemplate()
    return chat_prompt_ids(tokenizer, render_instruction(template, question, max_turns), system=template.system)


def render_instruction(template: AgentTemplate, question: str, max_turns: int) -> str:
    return template.instruction.format(question=question, max_turns=max_turns, **_TAGS)


def chat_prompt_ids(tokenizer, user: str, *, system: str | None = None) -> list[int]:
    """Token ids of a one-message chat ready for the assistant's reply (plain text if no chat template)."""
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    text = (f"{system}\n\n" if system else "") + f"{user}\n\nResponse:"
    return tokenizer.encode(text, add_special_tokens=True)


def truncate_to_tokens(tokenizer, texts: Sequence[str], budget: int) -> list[str]:
    """Each text cut to at most `budget` tokens of `tokenizer` (cut at a token boundary, marked by ...)."""
    if not texts:
        return []
    out = []
    for text, ids in zip(texts, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        out.append(text if len(ids) <= budget else tokenizer.decode(ids[:budget]).rstrip() + " ...")
    return out


def observation_text(tokenizer, passages: Sequence[Passage], passage_tokens: int, *, last: bool,
                     template: AgentTemplate | None = None) -> str:
    """The `<information>` block shown after a search; on the last search it also says to answer now."""
    template = template or AgentTemplate()
    texts = truncate_to_tokens(tokenizer, [p.text for p in passages], passage_tokens)
    lines = [f"[{i}] {p.title}: {text}" for i, (p, text) in enumerate(zip(passages, texts), start=1)]
    body = "\n".join(lines) if lines else "(no results)"
    block = f"\n\n{INFO_OPEN}\n{body}\n{INFO_CLOSE}\n\n"
    if last:
        block += template.final_notice.format(**_TAGS) + "\n\n"
    return block


@dataclass
class ParsedTurn:
    action: str  # "search" | "answer" | "invalid"
    content: str | None = None  # the query or the answer
    error: str | None = None


_CLOSE = re.compile(f"{re.escape(SEARCH_CLOSE)}|{re.escape(ANSWER_CLOSE)}")


def parse_turn(text: str) -> ParsedTurn:
    """The action of one generated turn: the first closing tag decides, its content must be non-empty.

    Only the turn's own text is read (never the prompt or observations), so a prompt's example answer
    cannot count as the agent's answer.
    """
    close = _CLOSE.search(text)
    if close is None:
        return ParsedTurn("invalid", error=f"no {SEARCH_OPEN} or {ANSWER_OPEN} action in the turn")
    action, opening = ("search", SEARCH_OPEN) if close.group() == SEARCH_CLOSE else ("answer", ANSWER_OPEN)
    start = text.rfind(opening, 0, close.start())
    if start < 0:
        return ParsedTurn("invalid", error=f"{close.group()} without {opening}")
    content = text[start + len(opening):close.start()].strip()
    if not content:
        return ParsedTurn("invalid", error=f"empty {action}")
    return ParsedTurn(action, content)
