"""Load a causal LM for the embedded engine: a Hugging Face folder or a single .gguf file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


@dataclass(slots=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    eos_ids: frozenset[int]
    context_length: int

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return frozenset(ids)


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """Resolve "auto" to bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), else float32.

    Without native support bf16 matmuls are emulated: on an AVX2-only EPYC (2 threads, M=5,
    prefixes of ~250 tokens) a short-path request took 1.30 s in bf16 and 0.36 s in fp32, a
    long-path one 5.7 s and 2.1 s (fp32 weights prepacked for oneDNN; see prepacked.py).
    """
    if dtype != "auto":
        return dtype
    if device != "cpu":
        return "bfloat16"  # every GPU torch supports computes it natively
    return "bfloat16" if native_bf16() else "float32"


def native_bf16() -> bool:
    """Whether this CPU computes bf16 itself (AVX512-BF16 or AMX). oneDNN's own answer
    (mkldnn._is_mkldnn_bf16_supported) is yes on any AVX-512 CPU, where bf16 is converted to fp32
    and back: on an AVX-512 Xeon without BF16 a linear of the model's shapes took 2.0x (5 rows) and
    3.8x (256 rows) the fp32 time."""
    cpu = torch.cpu
    if hasattr(cpu, "_is_avx512_bf16_supported") and hasattr(cpu, "_is_amx_tile_supported"):
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())  # an older torch: oneDNN's word


def load_model(
    path: str | Path, dtype: str = "auto", threads: int = 0, device: str = "cpu", chat_template: str | None = None
) -> LoadedModel:
    """device: "cpu", or "cuda" for the embedded engine on a GPU (when there is no SGLang);
    chat_template: replaces the model's own (EGRM_CHAT_TEMPLATE)."""
    path = Path(path).expanduser()
    if threads > 0:
        torch.set_num_threads(threads)
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"EGRM_DEVICE={device!r} but torch sees no CUDA device here")
    torch_dtype = getattr(torch, resolve_dtype(dtype, device))
    kwargs: dict = {"dtype": torch_dtype}
    folder = path
    if path.suffix == ".gguf":
        folder, kwargs["gguf_file"] = path.parent, path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, **{k: v for k, v in kwargs.items() if k == "gguf_file"})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if path.suffix == ".gguf":
        model.hf_quantizer = None  # type: ignore[assignment]  # dequantised on load; serve it as a plain model
    # from_pretrained leaves weights memory-mapped from the safetensors file; the kernel may
    # evict cold pages and a later forward pays a disk read (seconds). Own the memory instead.
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    if device != "cpu":
        model.to(device)  # type: ignore[arg-type]  # transformers types .to() for dtypes only
    model.eval()
    context = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
    return LoadedModel(model, tokenizer, path.stem if path.suffix else path.name, _eos_ids(model, tokenizer), context)
