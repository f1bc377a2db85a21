"""Constrained choice: a token trie over the allowed answers, so a sample is always parseable."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from transformers import PreTrainedTokenizerBase


@dataclass(slots=True)
class TrieNode:
    children: dict[int, TrieNode] = field(default_factory=dict)
    terminal: bool = False  # a complete allowed answer ends here

    @property
    def is_leaf(self) -> bool:
        return not self.children


@lru_cache(maxsize=128)
def build_trie(tokenizer: PreTrainedTokenizerBase, answers: tuple[str, ...]) -> TrieNode:
    """Index every allowed answer, bare and with a leading space (its form after a word).

    Cached: the same few answer sets come with every request, and the trie is never mutated.
    """
    root = TrieNode()
    for answer in answers:
        answer = answer.strip()
        if not answer:
            continue
        for form in (answer, " " + answer):
            node = root
            for token in tokenizer.encode(form, add_special_tokens=False):
                node = node.children.setdefault(token, TrieNode())
            node.terminal = True
    return root
