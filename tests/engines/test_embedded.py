"""The embedded any_engine on the real default model (fp32, so batch sizes agree token for token)."""

import asyncio

import pytest
import torch

from egrm.engines.base import BranchParams, ContextLengthError, FinishReason
from egrm.engines.embedded.engine import EmbeddedEngine

pytestmark = pytest.mark.slow

# A prompt the tuned judge still answers at length (it answers a short question in a word, then stops).
QUESTION = [{"role": "user", "content": "Write a short story about a cat who learns to fly."}]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def prefix(any_engine: EmbeddedEngine) -> list[int]:
    return any_engine.encode_chat(QUESTION)


def test_greedy_branches_equal_one_greedy_sample_and_hf_generate(any_engine, prefix):
    greedy = BranchParams(temperature=0, max_new_tokens=24)
    one = run(any_engine.sample(prefix, [greedy]))[0]
    many = run(any_engine.sample(prefix, [greedy] * 5))
    assert all(b.token_ids == one.token_ids for b in many)
    # An independent reference: transformers' own greedy generate on the same weights.
    ids = torch.tensor([prefix])
    model = any_engine.core.model.model
    out = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=min(any_engine.core.model.eos_ids))
    expected = [t for t in out[0, ids.shape[1] :].tolist() if t not in any_engine.core.model.eos_ids]
    assert one.token_ids == expected[: len(one.token_ids)] and len(one.token_ids) == len(expected)


def test_temperature_zero_is_deterministic_while_hot_branches_vary(any_engine, prefix):
    params = [BranchParams(temperature=0, max_new_tokens=16)] + [
        BranchParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=s) for s in range(4)
    ]
    first, second = run(any_engine.sample(prefix, params)), run(any_engine.sample(prefix, params))
    assert first[0].token_ids == second[0].token_ids
    assert len({tuple(b.token_ids) for b in first[1:]}) > 1  # four seeds, four draws: not all alike


def test_seeds_reproduce_and_differ(any_engine, prefix):
    hot = [BranchParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=7)] * 2
    a, b = run(any_engine.sample(prefix, hot))
    assert a.token_ids == b.token_ids  # same seed, same draw, whatever the row
    unseeded = [BranchParams(temperature=1.2, max_new_tokens=16)] * 4
    assert len({tuple(x.token_ids) for x in run(any_engine.sample(prefix, unseeded))}) > 1


@pytest.mark.parametrize("allowed", [("Yes", "No"), tuple(str(i) for i in range(1, 11)), ("A", "B")])
def test_constrained_choice_always_yields_an_allowed_answer(any_engine, prefix, allowed):
    params = [BranchParams(temperature=2.0, top_p=1.0, max_new_tokens=4, allowed=allowed, seed=s) for s in range(12)]
    branches = run(any_engine.sample(prefix, params))
    assert all(b.text.strip() in allowed for b in branches)
    assert all(b.finish_reason is FinishReason.STOP for b in branches)


def _model_logprobs(engine: EmbeddedEngine, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    """log-softmax of transformers' own forward at each new token's position: (len(tokens), V)."""
    ids = list(prefix)
    with torch.no_grad():
        logits = engine.core.model.model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1]
    return logits.float().log_softmax(-1)


def test_logprobs_are_the_models_and_within_the_allowed_answers_when_constrained(any_engine, prefix):
    free, choice = run(
        any_engine.sample(
            prefix, [BranchParams(temperature=0, max_new_tokens=6), BranchParams(temperature=0, allowed=("A", "B"))]
        )
    )
    reference = _model_logprobs(any_engine, prefix, free.token_ids)
    expected = reference.gather(1, torch.tensor(free.token_ids)[:, None]).squeeze(1)
    assert free.logprobs == pytest.approx(expected.tolist(), abs=1e-3)
    # Constrained: normalised over the allowed first tokens, so the greedy choice of two has p >= 0.5.
    (row,) = _model_logprobs(any_engine, prefix, choice.token_ids)
    allowed = sorted({t for a in ("A", "B", " A", " B") for t in any_engine.encode(a)[:1]})
    assert choice.logprobs[0] == pytest.approx(float(row[choice.token_ids[0]] - row[allowed].logsumexp(0)), abs=1e-3)
    assert choice.logprobs[0] >= torch.log(torch.tensor(1 / len(allowed))).item()


def test_token_accounting_is_exact(any_engine, prefix):
    n_prefix = len(prefix)
    branches = run(
        any_engine.sample(prefix, [BranchParams(temperature=0.8, max_new_tokens=6, seed=i) for i in range(3)])
    )
    assert [b.prompt_tokens for b in branches] == [n_prefix] * 3
    # One prefill: the first branch computed the prefix (less the whole blocks of it other calls
    # left in the prefix cache; its last token always), the others reused its KV.
    first = branches[0].cached_prompt_tokens
    assert first < n_prefix and first % 16 == 0
    assert [b.cached_prompt_tokens for b in branches[1:]] == [n_prefix, n_prefix]
    for b in branches:
        assert b.completion_tokens == len(b.token_ids) == len(b.logprobs) <= 6
        assert all(lp <= 0 for lp in b.logprobs)


