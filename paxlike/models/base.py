"""The model contract every paxlike model family meets (Pax's BaseModel role).

Trainer, evaluator, dry run, FLOP/MFU accounting, export and the step
benchmark are written once against this class and never ask which family
they hold. A family (models/language_model.py, models/t5.py) implements:

Flax methods (run through `model.apply`):
  fprop(batch) -> (loss, metrics)
      Weighted mean loss and metrics; metrics hold at least `loss`,
      `accuracy` and `num_tokens` (the weight sum). A metric `<name>` with a
      `<name>-weight` beside it (WEIGHT: a Pax model's WeightedScalars) is
      averaged by its own weight over microbatches, pmap devices and an eval
      set, as Pax does (weighted_sums, weighted_means); the others by
      num_tokens, and num_* counts add up. Dropout is active only
      when the caller passes a 'dropout' rng (the train step does; eval,
      init and decode do not), so one method serves train and eval.
  prefill(batch, settings) -> DecodeStart       (mutable=["cache"])
      One pass over the prompt (decoder-only) or the encoder input
      (encoder-decoder) that fills the 'cache' collection and says where
      the one-position extends start.
  extend(tokens, index) -> logits               (mutable=["cache"])
      tokens [N] int32 fed at position `index` (a scalar, the same for
      every row); returns next-token logits [N, vocab] in float32.

Plain methods (no parameters needed; callable on the unbound module):
  input_features()        the batch keys fprop reads
  decode_features()       the batch keys prefill reads
  model_flops_per_step(specs)  analytic model FLOPs of one train step for a
                          global batch given as {feature: ShapeDtypeStruct}
  tokens_per_step(specs)  token positions one train step processes
  flops_source()          how model_flops_per_step counts ("analytic" for the families)
  check_mesh(ici, dcn)    refuses model mesh fields that differ from the experiment's
  for_task(loss_name, summary_verbosity)  the model as the task runs it: training on
                          the learner's loss_name (a family's one loss is 'total_loss';
                          paxlike.pax.base_model's names its metrics)
  compute_dtype()         the matmul dtype's name, for the device peak
  padding_params()        parameter entries that only pad tables to the mesh
  special_ids()           {"eos_id", "pad_id"} for decoding
  cache_batch_axis(path)  the example axis of a cache leaf (default 0; 1 under a
                          scanned stack's layer axis), for the three below
  gather_cache(cache, idx) the cache with the rows of every leaf taken at idx
                          (each beam a copy of its example; a plain reference)
  expand_cache / reorder_cache  beam search's: every leaf stays per example,
                          self-attention caches get a slot per beam, and a
                          reorder moves only their slot tables (see
                          paxlike.layers.attention.use_kv_cache)
  prompt_and_target(host_batch) -> (prompts, targets, real)
                          per row, the prompt ids and the reference ids
                          decode output is written beside and scored on,
                          and whether the row is an example (not padding)
  initial_params(params, rng) the freshly initialised (boxed) parameters as the
                          family wants them started (default: unchanged; the
                          LM applies praxis's params_init here)
  padding_batch(host_batch) the batch with every loss weight 0 (the filler
                          a host with fewer eval batches runs)
  beside_filler(host_batch) a real batch of a step in which another host runs
                          a filler, with the filler's features (default: as
                          it is)
  finish_decode(batch, start, out, settings) -> DecodeOutput
                          the family's last word on generate()'s output
                          (the LM drops the prompt tokens it forced)

`decode(params, batch, key, settings)` is written here once for every
family: prefill, then paxlike.decoding.generate over extend.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike import decoding
from paxlike.layers import attention

# The suffix of a metric's own weight (Pax's TensorBoard name for a WeightedScalar's summed
# weight, Metrics/<name>-weight).
WEIGHT = "-weight"


def split_weighted(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
  """(the metrics without a weight of their own, {name: (value, weight)} for those with one)."""
  pairs = {k: (v, metrics[k + WEIGHT]) for k, v in metrics.items() if k + WEIGHT in metrics}
  weights = {k + WEIGHT for k in pairs}
  return {k: v for k, v in metrics.items() if k not in pairs and k not in weights}, pairs


def weighted_sums(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(the metrics without a weight of their own, {name: value x weight, name-weight:
  weight} for those with one): what adds up over microbatches, devices and batches."""
  rest, pairs = split_weighted(metrics)
  sums = {}
  for k, (value, weight) in pairs.items():
    sums[k], sums[k + WEIGHT] = value * weight, weight
  return rest, sums


