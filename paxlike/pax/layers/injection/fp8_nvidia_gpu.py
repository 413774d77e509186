"""praxis.layers.injection.fp8_nvidia_gpu: the FP8 einsums a Pax file sets as a projection's
or the experts' einsum_tpl (paxlike.pax.config_tree reads them as USE_FP8)."""

from paxlike.pax.praxis_layers import Fp8EinsumGatedOp, Fp8EinsumOp

__all__ = ["Fp8EinsumGatedOp", "Fp8EinsumOp"]
