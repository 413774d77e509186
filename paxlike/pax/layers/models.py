"""praxis.layers.models: ClassificationModel, a Pax model for images and video.

praxis's classifier: the network (ResNet-50 unless set) gives features, the
softmax (praxis's FullSoftmax) scores them against `label_probs`, weighted
per example by `weight` where the batch has one. Its metrics are praxis's:
`avg_xent` (the loss Pax's vision experiments name), `num_predictions`,
`accuracy` and `error`, and `acc5` / `error5` with more than five classes.
"""

from typing import Any

import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.pax import base_model, metric_utils, pax_fiddle
from paxlike.pax.base_layer import BaseLayer, template_field
from paxlike.pax.layers import resnets
from paxlike.pax.praxis_layers import FullSoftmax
from paxlike.pax.py_utils import NestedMap


class ClassificationModel(base_model.BaseModel):
  """praxis's ClassificationModel. decode (Pax's decode protocol) returns the metrics of
  compute_loss; praxis's clu Accuracy is its `accuracy` weighted scalar here."""

  network_tpl: pax_fiddle.Config[BaseLayer] = template_field(resnets.ResNet)
  softmax_tpl: pax_fiddle.Config[BaseLayer] = template_field(FullSoftmax)
  input_field: str = "image"
  label_field: str = "label_probs"

  def setup(self) -> None:
    self.create_child("network", self.network_tpl)
    self.create_child("softmax", self.softmax_tpl)

  def compute_predictions(self, input_batch: NestedMap) -> NestedMap:
    inputs = input_batch[self.input_field]
    features = self.network(inputs)
    rows = inputs.shape[0]
    weights = jnp.ones([rows])
    if "weight" in input_batch:
      weights = input_batch.weight
      if weights.shape != (rows,):
        raise UserError(f"ClassificationModel: the batch's weight has shape "
                        f"{weights.shape}, not ({rows},).")
    out = self.softmax(inputs=features, class_weights=weights[:, None],
                       class_probabilities=input_batch[self.label_field])
    return NestedMap(features=features, softmax_output=out, example_weights=weights)

  def compute_loss(self, predictions: NestedMap, input_batch: NestedMap
                   ) -> tuple[NestedMap, dict[str, Any]]:
    labels = input_batch[self.label_field]
    out = predictions.softmax_output
    total = out.total_weight
    metrics = NestedMap(avg_xent=(out.avg_xent, total),
                        num_predictions=(total, jnp.array(1.0, total.dtype)))
    acc1 = metric_utils.top_k_accuracy(1, out.logits, label_probs=labels,
                                       weights=predictions.example_weights)
    metrics.update(accuracy=(acc1, total), error=(1.0 - acc1, total))
    self.add_summary("acc1", acc1)
    if out.logits.shape[-1] > 5:
      acc5 = metric_utils.top_k_accuracy(5, out.logits, label_probs=labels,
                                         weights=predictions.example_weights)
      metrics.update(acc5=(acc5, total), error5=(1.0 - acc5, total))
      self.add_summary("acc5", acc5)
    return metrics, NestedMap(labels=labels, scores=out.logits)

  def predict(self, input_batch: NestedMap) -> NestedMap:
    logits = self.softmax.get_logits(inputs=self.network(input_batch[self.input_field]))
    return NestedMap(logits=logits, logp=jax.nn.log_softmax(logits))

  def decode(self, input_batch: NestedMap) -> tuple[NestedMap, NestedMap, NestedMap]:
    metrics, _ = self.compute_loss(self.compute_predictions(input_batch), input_batch)
    return metrics, NestedMap(), NestedMap()


__all__ = ["ClassificationModel"]