def test_length_and_stop(any_engine, prefix):
    long, stopped = run(
        any_engine.sample(
            prefix,
            [
                BranchParams(temperature=0, max_new_tokens=5),
                BranchParams(temperature=0, max_new_tokens=40, stop=(" ",)),
            ],
        )
    )
    assert long.finish_reason is FinishReason.LENGTH and long.completion_tokens == 5
    assert stopped.finish_reason is FinishReason.STOP and " " not in stopped.text


def test_continuation_equals_a_fresh_prefill_of_the_whole_text(any_engine, prefix):
    """Branches of different lengths continue from their own caches, exactly as if re-prefilled."""
    short = BranchParams(temperature=0, max_new_tokens=3)
    longer = BranchParams(temperature=0, max_new_tokens=9)
    branches = run(any_engine.sample(prefix, [short, longer]))
    more = BranchParams(temperature=0, max_new_tokens=10)
    continued = run(any_engine.continue_branches([b.handle for b in branches], " In short,", [more, more]))
    prefix_ids, appended = list(prefix), any_engine.encode(" In short,")
    for b, c in zip(branches, continued, strict=True):
        fresh = run(any_engine.sample(prefix_ids + b.token_ids + appended, [more]))[0]
        assert c.token_ids == fresh.token_ids
        assert c.prompt_tokens == len(prefix_ids) + b.completion_tokens + len(appended)
        # A branch cut at its length has its last token not yet fed; one that sampled EOS fed all of its own.
        unfed = 1 if b.finish_reason is FinishReason.LENGTH else 0
        assert c.cached_prompt_tokens == len(prefix_ids) + b.completion_tokens - unfed


def test_continuing_a_subset_leaves_the_other_branches_intact(any_engine, prefix):
    greedy = BranchParams(temperature=0, max_new_tokens=4)
    a, b = run(any_engine.sample(prefix, [greedy, greedy]))
    step = BranchParams(temperature=0, max_new_tokens=6)
    (b1,) = run(any_engine.continue_branches([b.handle], " Also", [step]))
    (a1,) = run(any_engine.continue_branches([a.handle], " Also", [step]))
    assert a1.token_ids == b1.token_ids  # a's cache was untouched while b advanced


def test_a_branch_continued_many_times_stays_as_it_was(any_engine, prefix):
    """Continuing starts a new branch from the handle's point: two calls at once, and a third
    after them, each continue the same branch from its own KV (a follow-up per response)."""
    (b,) = run(any_engine.sample(prefix, [BranchParams(temperature=0, max_new_tokens=4)]))
    step = BranchParams(temperature=0, max_new_tokens=6)

    async def twice():
        return await asyncio.gather(*(any_engine.continue_branches([b.handle], " Also", [step]) for _ in range(2)))

    (x,), (y,) = run(twice())
    (z,) = run(any_engine.continue_branches([b.handle], " Also", [step]))
    fresh = run(any_engine.sample(list(prefix) + b.token_ids + any_engine.encode(" Also"), [step]))[0]
    assert x.token_ids == y.token_ids == z.token_ids == fresh.token_ids
    unfed = 1 if b.finish_reason is FinishReason.LENGTH else 0
    assert x.cached_prompt_tokens == z.cached_prompt_tokens == len(prefix) + b.completion_tokens - unfed


def test_bad_input_is_rejected(any_engine, prefix):
    with pytest.raises(ContextLengthError):
        run(any_engine.sample(prefix, [BranchParams(max_new_tokens=any_engine.core.model.context_length)]))
    with pytest.raises(ValueError, match="empty"):
        run(any_engine.sample("", [BranchParams()]))
    with pytest.raises(ValueError, match="branches"):
        run(any_engine.sample(prefix, []))
    (b,) = run(any_engine.sample(prefix, [BranchParams(max_new_tokens=2)]))
    with pytest.raises(ValueError, match="empty"):
        run(any_engine.continue_branches([b.handle], "", [BranchParams()]))
    with pytest.raises(ValueError, match="once"):
        run(any_engine.continue_branches([b.handle, b.handle], "x", [BranchParams()] * 2))
    with pytest.raises(ValueError, match="temperature"):
        BranchParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        BranchParams(top_p=0)


def test_auto_dtype_is_bfloat16_only_where_the_cpu_has_it():

    from egrm.engines.embedded.loader import resolve_dtype

    flags = set(open("/proc/cpuinfo").read().split())  # the kernel's word on the CPU
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert resolve_dtype("auto") == ("bfloat16" if native else "float32")
    assert resolve_dtype("bfloat16") == "bfloat16" and resolve_dtype("float32") == "float32"
