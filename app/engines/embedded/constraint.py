"""Constrained choice: a token trie over the allowed answers, so a sample is always parseable."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase


@dataclass(slots=True)
class TrieNode:
    children: dict[int, TrieNode] = field(default_factory=dict)
    terminal: bool = False  # a complete allowed answer ends here

    @property
    def is_leaf(self) -> bool:
        return not self.children


def build_trie(tokenizer: PreTrainedTokenizerBase, answers: Iterable[str]) -> TrieNode:
    """Index every allowed answer, bare and with a leading space (its form after a word)."""
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
