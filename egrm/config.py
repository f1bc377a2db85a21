"""Service settings: one pydantic-settings class, environment prefix EGRM_."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from egrm.protocol import MAX_M  # one bound for the setting and the wire


def default_cache_dir() -> Path:
    """A per-user cache (XDG), never the git checkout: models are hundreds of MB."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "egrm"


def temperature_ladder(m: int, low: float = 0.6, high: float = 1.0) -> list[float]:
    """The method's ladder: m temperatures evenly spaced from low to high (0.6..1.0 for m=5)."""
    if m == 1:
        return [low]
    return [round(low + (high - low) * i / (m - 1), 4) for i in range(m)]


class Settings(BaseSettings):
    # Env values are not JSON-decoded up front, so list fields accept "a,b" as well (_comma_list).
    model_config = SettingsConfigDict(env_prefix="EGRM_", extra="ignore", enable_decoding=False)

    host: str = Field("127.0.0.1", description="Bind address; loopback unless exposed on purpose.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    engine: Literal["embedded", "sglang", "openai", "llamacpp"] = Field(
        "embedded",
        description="Engine backend: the in-process torch model, an SGLang runtime, an OpenAI-compatible "
        "server, or a llama.cpp llama-server.",
    )
    model: str = Field(
        "",
        description="Local Hugging Face model folder or .gguf file; empty = the default "
        "SmolLM2-135M-Instruct fetched by `egrm fetch-model`. With a remote engine, only its "
        "tokenizer and config are read: it must be the model the backend serves.",
    )
    model_name: str = Field("", description="Model id reported by the API; default: folder name.")
    chat_template: str = Field(
        "",
        description="The chat template the judge is asked in: a built-in (chatml, gemma) or a Jinja file; empty = "
        "the model's own. A model with none (a base model) needs one: egrm refuses to start without it.",
    )
    adapter: str = Field(
        "",
        description="LoRA adapter merged into the embedded model (once; the merge is cached). Empty = the "
        "judge adapter shipped with egrm when serving the default model, none with EGRM_MODEL; "
        "`none` = no adapter; else an adapter folder (adapter_config.json + adapter_model.safetensors).",
    )
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Where fetched and converted models live.")
    dtype: Literal["bfloat16", "float32", "auto"] = Field(
        "auto",
        description="Embedded engine weights and compute dtype; auto = bfloat16 where the CPU has native "
        "bf16 (AVX512-BF16, AMX), else float32 (emulated bf16 is 3-4x slower there: see docs/performance.md).",
    )
    threads: int = Field(0, ge=0, description="Torch CPU threads; 0 = all cores.")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where the embedded engine runs: cpu, or cuda for a GPU when there is no SGLang."
    )
    layout: Literal["sequence", "batch"] = Field(
        "sequence",
        # EGRM_PARALLEL_MODE is its name before 2026-12; still read.
        validation_alias=AliasChoices("layout", "EGRM_LAYOUT", "EGRM_PARALLEL_MODE"),
        description="How the M branches of a prompt meet in attention (their KV is shared either way): "
        "packed in one sequence under a branch mask (the prefix read once), or one row per branch.",
    )
    prefix_cache: bool = Field(True, description="Reuse the KV blocks of prompt heads that requests share.")
    kv_cache_mb: float = Field(
        1024,
        ge=1,
        description="The embedded engine's KV pool in MiB, preallocated: every running or held branch's KV "
        "lives there. Requests wait for free blocks; one that could never fit gets 413.",
    )
    batch_window_ms: float = Field(
        5.0, ge=0, le=1000, description="Under concurrency, how long an idle engine waits to gather requests."
    )
    max_batch_branches: int = Field(128, ge=1, description="Most branches the embedded engine runs at once.")
    max_batch_tokens: int = Field(
        512,
        ge=16,
        description="Most tokens one embedded engine step computes (decodes first, then prompt chunks "
        "shared among requests): bounds how long a step, and so a deadline or a small request, waits.",
    )
    max_queue: int = Field(1024, ge=1, description="Most engine jobs waiting; more are refused.")
    sglang_url: str = Field("http://127.0.0.1:30000", description="SGLang runtime base URL (EGRM_ENGINE=sglang).")
    sglang_api_key: SecretStr = Field(
        SecretStr(""), description="Bearer key of the SGLang runtime (its --api-key); empty = none."
    )
    openai_url: str = Field(
        "", description="OpenAI-compatible API base URL, with its /v1 (EGRM_ENGINE=openai; required there)."
    )
    openai_api_key: SecretStr = Field(SecretStr(""), description="Bearer key of the OpenAI-compatible server.")
    openai_model: str = Field("", description="Model id to request; empty = the first one the server lists.")
    openai_dialect: Literal["openai", "vllm", "vllm-legacy"] = Field(
        "openai",
        description="Fields beyond the OpenAI API: vllm = structured_outputs regex for answers and "
        "returned token ids; vllm-legacy = guided_regex; openai = none (answers read from free text).",
    )
    llamacpp_url: str = Field(
        "http://127.0.0.1:8080", description="llama.cpp llama-server root URL (EGRM_ENGINE=llamacpp)."
    )
    llamacpp_api_key: SecretStr = Field(SecretStr(""), description="Bearer key of the llama-server (its --api-key).")
    backend_timeout_s: float = Field(
        120.0, gt=0, description="Most seconds one call to a remote backend may take (503 past it)."
    )
    m: int = Field(5, ge=1, le=MAX_M, description="Default number of parallel samples M.")
    tau: float = Field(0.8, ge=0.0, le=1.0, description="Consensus threshold for the short path.")
    routing_policy: str = Field(
        "",
        description="The routing policy `egrm calibrate` wrote for the judge (a JSON file); empty = the one beside "
        "the judge (routing_policy.json in the judge adapter's folder, or in EGRM_MODEL's folder), if any; "
        "`none` = route on tau alone. A request that names its own tau routes on it.",
    )
    consensus: Literal["sampled", "exact"] = Field(
        "sampled",
        description="Default consensus estimator: the M samples' vote (the method), or the model's own "
        "probability of its most likely short answer, read from one greedy branch (no sampling noise).",
    )
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="Default nucleus for every branch.")
    template: Literal["verdict", "score", "pairwise"] = Field("verdict", description="Default judge template.")
    long_max_tokens: int = Field(128, ge=1, le=2048, description="Reasoning tokens per candidate on the long path.")
    long_accept: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="Early stop on the long path: when the scorer rates one of the first EGRM_LONG_WINDOW "
        "candidates at least this, it decides and the others are dropped (they run meanwhile only in rows a step "
        "has to spare); 0 = every candidate reasons to the end. The score must be a probability of being right "
        "(the trained scorer's; not the heuristic's).",
    )
    long_window: int = Field(1, ge=1, le=MAX_M, description="Candidates that reason first under early stop.")
    max_items: int = Field(256, ge=1, description="Most items in one request.")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above).")
    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection must send its request headers within this (else it is closed)."
    )
    body_timeout_s: float = Field(30.0, gt=0, description="A request body must arrive within this (408 past it).")
    max_prompt_tokens: int = Field(
        4096, ge=16, description="Most tokens one rendered judge prompt may have (prompt, response, template)."
    )
    # Under OpenRLHF's 180 s total per POST (openrlhf/utils/agent.py): its client is still waiting
    # when egrm answers 504, and its retry 1 s later collects the work that went on (share_grace_s).
    request_timeout_s: float = Field(
        150.0, gt=0, description="Per-request deadline; past it, 504 (the questions' work goes on for the grace)."
    )
    share_questions: bool = Field(
        True,
        description="Judge each question once: every response to it, in one request or in concurrent ones, is "
        "judged against the same samples, route and candidates, kept for a window (EGRM_SHARE_*); false: every "
        "item computes its own.",
    )
    share_max_entries: int = Field(4096, ge=0, description="Most questions' finished work kept for later responses.")
    share_max_mb: float = Field(
        64.0, ge=0, description="Most MiB of finished question work kept (this process's side)."
    )
    share_ttl_s: float = Field(600.0, gt=0, description="How long finished question work is kept after it is done.")
    share_grace_s: float = Field(
        30.0,
        ge=0,
        description="How long a question's work goes on once no request waits for it (a deadline passed, a client "
        "left), so that a retry of the same query joins it instead of starting over.",
    )
    share_url: str | None = Field(
        None,
        description="redis://host:6379/0: the replicas share question work through this Redis (each question "
        "judged once per cluster, egrm/pipeline/cluster.py); unset: this process's window alone.",
    )
    share_lease_s: float = Field(
        10.0,
        gt=0,
        description="How long a question's lock in Redis outlives a replica that died computing it (renewed while "
        "the work runs): another replica takes the question over after at most this long.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Bearer keys; empty = no authentication. Env: a comma-separated list or a JSON array.",
    )
    open_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/readyz", "/metrics"],
        description="Paths served without a key when keys are set. Env: comma-separated or JSON.",
    )
    gpu_metrics_interval_s: float = Field(
        5.0, ge=0, description="How often GPU utilisation and memory are read through NVML; 0 = off."
    )
    scorer_url: str = Field(
        "",
        description="Base URL of a scorer worker (`egrm scorer`), e.g. http://127.0.0.1:8001; "
        "empty = the scorer runs in-process (EGRM_SCORER_CHECKPOINT).",
    )
    scorer_checkpoint: str = Field(
        "",
        description="Without a worker URL: the scorer run in-process. Empty or `trained` = the checkpoint shipped "
        "with egrm; `heuristic` = the heuristic; else a checkpoint file or folder.",
    )
    scorer_timeout_s: float = Field(
        5.0, gt=0, le=300, description="Deadline of one call to the scorer worker; past it, the call is retried."
    )
    scorer_retries: int = Field(
        1, ge=0, le=5, description="Retries of a scorer call after a connection error, timeout or 5xx."
    )
    shutdown_grace_s: int = Field(60, ge=0, description="On SIGTERM, how long in-flight requests may finish.")

    @field_validator("api_keys", "open_paths", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            if value.strip().startswith("["):
                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("scorer_url")
    @classmethod
    def _check_scorer_url(cls, value: str) -> str:
        if value and not (value.startswith(("http://", "https://")) and value.split("://", 1)[1].strip("/")):
            raise ValueError(f"EGRM_SCORER_URL must be an http(s) URL such as http://127.0.0.1:8001, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_model_path(self) -> Settings:
        if self.model and not Path(self.model).expanduser().exists():
            raise ValueError(f"EGRM_MODEL={self.model!r} does not exist")
        if self.adapter not in ("", "none") and not Path(self.adapter).expanduser().is_dir():
            raise ValueError(f"EGRM_ADAPTER={self.adapter!r} is not a folder (or `none`)")
        return self

    @model_validator(mode="after")
    def _check_early_stop(self) -> Settings:
        # Early stop reads a score as the probability that a candidate is right. The heuristic's is
        # not one: scored alone, a candidate agrees with itself, so half its score is given.
        if self.long_accept > 0 and not self.scorer_url and self.scorer_checkpoint == "heuristic":
            raise ValueError(
                "EGRM_LONG_ACCEPT (early stop) needs a scorer whose score is a probability of being right; "
                "the heuristic's is not: set EGRM_LONG_ACCEPT=0 with EGRM_SCORER_CHECKPOINT=heuristic"
            )
        return self

    @model_validator(mode="after")
    def _check_backend(self) -> Settings:
        if self.engine == "openai" and not self.openai_url:
            raise ValueError("EGRM_OPENAI_URL is required with EGRM_ENGINE=openai (e.g. http://127.0.0.1:8000/v1)")
        return self

    @property
    def default_temperatures(self) -> list[float]:
        return temperature_ladder(self.m)
