"""The tokenizer of a remotely served model, loaded locally.

The pipeline renders, tokenizes and counts prompts itself (prompt-token limits must be exact
and cheap), so a remote engine keeps the served model's tokenizer in process and sends token
ids, never text the runtime would tokenize again (a second BOS, or a special-token string in
user text read as the special token: see egrm/engines/chat.py).
Only the tokenizer and config files of the model folder are read: no weights, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from egrm.engines.base import BranchParams, ContextLengthError
from egrm.engines.chat import chat_ids


@dataclass(frozen=True, slots=True)
class LocalTokenizer:
    tokenizer: PreTrainedTokenizerBase
    name: str  # the model folder's name: the model id until the backend names its own
    context_length: int | None  # from the model config; None: the backend alone checks
    eos_ids: frozenset[int]

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The rendered prompt as text (for reading; what is sent is encode_chat's ids)."""
        return str(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False))

    def encode_chat(self, messages: Sequence[dict[str, str]], after: int | None = None) -> list[int]:
        return chat_ids(self.tokenizer, messages, after)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def check_context(self, used: int, branches: Sequence[BranchParams]) -> None:
        """Refuse locally what the backend would refuse (same message as the embedded engine)."""
        need = used + max(b.max_new_tokens for b in branches)
        if self.context_length is not None and need > self.context_length:
            raise ContextLengthError(
                f"prompt of {used} tokens plus {need - used} new tokens exceeds the model's "
                f"context of {self.context_length} tokens"
            )

    def own_tokens(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[list[int], list[float]]:
        """A stopped branch's tokens and log-probs as the embedded engine counts them: the EOS that
        ended it is not one of its tokens (vLLM and SGLang return it; its log-prob, the chance of
        stopping there, is not part of the answer's probability)."""
        own, values = list(ids), list(logprobs)
        if own and own[-1] in self.eos_ids:
            if len(values) == len(own):
                values.pop()
            own.pop()
        return own, values

    def without_eos(self, ids: Sequence[int]) -> list[int]:
        """A branch's tokens to continue from: a final EOS would end the turn mid-context."""
        out = list(ids)
        while out and out[-1] in self.eos_ids:
            out.pop()
        return out


@lru_cache(maxsize=4)
def load_tokenizer(path: str | Path, chat_template: str | None = None) -> LocalTokenizer:
    """Cached: apps in one process (tests, a reloading server) share one tokenizer per folder.
    chat_template: replaces the model's own (EGRM_CHAT_TEMPLATE)."""
    path = Path(path).expanduser()
    kwargs = {}
    folder = path
    if path.suffix == ".gguf":
        folder, kwargs = path.parent, {"gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
    except (OSError, ValueError):  # a tokenizer-only folder: the backend checks the context
        config = None
    context = getattr(config, "max_position_embeddings", None)
    eos: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        if isinstance(source, int):
            eos.add(source)
        elif source:
            eos.update(source)
    name = path.stem if path.suffix else path.name
    return LocalTokenizer(tokenizer, name, int(context) if context else None, frozenset(eos))
