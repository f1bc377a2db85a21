"""The llama.cpp backend's pieces that need no server: which branches make one n_cmpl call, and the
token grammar that constrains an answer to the embedded engine's trie."""

from __future__ import annotations

from egrm.engines.base import BranchParams
from egrm.engines.embedded.constraint import build_trie
from egrm.engines.llamacpp import gbnf_choice, one_call
from egrm.pipeline.question import short_answer_params
from egrm.pipeline.types import JudgeOptions, PathMode


def test_equal_branches_with_counting_seeds_are_one_call():
    assert one_call([BranchParams(seed=7 + i) for i in range(5)]) == BranchParams(seed=7)
    assert one_call([BranchParams()] * 3) == BranchParams()
    assert one_call([BranchParams(seed=7), BranchParams(seed=9)]) is None  # the server's children count by one
    assert one_call([BranchParams(seed=7), BranchParams()]) is None


def test_the_temperature_ladder_is_one_call_per_branch():
    options = JudgeOptions(
        temperatures=[0.6, 0.7, 0.8, 0.9, 1.0], top_p=0.95, tau=0.8, path=PathMode.AUTO, template="verdict", seed=1
    )
    assert one_call(short_answer_params(options)) is None


def test_the_grammar_spells_the_tries_token_paths(tok):
    trie = build_trie(tok.tokenizer, ("Yes", "No"))
    grammar = gbnf_choice(trie)
    paths = {tuple(tok.encode(form)) for form in ("Yes", " Yes", "No", " No")}
    assert grammar.startswith("root ::= (") and grammar.count("<[") == sum(len(p) for p in paths)
    for path in paths:
        assert f"<[{path[0]}]>" in grammar
    # "1" is an answer and a prefix of "10": after its token the rest is optional.
    assert tok.encode("10")[:1] == tok.encode("1")  # this tokenizer spells numbers digit by digit
    assert gbnf_choice(build_trie(tok.tokenizer, ("1", "10"))).count(")?") == 2  # bare and after a space
