"""LoRA fine-tuning of the default model as a judge (`egrm train-grm`).

Plain PyTorch over peft: sequences bucketed by length into batches, loss only where a label is
set (the lm head runs on those positions alone: most positions are prompt), AdamW with warm-up
and linear decay. The schedule fits a time budget: after a few steps the run measures its own
speed and shortens the plan if a full pass would overrun, so the decay still ends at the end.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from egrm.engines.chat import chat_ids
from egrm.engines.embedded.loader import resolve_dtype
from egrm.evals.data import LabelledItem, builtin_arith
from egrm.training.judge_examples import IGNORE, Example, Mix, example

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAINING_META = "training.json"


@dataclass(frozen=True, slots=True)
class GrmTrainConfig:
    rank: int = 16
    alpha: int = 32
    lr: float = 4e-4
    batch_size: int = 16
    epochs: float = 1.0
    budget_s: float = 1800.0  # wall-clock budget of the optimisation loop
    mix: Mix = Mix()  # shares of the short shape and of wrong own answers (see examples.py)
    warmup_steps: int = 10
    seed: int = 0
    limit: int | None = None  # at most this many training items (smoke runs)
    threads: int = 0
    init: str | None = None  # an adapter folder to continue training (its rank and alpha are kept)


def training_items(mixed_share: float, rng: random.Random) -> list[LabelledItem]:
    """The two train splits, drawn item by item in the given proportion (3,600 items in all)."""
    mixed, plain = builtin_arith("train", mixed_forms=True), builtin_arith("train")
    return [(mixed if rng.random() < mixed_share else plain)[i] for i in range(len(plain))]


def _batches(examples: Sequence[Example], size: int, rng: random.Random) -> list[list[Example]]:
    """Batches of similar length (little padding), in a shuffled order."""
    ordered = sorted(examples, key=lambda e: len(e.ids))
    batches = [list(ordered[i : i + size]) for i in range(0, len(ordered), size)]
    rng.shuffle(batches)
    return batches


def _tensors(batch: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels: (B, T) each."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.ids)
        ids[i, :n], mask[i, :n], labels[i, :n] = torch.tensor(e.ids), 1, torch.tensor(e.labels)
    return ids, mask, labels


def _loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the labelled positions; logits only where a label is set."""
    causal_lm = model.get_base_model()
    hidden = causal_lm.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, H)
    where = labels != IGNORE
    logits = causal_lm.lm_head(hidden[where]).float()  # (N, V)
    return torch.nn.functional.cross_entropy(logits, labels[where])


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return max(0.1, 1 - 0.9 * (step - warmup) / max(1, total - warmup))


def train_grm(base: Path, out: Path, config: GrmTrainConfig, progress: bool = True) -> dict[str, Any]:
    """Train a LoRA adapter on builtin:arith train; write it (bf16) and training.json to out."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    # float32 weights, under bf16 autocast where the CPU computes bf16 natively: there 1.2-1.6x
    # the tokens/s of bf16 weights (bf16 norms and softmax in the backward are slow on CPU). An
    # AVX2-only CPU emulates bf16, so it trains in plain float32. The adapter trains in float32.
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    autocast = resolve_dtype("auto") == "bfloat16"
    if config.init:
        model = PeftModel.from_pretrained(model, config.init, is_trainable=True)  # type: ignore[assignment]
        saved = json.loads((Path(config.init) / "adapter_config.json").read_text())
        config = replace(config, rank=saved["r"], alpha=saved["lora_alpha"])  # recorded as trained
    else:
        lora = LoraConfig(
            r=config.rank,
            lora_alpha=config.alpha,
            lora_dropout=0.0,
            target_modules=list(TARGET_MODULES),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)  # type: ignore[assignment]

    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def chat(messages: list[dict[str, str]], after: int | None) -> list[int]:
        return chat_ids(tokenizer, messages, after)  # exactly as the engine encodes a prompt

    items = training_items(config.mix.mixed_share, rng)[: config.limit]
    examples = [example(item, encode, chat, eos_id, rng, config.mix) for item in items]
    batches = _batches(examples, config.batch_size, rng)
    planned = math.ceil(len(batches) * config.epochs)
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)

    model.train()
    total, losses, tokens, learnt = planned, [], 0, 0
    start = time.perf_counter()
    bar = tqdm(total=planned, desc="train-grm", file=sys.stderr, disable=not progress)
    step = 0
    while step < total:
        batch = batches[step % len(batches)]
        if step == 5:  # the first steps pay warm-up costs; from here the speed is steady enough
            per_step = (time.perf_counter() - start) / step
            total = max(step + 1, min(planned, int(config.budget_s / per_step)))
            bar.total = total
        for group in optimiser.param_groups:
            group["lr"] = config.lr * _lr_factor(step, total, config.warmup_steps)
        ids, mask, labels = _tensors(batch, pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = _loss(model, ids, mask, labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimiser.step()
        losses.append(loss.item())
        tokens += int(mask.sum())
        learnt += sum(e.learnt_tokens for e in batch)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{statistics_tail(losses):.3f}", refresh=False)
        if time.perf_counter() - start > config.budget_s * 1.1:  # a slower stretch: stop, keep what we have
            break
    bar.close()
    elapsed = time.perf_counter() - start

    with torch.no_grad():  # ship the adapter in bf16: half the bytes, what serving merges anyway
        for p in params:
            p.data = p.data.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "README.md").unlink(missing_ok=True)  # peft's model-card stub: nothing in it is ours
    meta = {
        "steps": step,
        "planned_steps": planned,
        "items": len(items),
        "sequences_seen": sum(len(batches[s % len(batches)]) for s in range(step)),
        "tokens": tokens,
        "learnt_tokens": learnt,
        "seconds": round(elapsed, 1),
        "tokens_per_s": round(tokens / elapsed, 1),
        "first_loss": round(statistics_tail(losses[:10]), 4),
        "final_loss": round(statistics_tail(losses), 4),
        "config": asdict(config),  # the Mix nests as a dict
    }
    (out / TRAINING_META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def statistics_tail(values: Sequence[float], n: int = 20) -> float:
    """Mean of the last n values (a readable running loss)."""
    tail = values[-n:]
    return sum(tail) / len(tail) if tail else float("nan")
