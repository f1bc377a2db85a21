"""Making the default model a judge: training targets, LoRA fine-tuning, and the shipped adapter."""

from pathlib import Path

# The LoRA adapter `egrm train-grm` produced for the default model; merged in at load time.
DEFAULT_ADAPTER = Path(__file__).parent / "adapter"
