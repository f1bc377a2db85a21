"""Chat-formatted text read back into its question and response (egrm/chat_text.py)."""

from __future__ import annotations

import pytest

from egrm.chat_text import Turn, plain_prompt, split_query, turns_of, without_end_markers

QUESTION, ANSWER = "What is 2+2?", "The answer is 4."
# (prompt as the policy's template renders it, what its decode leaves after the response)
TEMPLATES = {
    "chatml": (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n<|endoftext|>",
    ),
    "llama-3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{q}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|><|end_of_text|>",
    ),
    "gemma": ("<bos><start_of_turn>user\n{q}<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>\n<eos>"),
    "phi-3": ("<|system|>\nYou are helpful.<|end|>\n<|user|>\n{q}<|end|>\n<|assistant|>\n", "<|end|><|endoftext|>"),
    "deepseek": ("<｜begin▁of▁sentence｜>You are helpful.<｜User｜>{q}<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
    "mistral": ("<s>[INST] {q} [/INST]", "</s>"),
}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_each_known_format_gives_back_the_question_and_the_response(name):
    template, eos = TEMPLATES[name]
    prompt = template.format(q=QUESTION)
    query = prompt + ANSWER + eos
    assert plain_prompt(prompt) == QUESTION
    for given in (prompt, None):  # with OpenRLHF's prompts, and the query alone
        split = split_query(query, given)
        assert (split.prompt, split.response) == (QUESTION, ANSWER), (name, given, split)


def test_a_query_that_lost_its_head_still_splits():
    prompt = TEMPLATES["chatml"][0].format(q=QUESTION)
    split = split_query((prompt + ANSWER)[25:], prompt)
    assert (split.prompt, split.response, split.how) == (QUESTION, ANSWER, "chat")
    plain = "Solve this carefully and show no work. Question: what is 5+5? Answer:"
    split = split_query(plain[30:] + " 10", plain)
    assert (split.prompt, split.response, split.how) == (plain, " 10", "prompt-tail")
    split = split_query("What is 5+5?  10", "What is 5+5?\u00a0")  # a space normalised by decoding
    assert (split.response, split.how) == ("  10", "common-prefix")


def test_earlier_turns_stay_as_a_transcript_and_system_turns_are_dropped():
    text = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nI have 3 apples.<|im_end|>\n"
        "<|im_start|>assistant\nOK.<|im_end|>\n<|im_start|>user\nI buy 2 more. How many now?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert turns_of(text)[0] == Turn("system", "Be brief.")
    assert plain_prompt(text) == "user: I have 3 apples.\n\nassistant: OK.\n\nuser: I buy 2 more. How many now?"


def test_text_in_no_known_format_is_left_as_it_is():
    for text in ("What is 2+2?", "Tell me about <|im_start|> tokens.", "[INST is a word here"):
        assert plain_prompt(text) == text
    assert split_query("4", None).prompt == "" and split_query("4", None).response == "4"
    assert split_query("What is 2+2? 4", "What is 2+2?").response == " 4"


def test_end_markers_go_only_from_the_end():
    assert without_end_markers("4<|im_end|>\n<|endoftext|><pad><pad>") == "4"
    assert without_end_markers("a<|im_end|>b") == "a<|im_end|>b"
