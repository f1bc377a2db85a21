"""A LoRA adapter merged into its base model once, and the merged folder cached.

Serving a merged model costs nothing per token (no adapter matmuls, and the lean forward reads
plain safetensors). The merge runs in float32 and the result is saved in the base's dtype; the
folder's name carries a digest of the adapter, so a new adapter is merged anew and an old
merge is never served by mistake.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_DONE_MARKER = ".egrm-merged"


def adapter_digest(adapter: Path) -> str:
    """sha256 over the adapter's config and weights (names included)."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        path = adapter / name
        if not path.is_file():
            raise FileNotFoundError(f"{adapter} is not a LoRA adapter folder: {name} is missing")
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def merged_dir(base: Path, adapter: Path, cache_dir: Path) -> Path:
    return Path(cache_dir) / "models" / f"{base.name}+lora-{adapter_digest(adapter)[:12]}"


def merged_model(base: Path, adapter: Path, cache_dir: Path) -> Path:
    """The folder of base with adapter merged in; merged on the first call, reused after."""
    target = merged_dir(base, adapter, cache_dir)
    if (target / _DONE_MARKER).exists():
        return target
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("merging the LoRA adapter %s into %s (once)", adapter, base)
    target.parent.mkdir(parents=True, exist_ok=True)
    saved_as = getattr(AutoConfig.from_pretrained(base), "dtype", None) or "bfloat16"
    dtype = getattr(torch, saved_as) if isinstance(saved_as, str) else saved_as
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".merge-") as tmp:
        staged = Path(tmp) / "merged"
        merged.to(dtype).save_pretrained(staged)
        AutoTokenizer.from_pretrained(base).save_pretrained(staged)
        (staged / _DONE_MARKER).write_text(f"{base} + {adapter} {adapter_digest(adapter)}\n")
        # Renamed into place last: an interrupted merge never leaves a folder that looks complete.
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return target
