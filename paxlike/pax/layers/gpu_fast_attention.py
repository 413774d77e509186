"""praxis.layers.gpu_fast_attention: the fused GPU layers Pax's GPU files swap in.

paxlike chooses its attention kernel per platform (cuDNN's fused attention on
CUDA; USE_CUDNN_FLASH_ATTENTION / USE_FLASH_ATTENTION steer it), so these
configure the same math as the layers they replace.
"""

from paxlike.pax.praxis_layers import (
    GpuCudnnFusedDotProductAttention,
    GpuCudnnFusedGroupedQueryAttention,
    GpuTritonFusedDotProductAttention,
    GpuTritonFusedLayerNorm,
)

__all__ = ["GpuCudnnFusedDotProductAttention", "GpuCudnnFusedGroupedQueryAttention",
           "GpuTritonFusedDotProductAttention", "GpuTritonFusedLayerNorm"]
