"""Linear layers whose weights are laid out once for the CPU's matmul library (oneDNN).

Why: `F.linear` on CPU hands a plain (out, in) weight to oneDNN, which reorders it into its
blocked layout on every call. At decode, where a step multiplies 1-25 rows by each weight, that
reorder costs as much as the product. Reordering once at load (what inductor's freezing does)
measured here, bf16, 2 threads: the 3072x576 gate/up projection 101 -> 50 us at 1 row,
135 -> 78 us at 5 rows; the 49k-row LM head 3.2 -> 1.7 ms; outputs bit-identical. In fp32 on an
AVX2-only EPYC, all 30 layers' projections (weights cold in cache, as in serving): 34 -> 23 ms
at 1 row, 54 -> 29 ms at 5 rows. Where oneDNN is not there (a GPU, a build without it), has no
kernel for the dtype (bf16 without native bf16), or the probe below disagrees, `F.linear` runs.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


def prepack_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN has a prepacked CPU kernel for this dtype here: fp32 always; bf16 only on
    CPUs with native bf16 (AVX512-BF16, AMX, AVX-NE-CONVERT), where it emulates nothing."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype is torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype is torch.float32


class Linear:
    """y = x @ W.T for x (..., in); W (out, in), kept as given or reordered once for oneDNN."""

    __slots__ = ("weight", "_packed")

    def __init__(self, weight: torch.Tensor, prepack: bool = True):
        self.weight = weight  # (out, in): kept for the fallback and for anyone reading the weights
        self._packed: torch.Tensor | None = None
        if prepack and weight.device.type == "cpu" and prepack_supported(weight.dtype):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
                probe = torch.randn(3, weight.shape[1], dtype=weight.dtype)
                if torch.allclose(self._mkldnn(probe, packed).float(), F.linear(probe, weight).float(), atol=1e-2):
                    self._packed = packed
                else:
                    log.warning("prepacked linear disagrees with F.linear; using F.linear")
            except RuntimeError as exc:  # an op missing from this build
                log.warning("prepacked linear unavailable (%s); using F.linear", exc)

    @staticmethod
    def _mkldnn(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    @property
    def prepacked(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return self._mkldnn(x, self._packed)
        return F.linear(x, self.weight)