def weighted_means(sums: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
  """{name: (sum(value x weight), sum(weight))} (weighted_sums' sums, added up, split again)
  as Pax reports WeightedScalars: {name: sum(value x weight) / sum(weight), name-weight:
  sum(weight)}."""
  out = {}
  for k, (total, weight) in sums.items():
    out[k], out[k + WEIGHT] = total / jnp.maximum(weight, 1e-8), weight
  return out


class BaseModel(nn.Module):
  """Base of every paxlike model family; see the module docstring."""

  # ---------------------------------------------------------- flax methods

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    raise NotImplementedError

  def prefill(self, batch: dict[str, jax.Array],
              settings: decoding.DecodeSettings) -> decoding.DecodeStart:
    raise NotImplementedError

  def extend(self, tokens: jax.Array, index: jax.Array) -> jax.Array:
    raise NotImplementedError

  # --------------------------------------------------------- plain methods

  def initial_params(self, params: Any, rng: jax.Array) -> Any:
    """The fresh (boxed) parameters as this family starts them; unchanged here."""
    del rng
    return params

  def check_batch(self, rows: int) -> None:
    """Raises UserError when one step's slice of `rows` rows does not fit the model
    (a pipeline's microbatches); most models take any batch."""
    del rows

  def layout(self) -> Any:
    """How this model stores its layer stack (paxlike.layers.pipeline.Layout: scanned or
    unrolled, pipelined or not), or None for a model without one layer stack to
    restack (paxlike.relayout leaves its checkpoints as they are)."""
    return None

  def unpipelined(self) -> BaseModel:
    """A pipelined model's twin without the pipeline (its layers scanned), what Hugging
    Face export and FLOP counts read; most models are their own."""
    return self

  def for_decoding(self) -> BaseModel:
    """The model decoding runs (decode, infer, export; see decoding.decoding_model), whose
    parameters are restack_params of this one's: the same layers unpipelined and unrolled.

    Unrolled, each layer's KV cache is an array of its own that a decode step writes in
    place. A scanned stack slices every layer's cache out of the stacked one and stacks
    it back at every step, copying the whole cache (T5's encoder keys and values with
    it) once more per generated token. A model without a layer stack is its own.
    """
    return self

  def restack_params(self, params: Any) -> Any:
    """params in this model's layer layout (a layout-changing model restacks them)."""
    return params

  def stack_form(self) -> Any:
    """How paxlike.relayout finds this model's layer stack in a stored tree
    (paxlike.layers.pipeline.StackForm: as `transformer` subtrees, the LM's)."""
    from paxlike.layers.pipeline import StackForm

    return StackForm()

  def input_features(self) -> tuple[str, ...]:
    raise NotImplementedError

  def decode_features(self) -> tuple[str, ...]:
    raise NotImplementedError

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    raise NotImplementedError

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    raise NotImplementedError

  def flops_source(self) -> str:
    """Where model_flops_per_step's count comes from, as the dry run labels it."""
    return "analytic"

  def compute_dtype(self) -> str:
    raise NotImplementedError

  def cache_batch_axis(self, path: tuple[Any, ...]) -> int:
    """The example (batch) axis of the cache leaf at `path` (a jax tree path)."""
    del path
    return 0

  def gather_cache(self, cache: Any, indices: jax.Array) -> Any:
    """The cache with every leaf's rows taken at indices (each row its own example)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.take(x, indices, axis=self.cache_batch_axis(path)), cache)

  def padding_params(self) -> int:
    """Parameter entries that only pad a table to the mesh (not counted as parameters)."""
    return 0

  def expand_cache(self, cache: Any, indices: jax.Array) -> Any:
    """Beam search's first step: a slot per beam in each example's self-attention caches."""
    return attention.expand_slots(cache, indices, self.cache_batch_axis)

  def reorder_cache(self, cache: Any, indices: jax.Array) -> Any:
    """Beam search's reorder within each example's beams: only the slot tables move."""
    return attention.reorder_slots(cache, indices, self.cache_batch_axis)

  def special_ids(self) -> dict[str, int]:
    """The ids decoding ends rows with and pads them with."""
    return {"eos_id": 1, "pad_id": 0}

  def prompt_and_target(self, host_batch: dict[str, np.ndarray]
                        ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    raise NotImplementedError

  def padding_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The batch with its loss weights 0: `weights`, a decoder-only family's (T5's differ)."""
    return {**host_batch, "weights": np.zeros_like(host_batch["weights"])}

  def beside_filler(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A real batch of a step in which another host runs padding_batch: padding_batch
    zeroes the weights the batch has, so it is as it is."""
    return host_batch

  def hf_config(self) -> dict[str, Any]:
    """The Hugging Face config (config.json as a dict) of this model, for interop.hf."""
    from paxlike.errors import UserError

    raise UserError(f"{type(self).__name__} has no Hugging Face layout; only the T5 and "
                    "Llama families convert to and from Hugging Face (--export_format="
                    "stablehlo exports any model).")

  def for_task(self, loss_name: str, summary_verbosity: int) -> BaseModel:
    """This model as the task runs it (Task passes the learner's loss_name and its
    summary_verbosity, which paxlike's families' layers do not read).

    Raises:
      UserError: the model has no such loss (paxlike's families have one, 'total_loss').
    """
    del summary_verbosity
    if loss_name not in ("total_loss", "loss"):
      from paxlike.errors import UserError

      raise UserError(f"learner.loss_name={loss_name!r}: paxlike's models train on their one "
                      "loss, 'total_loss'.")
    return self

  def check_mesh(self, ici_mesh_shape: Any, dcn_mesh_shape: Any) -> None:
    """Raises UserError where the model's own mesh fields disagree with the experiment's
    (a Pax user's model has them, paxlike.pax.base_model); the families have none."""
    del ici_mesh_shape, dcn_mesh_shape

  def pax_variables(self) -> str | None:
    """Which Pax model's checkpoint variables this model takes (paxlike.interop.pax): "lm"
    (praxis's TransformerLm), "llama" (Pax's LLaMA), or None (no Pax counterpart)."""
    return None

  def finish_decode(self, batch: dict[str, jax.Array], start: decoding.DecodeStart,
                    out: decoding.DecodeOutput,
                    settings: decoding.DecodeSettings) -> decoding.DecodeOutput:
    del batch, start, settings
    return out

  # ------------------------------------------------------------- derived

  def init_batch(self, specs: dict[str, Any]) -> dict[str, jax.Array]:
    """A one-row batch of zeros with the input features' shapes (what init traces)."""
    import jax.numpy as jnp

    missing = [k for k in self.input_features() if k not in specs]
    if missing:
      from paxlike.errors import UserError

      raise UserError(f"the input gives no {', '.join(missing)} but {type(self).__name__} "
                      f"reads {', '.join(self.input_features())}; use an input that makes "
                      "those features.")
    keys = [*self.input_features(), *(k for k in self.optional_features() if k in specs)]
    return {k: jnp.zeros((1, *specs[k].shape[1:]), specs[k].dtype) for k in keys}

  def optional_features(self) -> tuple[str, ...]:
    """Features fprop reads where the input gives them (init traces them too)."""
    return ()

  def decode(self, params: Any, batch: dict[str, jax.Array], key: jax.Array,
             settings: decoding.DecodeSettings) -> decoding.DecodeOutput:
    """Generates for a batch: prefill once, then one-position extends (jit-able)."""
    start, variables = self.apply({"params": params}, batch, settings, method="prefill",
                                  mutable=["cache"])

    def extend(cache: Any, tokens: jax.Array, index: jax.Array):
      logits, mutated = self.apply({"params": params, "cache": cache}, tokens, index,
                                   method="extend", mutable=["cache"])
      return logits, mutated["cache"]

    out = decoding.generate(extend, variables["cache"], start, settings, key,
                            gather_cache=self.gather_cache, expand_cache=self.expand_cache,
                            reorder_cache=self.reorder_cache)
    return self.finish_decode(batch, start, out, settings)


class NoDecoder:
  """Mixed in before BaseModel by a family that generates nothing (the MLP classifier,
  BERT): decode, infer and export stop in one sentence, NO_DECODER."""

  NO_DECODER = "this model has no decoder"

  def prefill(self, batch: Any, settings: Any) -> Any:
    from paxlike.errors import UserError

    raise UserError(f"{self.NO_DECODER}; run it with --mode=train, eval, dry_run or tune.")

  def extend(self, tokens: jax.Array, index: jax.Array) -> jax.Array:
    return self.prefill(None, None)

  def prompt_and_target(self, host_batch: dict[str, np.ndarray]) -> Any:
    return self.prefill(None, None)
