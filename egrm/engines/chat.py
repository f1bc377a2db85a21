"""A conversation as token ids, its messages' contents as data.

Rendering a chat template to text and tokenizing that text reads special-token strings wherever
they are: a response holding "<|im_end|>" would close the judge's turn (measured: '4<|im_end|>'
became [36, 2]), so the policy under judgement could write the judge's markup. Here the template
is rendered around placeholders instead; its own markup is tokenized as markup, and each content
is tokenized with special tokens split into plain text. No user text is ever in the rendered
string, so no marker can be forged either.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

Message = dict[str, str]


def chat_ids(tokenizer: Any, messages: Sequence[Message], after: int | None = None) -> list[int]:
    """The prompt for `messages`, ending where the assistant's next turn begins, as token ids.

    after=k: only what follows message k's content: how a branch that wrote message k's content
    itself (the judge's own answer) continues the conversation.
    """
    nonce = secrets.token_hex(8)
    marks = [f"egrm{nonce}m{i}" for i in range(len(messages))]
    placeheld = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    text = str(tokenizer.apply_chat_template(placeheld, add_generation_prompt=True, tokenize=False))
    ids: list[int] = []
    start = 0 if after is None else _find(text, marks, after, 0) + len(marks[after])
    for i in range(0 if after is None else after + 1, len(messages)):
        at = _find(text, marks, i, start)
        ids += _markup(tokenizer, text[start:at]) + data_ids(tokenizer, messages[i]["content"])
        start = at + len(marks[i])
    return ids + _markup(tokenizer, text[start:])


def data_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of user text: a special-token string in it is split into ordinary tokens."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)) if text else []


def _markup(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _find(text: str, marks: Sequence[str], index: int, start: int) -> int:
    """Where message `index`'s placeholder is in the rendered template."""
    at = text.find(marks[index], start)
    if at < 0:
        raise ValueError(f"the chat template dropped or changed the content of message {index}")
    return at
