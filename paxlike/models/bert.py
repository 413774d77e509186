"""BERT's masked language model (praxis's BertModel) on paxlike's LM.

The LM's stack and shared embedding/softmax (paxlike.models.language_model)
with attention that is not causal: every token sees every token of its own
segment. A step corrupts about 15% of each row's tokens (paxlike.layers.
masking: praxis's MaskedLmDataAugmenter) and is scored only there, on the
original ids.

Batches carry Pax's BERT features: int `labels` [batch, length] (the
original ids) and `paddings` (1 on padding), or paxlike's LM features, whose
`weights` mark the tokens (paddings = 1 - weights; neither: no padding);
`segment_ids` / `segment_pos` of packed rows are honoured. Rows an input has
corrupted already carry `masked_ids` and `masked_pos` (TFRecordBertInput's
MLPerf records); the model corrupts the others itself (all of them with
force_mask_generation): with the step's RNG while training, and in eval
with a key drawn from the batch's ids, so an eval masks a batch the same
way every time.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from paxlike.layers.masking import MlmMasking, jax_samplers
from paxlike.models.base import NoDecoder
from paxlike.models.language_model import LanguageModel, weighted_loss

EVAL_MASK_SEED = 0  # the corruption's seed when the caller passes no RNG (eval)


class BertModel(NoDecoder, LanguageModel):
  """praxis's BertModel: a bidirectional LM trained to restore corrupted tokens.

  mask_token_id: the id a masked token becomes (praxis's mask_token_id);
  mask_prob / random_prob / same_prob: the corruption's shares (praxis's
  MaskedLmDataAugmenter defaults); label_smoothing_prob: praxis's, on the
  softmax's targets (the loss; log_pplx stays the plain cross-entropy).
  """

  causal: ClassVar[bool] = False
  NO_DECODER = "a BERT masked language model (BertModel) does not generate text"
  mask_token_id: int = 0
  mask_prob: float = 0.12
  random_prob: float = 0.015
  same_prob: float = 0.015
  force_mask_generation: bool = False
  label_smoothing_prob: float | None = None

  def masking(self) -> MlmMasking:
    return MlmMasking(self.vocab_size, self.mask_token_id, self.mask_prob, self.random_prob,
                      self.same_prob)

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(the masked positions' mean loss, metrics)."""
    labels = batch["labels"].astype(jnp.int32)
    paddings = self.paddings(batch)
    if "masked_ids" in batch and not self.force_mask_generation:
      inputs, picked = batch["masked_ids"].astype(jnp.int32), batch["masked_pos"]
    else:
      if self.has_rng("dropout"):
        key = self.make_rng("dropout")
      else:  # eval: the same batch is masked the same way, each batch its own way
        key = jax.random.fold_in(jax.random.PRNGKey(EVAL_MASK_SEED),
                                 jnp.sum(labels, dtype=jnp.uint32))
      inputs, picked = self.masking().apply(labels, paddings, *jax_samplers(key))
    segment_ids, segment_pos = batch.get("segment_ids"), batch.get("segment_pos")
    if not self.packed_input or segment_ids is None:
      segment_ids, segment_pos = 1 - paddings.astype(jnp.int32), None
    logits, routing = self.forward(inputs, segment_ids=segment_ids.astype(jnp.int32),
                                   segment_pos=segment_pos)
    weights = picked.astype(jnp.float32) * (1.0 - paddings.astype(jnp.float32))
    loss, metrics = weighted_loss(logits, labels, weights,
                                  label_smoothing=self.label_smoothing_prob or 0.0)
    metrics["num_real_tokens"] = jnp.sum(1.0 - paddings.astype(jnp.float32))
    return self._total_loss(loss, metrics, logits, weights, routing)

  @staticmethod
  def paddings(batch: dict[str, Any]) -> Any:
    """Pax's `paddings`, or 1 - `weights` for an LM input's batch; neither: no padding."""
    if "paddings" in batch:
      return batch["paddings"]
    if "weights" in batch:
      return 1 - (batch["weights"] > 0).astype(jnp.float32)
    return jnp.zeros(batch["labels"].shape, jnp.float32)

  def input_features(self) -> tuple[str, ...]:
    return ("labels",)

  def optional_features(self) -> tuple[str, ...]:
    return ("paddings", "weights", "masked_ids", "masked_pos", "segment_ids", "segment_pos")

  def decode_features(self) -> tuple[str, ...]:
    return ("labels",)

  def padding_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Nothing scored: every position padding, nothing masked."""
    out = dict(host_batch)
    for key, fill in (("weights", np.zeros_like), ("masked_pos", np.zeros_like),
                      ("paddings", np.ones_like)):
      if key in out:
        out[key] = fill(out[key])
    return out

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    return super().model_flops_per_step({"ids": specs["labels"]})

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    return int(np.prod(specs["labels"].shape[:2]))
