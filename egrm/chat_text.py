"""The policy's chat template is not the question: recover the turns from chat-formatted text.

RLHF trainers send what the policy saw and wrote, decoded with the policy's chat template
(OpenRLHF's `prompts` are `<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`, its
queries end with the policy's EOS). Shown that markup, the judge reads a transcript instead of a
question (measured: right answers scored 0 of 10 ChatML-wrapped against 4 of 10 plain). So text
in a known chat format is read back into turns; the question is the last user turn (earlier turns
kept as a `role: text` transcript, as the OpenAI route does), the response the last assistant
turn. Text in no known format is left as it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

# What a policy's tokenizer leaves at the end of a decoded query (its end of turn, EOS, padding),
# across the chat formats in use: not part of the response.
END_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "<|eos|>",
    "<pad>",
    "[PAD]",
    "<|pad|>",
    "<|finetune_right_pad_id|>",
    "<｜end▁of▁sentence｜>",
)
_BEGIN_MARKERS = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "<｜begin▁of▁sentence｜>")


@dataclass(frozen=True, slots=True)
class ChatFormat:
    name: str
    header: re.Pattern[str]  # one turn's opening; group "role"
    roles: dict[str, str]  # the format's role names -> user / assistant / system
    system_first: bool = False  # text before the first header is the system prompt (DeepSeek)


_ROLES = {"user": "user", "assistant": "assistant", "system": "system"}
FORMATS = (
    ChatFormat("chatml", re.compile(r"<\|im_start\|>(?P<role>\w+)\n"), _ROLES),
    ChatFormat("llama-3", re.compile(r"<\|start_header_id\|>(?P<role>\w+)<\|end_header_id\|>\n\n"), _ROLES),
    ChatFormat("gemma", re.compile(r"<start_of_turn>(?P<role>\w+)\n"), {**_ROLES, "model": "assistant"}),
    ChatFormat("phi-3", re.compile(r"<\|(?P<role>user|assistant|system)\|>\n"), _ROLES),
    ChatFormat(
        "deepseek",
        re.compile(r"<｜(?P<role>User|Assistant)｜>"),
        {"User": "user", "Assistant": "assistant"},
        system_first=True,
    ),
    ChatFormat("mistral", re.compile(r"\[(?P<role>INST|/INST)\]\s*"), {"INST": "user", "/INST": "assistant"}),
)


@dataclass(frozen=True, slots=True)
class Turn:
    role: str  # user, assistant, system
    text: str


def without_end_markers(text: str) -> str:
    """The text less the end-of-turn, end-of-sequence and padding markers after it."""
    stripped = text.rstrip()
    while marker := next((m for m in END_MARKERS if stripped.endswith(m)), None):
        stripped = stripped.removesuffix(marker).rstrip()
    return stripped


def turns_of(text: str) -> list[Turn] | None:
    """The turns of text in a known chat format (None if it is in none): the first format whose
    turn header opens the text (after a begin-of-sequence marker and any leading whitespace; for
    DeepSeek, after its system prompt)."""
    body = text.lstrip()
    for begin in _BEGIN_MARKERS:
        body = body.removeprefix(begin).lstrip()
    for fmt in FORMATS:
        headers = list(fmt.header.finditer(body))
        if not headers or (headers[0].start() != 0 and not fmt.system_first):
            continue
        if any(h["role"] not in fmt.roles for h in headers):
            continue
        ends = [h.start() for h in headers[1:]] + [len(body)]
        system = [Turn("system", body[: headers[0].start()].strip())] if headers[0].start() else []
        return system + [
            Turn(fmt.roles[h["role"]], without_end_markers(body[h.end() : end]))
            for h, end in zip(headers, ends, strict=True)
        ]
    return None


def transcript(history: Sequence[Turn], question: str) -> str:
    """The prompt to judge: the question, after the earlier turns (if any) as `role: text` lines
    (context the response may depend on)."""
    if not history:
        return question
    return "\n\n".join([*(f"{t.role}: {t.text}" for t in history), f"user: {question}"])


def question_of(turns: list[Turn]) -> str:
    """The prompt to judge: the last user turn, after the earlier turns as a transcript (system
    turns are the policy's instructions, not the question)."""
    talk = [t for t in turns if t.role != "system" and (t.text or t.role == "user")]
    last_user = max((i for i, t in enumerate(talk) if t.role == "user"), default=None)
    if last_user is None:
        return ""
    return transcript(talk[:last_user], talk[last_user].text)


def plain_prompt(prompt: str) -> str:
    """A prompt in a known chat format as its question; any other prompt as it is."""
    turns = turns_of(prompt)
    return question_of(turns) if turns else prompt


@dataclass(frozen=True, slots=True)
class Split:
    prompt: str  # the question, out of the policy's chat markup
    response: str  # what the policy wrote, less its end markers
    how: str  # "prefix", "chat", "prompt-tail", "common-prefix" or "none": how the response was found


def split_query(query: str, prompt: str | None) -> Split:
    """(question, response) of an RLHF query (prompt + response, as the policy's tokenizer decoded
    them), given its prompt or not.

    The response is what follows the prompt; when the query does not start with the prompt (the
    trainer truncated it on the left, or decoding cleaned up spaces), the text after the last
    assistant turn header in chat-formatted queries, else what follows the prompt's tail where the
    query holds it, else what follows the longest common prefix.
    Without a prompt, a chat-formatted query is read as turns; any other query is the response to
    an empty prompt.
    """
    if prompt is not None and query.startswith(prompt):  # the common case: no markup to search
        response, how = query[len(prompt) :], "prefix"
    elif (after_header := _after_last_assistant_header(query)) is not None:
        response, how = after_header, "chat"
    elif prompt is not None and (overlap := _after_prompt_tail(query, prompt)) is not None:
        response, how = overlap, "prompt-tail"
    elif prompt is not None:
        response, how = query[len(os.path.commonprefix([query, prompt])) :], "common-prefix"
    else:
        return Split("", without_end_markers(query), "none")
    # A given prompt is whole (a query may have lost its head); without one, the query's own turns.
    if prompt is not None:
        question = plain_prompt(prompt)
    else:
        turns = turns_of(query)
        question = question_of(turns[:-1] if turns else [])
    return Split(question, without_end_markers(response), how)


def _after_last_assistant_header(text: str) -> str | None:
    """What follows the last assistant turn header of any known format, if that turn is the last."""
    for fmt in FORMATS:
        headers = [h for h in fmt.header.finditer(text) if h["role"] in fmt.roles]
        if headers and fmt.roles[headers[-1]["role"]] == "assistant":
            return text[headers[-1].end() :]
    return None


_TAIL = 64  # characters of the prompt's end to look for: enough to be unique in a query


def _after_prompt_tail(query: str, prompt: str) -> str | None:
    """A query that lost the head of its prompt (left truncation) still holds the prompt's tail."""
    tail = prompt[-min(_TAIL, max(1, len(prompt) // 2)) :]
    at = query.find(tail)
    if at < 0 or not prompt.endswith(query[: at + len(tail)]):
        return None
    return query[at + len(tail) :]
