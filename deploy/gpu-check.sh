#!/usr/bin/env bash
# The embedded engine on a GPU (EGRM_DEVICE=cuda, no SGLang), checked in one short command:
# the greedy-equality and engine-step tests on cuda, then the benchmarks, one JSON line each.
#   bash deploy/gpu-check.sh            (after `make install model`; about 5 minutes on an H100)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
export EGRM_DEVICE=cuda
"$PY" - <<'PY'
import asyncio, torch
from app.config import Settings
from app.engines.base import BranchParams
from app.engines.embedded.engine import EmbeddedEngine
from app.main import judge_model_path

# The same greedy tokens in both layouts and on the CPU (fp32 on both: bf16 rounds differently).
path = str(judge_model_path(Settings()))
prompt = [{"role": "user", "content": "Write a short story about a cat who learns to fly."}]
greedy = [BranchParams(temperature=0, max_new_tokens=24)] * 5
out = {}
for device in ("cuda", "cpu"):
    for layout in ("sequence", "batch"):
        engine = EmbeddedEngine.load(path, dtype="float32", device=device, layout=layout)
        ids = engine.encode_chat(prompt)
        out[device, layout] = [b.token_ids for b in asyncio.run(engine.sample(ids, greedy))]
        asyncio.run(engine.close())
assert len({str(v) for v in out.values()}) == 1, out
print({"gpu_greedy_equals_cpu": True, "device": torch.cuda.get_device_name()})
PY
"$PY" -m loadtest.bench_parallel --json --device cuda --dtype bfloat16 --long-rounds 3
"$PY" -m loadtest.bench_mixed --json
