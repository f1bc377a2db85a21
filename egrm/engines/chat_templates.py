"""Chat templates egrm brings, for a model that ships none (a base model) or to replace its own.

The judge is asked in turns (a system prompt, the question, later a follow-up showing the
response), so every model needs a chat template. EGRM_CHAT_TEMPLATE names a built-in here or a
Jinja file, as vLLM's --chat-template does; without it the model's own is used, and a model with
none is refused at start-up (egrm/startup.py), before anything is served.

The built-ins are written for chat_ids (egrm/engines/chat.py): each message's content appears once
and verbatim, so the content can be told from the markup.
"""

from __future__ import annotations

import json
from pathlib import Path

# ChatML: what SmolLM2, Qwen and llama.cpp's fallback speak.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Gemma's turns (<start_of_turn>user / model ... <end_of_turn>): it has no system role, so a
# system message opens the first user turn.
GEMMA = (
    "{{ bos_token }}"
    "{% set system = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for message in messages if message['role'] != 'system' %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' }}"
    "{{ (system if loop.first else '') + message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

BUILTIN = {"chatml": CHATML, "gemma": GEMMA}


def template_text(setting: str) -> str | None:
    """EGRM_CHAT_TEMPLATE as a template: a built-in's, a file's; None for the model's own."""
    if not setting:
        return None
    if setting in BUILTIN:
        return BUILTIN[setting]
    return Path(setting).expanduser().read_text()


def check_setting(setting: str) -> str:
    """The setting, or a ValueError naming what it may be."""
    if setting and setting not in BUILTIN and not Path(setting).expanduser().is_file():
        raise ValueError(
            f"EGRM_CHAT_TEMPLATE={setting!r} is neither a built-in ({', '.join(BUILTIN)}) nor a Jinja file"
        )
    return setting


def model_has_template(path: Path) -> bool:
    """Whether the model at path (a Hugging Face folder or a .gguf file) brings a chat template,
    read from its files without loading it."""
    if path.suffix == ".gguf":
        return "tokenizer.chat_template" in gguf_keys(path)
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config = path / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))


def gguf_keys(path: Path) -> set[str]:
    """The metadata keys of a GGUF file, read from its head: the key-value section comes before
    the tensors, and values are skipped, not parsed (gguf's GGUFReader parses every one: 20 s
    for a 262k-token vocabulary). Layout: magic, version (u32), tensor and key counts (u64), then
    per key: its name (u64 length, bytes), a value type (u32) and the value."""
    import struct

    from gguf import GGUFValueType as T

    fixed = {T.UINT8: 1, T.INT8: 1, T.BOOL: 1, T.UINT16: 2, T.INT16: 2, T.UINT32: 4, T.INT32: 4, T.FLOAT32: 4}
    fixed |= {T.UINT64: 8, T.INT64: 8, T.FLOAT64: 8}
    with open(path, "rb") as f:

        def u64() -> int:
            return int(struct.unpack("<Q", f.read(8))[0])

        def skip(kind: int) -> None:
            if kind == T.STRING:
                f.seek(u64(), 1)
            elif kind == T.ARRAY:
                (item,) = struct.unpack("<I", f.read(4))
                count = u64()
                if item in fixed:
                    f.seek(fixed[T(item)] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(fixed[T(kind)], 1)

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        f.read(4 + 8)  # version, tensor count
        keys = set()
        for _ in range(u64()):
            keys.add(f.read(u64()).decode())
            (kind,) = struct.unpack("<I", f.read(4))
            skip(kind)
        return keys
