"""Decoder-only Transformer language model."""

from __future__ import annotations

from typing import Any, ClassVar

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from paxlike import decoding, flops
from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.layers.embedding import (
  Embedding,
  SharedEmbeddingSoftmax,
  TrainablePositionalEmbedding,
  padded_vocab,
  sinusoidal_at,
)
from paxlike.layers.linear import dropout_active, lora_targets
from paxlike.layers.transformer import (
  StackedTransformer,
  make_norm,
  moe_period,
  stage_moe_layers,
)
from paxlike.models.base import BaseModel

Dtype = Any


# The parameters praxis draws from params_init: kernels and tables (biases, norm
# scales and per-dim scales have initializers of their own).
WEIGHT_NAMES = ("w", "post", "embedding")
WEIGHT_INITS = ("gaussian", "uniform", "xavier", "constant")


def draw_weight(spec: tuple[str, float], key: jax.Array, shape: tuple[int, ...], dtype: Any,
                lead: int, name: str) -> jax.Array:
  """A weight drawn as praxis's WeightInit (method, scale) draws it.

  gaussian: N(0, 1) x scale; uniform: U(-scale, scale); constant: scale;
  xavier: U(-l, l), l = scale x sqrt(6 / (fan_in + fan_out)), fan_in the
  input dims (the first, or heads x dims per head of the attention output's
  kernel) and fan_out the rest, per layer of a stack (whose `lead` leading
  dims index the layers).
  """
  method, scale = spec[0].lower(), float(spec[1])
  if method == "gaussian":
    return jax.random.normal(key, shape, dtype) * scale
  if method == "uniform":
    return jax.random.uniform(key, shape, dtype, -scale, scale)
  if method == "constant":
    return jnp.full(shape, scale, dtype)
  if method != "xavier":
    raise UserError(f"params_init method {spec[0]!r} is not one of {list(WEIGHT_INITS)}.")
  dims = shape[lead:]
  n_in = 2 if name == "post" else 1
  fan_in, fan_out = int(np.prod(dims[:n_in])), int(np.prod(dims[n_in:]))
  limit = scale * (6.0 / (fan_in + fan_out)) ** 0.5
  return jax.random.uniform(key, shape, dtype, -limit, limit)


def restack_tree(tree: Any, num_layers: int, layout: pipeline.Layout) -> Any:
  """Every `transformer` subtree of tree (params, or optimizer slots mirroring them)
  restacked to `layout`; leaves boxed or not, numpy or jax."""
  if not isinstance(tree, dict):
    return tree
  out = {}
  for key, value in tree.items():
    if key == "transformer" and isinstance(value, dict):
      out[key] = pipeline.restack(value, num_layers, layout)
    else:
      out[key] = restack_tree(value, num_layers, layout)
  return out


def _int_pair(value: Any) -> tuple[int, int] | None:
  """An (int, int) pair as a hashable tuple (a list from a config), or None."""
  return None if value is None else (int(value[0]), int(value[1]))


def _pair(value: Any) -> tuple[float, float] | None:
  """A (min, max) pair as a hashable tuple of floats (a list from a config), or None."""
  return None if value is None else (float(value[0]), float(value[1]))


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0
                          ) -> tuple[jax.Array, jax.Array]:
  """Per-token (cross-entropy, smoothed cross-entropy) in float32, from one logsumexp.

  The smoothed one is against praxis's smoothed targets, 1 - p on the label and
  p / (classes - 1) on each other class (p = label_smoothing); with p = 0 it is
  the plain one.
  """
  logits = logits.astype(jnp.float32)
  logz = jax.nn.logsumexp(logits, axis=-1)
  label_logp = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0] - logz
  if not label_smoothing:
    return -label_logp, -label_logp
  # The other classes' log-probabilities, summed: sum(logits) - classes * logz - label's.
  others_logp = jnp.sum(logits, axis=-1) - logits.shape[-1] * logz - label_logp
  smoothed = (-(1.0 - label_smoothing) * label_logp
              - label_smoothing / (logits.shape[-1] - 1) * others_logp)
  return -label_logp, smoothed


def weighted_loss(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                  strict: bool = False, yes_no: tuple[int, int] | None = None,
                  label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """fprop's (loss, metrics) of every family: weighted mean cross-entropy and counts.

  Metrics: loss, log_pplx, accuracy (weighted argmax match), num_tokens (the
  weight sum) and num_examples (rows with any weight), which the evaluator
  turns back into sums. strict: also strict_correct, the number of rows with
  weight whose every weighted token's argmax is its label (praxis's acc_strict).
  yes_no: also yes_no_correct, the weighted positions whose label, one of the
  two ids, has a higher logit than the other one (praxis's BoolQ accuracy).
  label_smoothing: the loss is against praxis's smoothed targets
  (softmax_cross_entropy); log_pplx stays the plain cross-entropy.
  """
  weights = weights.astype(jnp.float32)
  xent, smoothed = softmax_cross_entropy(logits, labels, label_smoothing)
  total = jnp.maximum(jnp.sum(weights), 1e-8)
  log_pplx = jnp.sum(xent * weights) / total
  loss = jnp.sum(smoothed * weights) / total if label_smoothing else log_pplx
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  metrics = {
      "loss": loss,
      "log_pplx": log_pplx,
      "accuracy": jnp.sum(correct * weights) / total,
      "num_tokens": jnp.sum(weights),
      "num_examples": jnp.sum(jnp.any(weights > 0, axis=-1).astype(jnp.float32)),
  }
  if yes_no is not None:
    logits32 = logits.astype(jnp.float32)
    other = jnp.clip(sum(yes_no) - labels, 0, logits.shape[-1] - 1)
    label_logit = jnp.take_along_axis(logits32, labels[..., None], axis=-1)[..., 0]
    other_logit = jnp.take_along_axis(logits32, other[..., None], axis=-1)[..., 0]
    metrics["yes_no_correct"] = jnp.sum((label_logit > other_logit) * weights)
  if strict:
    missed = jnp.sum((1.0 - correct) * (weights > 0), axis=-1)
    metrics["strict_correct"] = jnp.sum(
        (jnp.any(weights > 0, axis=-1) & (missed == 0)).astype(jnp.float32))
  return loss, metrics


def sample_weighted(batch: dict[str, jax.Array], apply: bool) -> jax.Array:
  """The batch's token weights; with praxis's apply_eval_sample_weights, times each row's
  `eval_sample_weights` (0 for the rows padding a last eval batch)."""
  weights = batch["weights"]
  if apply:
    if "eval_sample_weights" in batch:
      weights = weights * batch["eval_sample_weights"].astype(weights.dtype)[:, None]
    else:  # as praxis: said once per compile, the weights used as they are
      logging.warning("apply_eval_sample_weights is set, but the batch has no "
                      "eval_sample_weights; its token weights are used as they are.")
  return weights


class LanguageModel(pipeline.PipelinedModel, BaseModel):
  """Token ids -> next-token logits, with Pax's shared embedding/softmax.

  Batches are dicts with int `ids` and `labels` [batch, length] and float
  `weights` [batch, length] (0 for padding); with packed_input, optional
  int `segment_ids` (1, 2, ... per sequence in a row, Pax's name) keep each
  sequence's tokens from attending to the others', and `segment_pos` (the
  position within its sequence) place them; a batch without them has one
  sequence per row. Decoding reads `ids` and `prompt_lens` (row r's prompt
  is ids[r, :prompt_lens[r]]) and generates into the rest of the row.

  The Pax knobs (see paxlike.lm_experiments): separate_embedding unties the
  input table from the softmax; trainable_position_emb learns a
  [trainable_pe_max_seq_len, model_dims] table instead of adding sinusoids;
  atten_logit_cap / softmax_cap_logits > 0 cap the attention and output
  logits with cap * tanh(x / cap); vocab_pad_multiple pads the vocabulary
  tables to a multiple of the 'mdl' axis (padded_vocab). Two parameters Pax's
  LM has by default, each switchable off as Pax's GPT-3 does: softmax_has_bias
  adds a [vocab] bias to the logits (before the cap), per_dim_scale scales
  each layer's queries by a learned [dim_per_head] vector instead of
  1/sqrt(dim_per_head) (paxlike.layers.attention.scale_query_per_dim).
  """

  vocab_size: int
  model_dims: int
  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "relu"
  combine_qkv: bool = False
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  fprop_dtype: Dtype = jnp.float32
  use_gated_activation: bool = False
  use_bias: bool = False
  norm_policy: str = "pre"
  layernorm_epsilon: float = 1e-6
  dropout_prob: float = 0.0
  # praxis's StackedTransformer.input_dropout_prob: on the stack's input, once; on a repeated
  # stack's one-layer block, before every layer (layer_input_dropout_prob).
  input_dropout_prob: float = 0.0
  layer_input_dropout_prob: float = 0.0
  atten_logit_cap: float = 0.0
  softmax_cap_logits: float = 0.0
  packed_input: bool = False
  separate_embedding: bool = False
  trainable_position_emb: bool = False
  trainable_pe_max_seq_len: int = 16384
  embedding_lookup_style: str = "index"
  vocab_pad_multiple: int = 1
  softmax_has_bias: bool = True
  per_dim_scale: bool = True
  # What praxis's config tree can change besides (paxlike.pax.config_tree):
  num_kv_heads: int | None = None  # grouped-query attention; None: num_heads
  rope_timescales: tuple[float, float] | None = None  # rotary q/k positions (min, max)
  use_position_emb: bool = True  # False: no position table or sinusoids (RoPE models)
  norm_type: str = "layernorm"  # or "rmsnorm", every norm of the model
  ffn_has_bias: bool = True
  scale_sqrt_depth: bool = True  # embedded rows x sqrt(model_dims)
  # praxis's WeightInit for the weights (kernels and tables; biases, norms and
  # per-dim scales keep theirs): ("gaussian" | "uniform" | "xavier" | "constant", scale);
  # softmax_weight_init the same for the softmax's table. None: paxlike's initializers.
  weight_init: tuple[str, float] | None = None
  softmax_weight_init: tuple[str, float] | None = None
  eos_id: int = 1  # the id decoding ends a row on (praxis's decoder_tpl.eos_id)
  # praxis's apply_eval_sample_weights: a batch's per-row `eval_sample_weights` (0 for
  # the rows padding a last eval batch) multiply its token weights.
  apply_eval_sample_weights: bool = False
  # praxis's report_strict_acc: eval also reports acc_strict, the fraction of rows whose
  # every weighted token is predicted (LAMBADA's whole-word accuracy).
  report_strict_acc: bool = False
  # Pax's pipeline (NUM_STAGES; None: none): see StackedTransformer.
  num_stages: int | None = None
  circular_repeat: int = 1
  num_microbatches: int | None = None  # the pipeline's; or microbatch_size
  microbatch_size: int | None = None
  stream_io: bool = False
  # Pax's USE_LORA (LoRAMixin): LORA_RANK-wide adapters on LORA_TARGET_LAYERS'
  # projections ("all", "attention", "mlp"); 0: none. See layers.linear.lora_output.
  lora_rank: int = 0
  lora_target_layers: str = "all"
  # Mixture of experts (praxis's StackedTransformer.moe_layers with a
  # TransformerFeedForwardMoe; paxlike.layers.moe): the feed-forward of each layer in
  # moe_layers (0-based; None or empty: none) is num_experts experts of moe_hidden_dims
  # (None: hidden_dims), top-2 routed within num_groups groups of tokens, each expert
  # taking expert_capacity_dim tokens of a group or more by expert_capacity_factor
  # (praxis's unadjusted_expert_capacity_factor). The load-balancing loss times
  # moe_load_balance_loss_weight is added to the loss (metric aux_loss); metric
  # moe_over_capacity is the MoE layers' mean fraction of token choices that found
  # their expert full.
  num_experts: int = 0
  moe_layers: tuple[int, ...] | None = None
  num_groups: int = 1
  moe_hidden_dims: int | None = None
  expert_capacity_factor: float = 2.0
  expert_capacity_dim: int | None = None
  moe_gated_activation: bool = False
  moe_gating_logit_cap: float = 0.0
  moe_load_balance_loss_weight: float = 1.0
  moe_activation: str | None = None  # the experts' activation; None: activation
  # The mesh's 'data' axis size (the template's): the experts are split over it when
  # num_experts is a multiple of it, else each expert's embed dim is (see MoeFeedForward).
  expert_shards: int = 1
  # GLaM's LM (praxis's glam builder): attention without a query scale
  # (query_scale=False), with an extra softmax logit and a causal relative position bias
  # per layer ((num_buckets, max_distance)); praxis's GShardSharedEmbeddingSoftmax
  # (gshard_softmax: logits from the final activations scaled by 1/sqrt(model_dims),
  # with scale_sqrt_depth off and no bias); z_loss_weight adds
  # z_loss_weight x the weighted mean of logsumexp(logits)^2 to the loss (metric z_loss);
  # loss_over_labels_size divides the loss's cross-entropy by the labels' count instead
  # of the weights' sum (praxis's use_tgt_labels_size_as_loss_denominator).
  # Pax's USE_FP8: every layer's attention and feed-forward projections in FP8 with
  # delayed scaling (paxlike.layers.linear.fp8_project); the softmax stays in fprop_dtype.
  use_fp8: bool = False
  # praxis's Fp8EinsumOp on the experts (moe_layer_tpl.einsum_tpl; Grok's builder with
  # use_fp8): their einsums in FP8 too. Pax's LM templates leave the experts out of USE_FP8.
  moe_fp8: bool = False
  # praxis's headless_proj_tpl.einsum_tpl on a multi-query attention with one key/value
  # head: its key/value projections in FP8 (True) or not (False), apart from use_fp8's
  # query and output projections; None: as use_fp8.
  kv_fp8: bool | None = None
  query_scale: bool = True
  attention_extra_logit: float | None = None
  relative_bias: tuple[int, int] | None = None
  gshard_softmax: bool = False
  z_loss_weight: float = 0.0
  loss_over_labels_size: bool = False

  # Whether a token attends only to the tokens before it (the LM); BERT's model is not.
  causal: ClassVar[bool] = True

  def _moe(self) -> tuple[tuple[int, ...], tuple[tuple[str, Any], ...]]:
    """(the MoE layers, MoeFeedForward's settings), after checking them."""
    layers = tuple(int(i) for i in (self.moe_layers or ()))
    if not layers:
      return (), ()
    if self.num_experts < 2:
      raise UserError(f"moe_layers={list(layers)} needs num_experts of 2 or more (it is "
                      f"{self.num_experts}); set NUM_EXPERTS.")
    bad = [i for i in layers if not 0 <= i < self.num_layers]
    if bad:
      raise UserError(f"moe_layers {bad} are not layers of the {self.num_layers}-layer stack "
                      f"(0 to {self.num_layers - 1}).")
    if self.num_stages is not None:  # the same MoE layers in every stage, or one line
      per_stage = self.layout().layers_per_stage
      stage = stage_moe_layers(layers, self.num_layers, per_stage)
      if self.use_repeated_layer and moe_period(stage, per_stage) > 1:
        raise UserError(f"moe_layers={list(layers)}: a scanned pipeline stage whose layers "
                        "alternate between experts and a dense feed-forward is not modelled; "
                        "set USE_REPEATED_LAYER=False (Pax's pipelined GLaM unrolls its "
                        "stages) or put experts in every layer.")
    if self.lora_rank and self.lora_target_layers != "attention":
      raise UserError(f"LORA_TARGET_LAYERS={self.lora_target_layers!r} adapts the feed-forward, "
                      "which is a mixture of experts here; set LORA_TARGET_LAYERS='attention'.")
    return layers, (("num_experts", self.num_experts),
                    ("hidden_dims", self.moe_hidden_dims or self.hidden_dims),
                    ("num_groups", self.num_groups),
                    ("capacity_factor", float(self.expert_capacity_factor or 0.0)),
                    ("capacity_dim", self.expert_capacity_dim),
                    ("gated_activation", self.moe_gated_activation),
                    ("activation", self.moe_activation or self.activation),
                    ("shard_experts", self.num_experts % max(self.expert_shards, 1) == 0),
                    ("gating_logit_cap", float(self.moe_gating_logit_cap)),
                    ("load_balance_loss_weight", float(self.moe_load_balance_loss_weight)),
                    ("fp8", self.moe_fp8))

  def setup(self) -> None:
    lora_targets(self.lora_rank, self.lora_target_layers)
    if (self.use_fp8 or self.moe_fp8 or self.kv_fp8) and self.num_stages is not None:
      raise UserError("FP8 einsums (USE_FP8, or Fp8EinsumOp in the tree) on a pipelined LM: a "
                      "stage's FP8 scales are used once per microbatch, and their next values "
                      "would add up instead of being written; drop FP8 or the pipeline.")
    moe_layers, moe_kwargs = self._moe()
    rows = padded_vocab(self.vocab_size, self.vocab_pad_multiple)
    self.softmax = SharedEmbeddingSoftmax(
        self.vocab_size, self.model_dims, self.fprop_dtype, padded_rows=rows,
        lookup_style=self.embedding_lookup_style, soft_cap_logits=self.softmax_cap_logits,
        use_bias=self.softmax_has_bias, scale_sqrt_depth=self.scale_sqrt_depth,
        gshard=self.gshard_softmax)
    if self.separate_embedding:
      self.embedding = Embedding(self.vocab_size, self.model_dims, self.fprop_dtype,
                                 padded_rows=rows, lookup_style=self.embedding_lookup_style,
                                 scale_sqrt_depth=self.scale_sqrt_depth)
    if self.trainable_position_emb:
      self.position_emb = TrainablePositionalEmbedding(
          self.trainable_pe_max_seq_len, self.model_dims, self.fprop_dtype)
    layer_kwargs = (("norm_policy", self.norm_policy),
                    ("layernorm_epsilon", self.layernorm_epsilon), ("use_bias", self.use_bias),
                    ("atten_logit_cap", self.atten_logit_cap),
                    ("use_gated_activation", self.use_gated_activation),
                    ("dropout_rate", self.dropout_prob), ("per_dim_scale", self.per_dim_scale),
                    ("num_kv_heads", self.num_kv_heads),
                    ("rope_timescales", _pair(self.rope_timescales)),
                    ("norm_type", self.norm_type), ("ffn_has_bias", self.ffn_has_bias),
                    ("input_dropout_rate", self.layer_input_dropout_prob),
                    ("lora_rank", self.lora_rank), ("lora_target_layers", self.lora_target_layers),
                    ("query_scale", self.query_scale),
                    ("attention_extra_logit", self.attention_extra_logit),
                    ("relative_bias", _int_pair(self.relative_bias)),
                    ("causal", self.causal), ("fp8", self.use_fp8),
                    ("kv_fp8", self.kv_fp8))
    self.transformer = StackedTransformer(
        num_layers=self.num_layers, num_heads=self.num_heads, dim_per_head=self.dim_per_head,
        hidden_dims=self.hidden_dims, activation=self.activation,
        combine_qkv=self.combine_qkv, use_repeated_layer=self.use_repeated_layer,
        checkpoint_policy=self.checkpoint_policy, dtype=self.fprop_dtype,
        layer_kwargs=layer_kwargs, num_stages=self.num_stages,
        circular_repeat=self.circular_repeat, num_microbatches=self.num_microbatches,
        microbatch_size=self.microbatch_size, stream_io=self.stream_io,
        moe_layers=moe_layers, moe_kwargs=moe_kwargs)
    self.final_norm = make_norm(self.norm_type, self.layernorm_epsilon, self.fprop_dtype)
    self.input_dropout = nn.Dropout(self.input_dropout_prob)

  def __call__(self, ids: jax.Array, cache_mode: str | None = None,
               index: jax.Array | None = None, segment_ids: jax.Array | None = None,
               segment_pos: jax.Array | None = None) -> jax.Array:
    """[batch, length] ids -> [batch, length, vocab] logits; ids start at position `index`.

    segment_ids / segment_pos: packed rows (see the class docstring).
    """
    return self.forward(ids, cache_mode, index, segment_ids, segment_pos)[0]

  def forward(self, ids: jax.Array, cache_mode: str | None = None,
              index: jax.Array | None = None, segment_ids: jax.Array | None = None,
              segment_pos: jax.Array | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """__call__'s logits, and the MoE layers' routing record (StackedTransformer)."""
    x = self.embedding(ids) if self.separate_embedding else self.softmax.embed(ids)
    if segment_pos is None:
      segment_pos = jnp.arange(ids.shape[1])[None] + (0 if index is None else index)
    if self.trainable_position_emb:
      # Checked here, not in validate(): a task() may drop the table (position_emb_tpl = None).
      if cache_mode != "extend" and ids.shape[1] > self.trainable_pe_max_seq_len:
        raise UserError(f"TRAINABLE_PE_MAX_SEQ_LEN={self.trainable_pe_max_seq_len} is shorter "
                        f"than the sequences ({ids.shape[1]} positions); the position table "
                        "needs a row per position.")
      x = x + self.position_emb(segment_pos)
    elif self.use_position_emb:
      x = x + sinusoidal_at(segment_pos, self.model_dims).astype(self.fprop_dtype)
    x = nn.with_logical_constraint(x, ("batch", "length", "activation_embed"))
    relative = self.rope_timescales is not None or self.relative_bias is not None
    positions = segment_pos if relative else None
    x = self.input_dropout(x, deterministic=not dropout_active(self, self.input_dropout_prob))
    x, routing = self.transformer(x, cache_mode, index, segment_ids, positions)
    # Outside a pipeline the softmax runs data-parallel over every core, stages included.
    batch_axis = "batch" if self.num_stages is None else "pipeline_batch"
    x = nn.with_logical_constraint(x, (batch_axis, "length", "activation_embed"))
    x = self.final_norm(x)
    logits = self.softmax.logits(x)
    return (nn.with_logical_constraint(logits, (batch_axis, "length", "activation_vocab")),
            routing)

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Returns (mean weighted loss, metrics)."""
    segment_ids = segment_pos = None
    if self.packed_input:
      segment_ids, segment_pos = batch.get("segment_ids"), batch.get("segment_pos")
    logits, routing = self.forward(batch["ids"], segment_ids=segment_ids,
                                   segment_pos=segment_pos)
    weights = sample_weighted(batch, self.apply_eval_sample_weights)
    loss, metrics = weighted_loss(logits, batch["labels"], weights, self.strict_accuracy,
                                  self.yes_no_tokens)
    return self._total_loss(loss, metrics, logits, weights, routing)

  def _total_loss(self, loss: jax.Array, metrics: dict[str, jax.Array], logits: jax.Array,
                  weights: jax.Array, routing: dict[str, jax.Array]
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """praxis's total_loss: the cross-entropy (over the labels' count with
    loss_over_labels_size), plus the z-loss and the MoE layers' load-balancing losses
    (metrics z_loss, aux_loss; and moe_over_capacity). log_pplx stays the mean over the
    weighted tokens."""
    if not (self.moe_layers or self.z_loss_weight or self.loss_over_labels_size):
      return loss, metrics
    denominator = jnp.sum(weights.astype(jnp.float32))
    if self.loss_over_labels_size:
      denominator = jnp.asarray(weights.size, jnp.float32)
      loss = loss * jnp.sum(weights.astype(jnp.float32)) / denominator
    if self.z_loss_weight:
      log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
      z_loss = self.z_loss_weight * jnp.sum(jnp.square(log_z) * weights) / jnp.maximum(
          denominator, 1e-8)
      loss = loss + z_loss
      metrics["z_loss"] = z_loss
    if self.moe_layers:
      loss = loss + routing["aux_loss"]
      metrics["aux_loss"] = routing["aux_loss"]
      metrics["moe_over_capacity"] = routing["over_capacity"] / len(self.moe_layers)
    metrics["loss"] = loss
    return loss, metrics

  @property
  def strict_accuracy(self) -> bool:
    """Whether fprop counts strict_correct (report_strict_acc)."""
    return self.report_strict_acc

  @property
  def yes_no_tokens(self) -> tuple[int, int] | None:
    """The two ids whose logits fprop compares (yes_no_correct); None: none."""
    return None

  # ------------------------------------------------------------- decoding

  def prefill(self, batch: dict[str, jax.Array],
              settings: decoding.DecodeSettings) -> decoding.DecodeStart:
    """Runs the prompts through the model once, filling every layer's KV cache
    (decoding.prompt_start)."""
    return decoding.prompt_start(batch, settings, lambda tokens: self(tokens, "prefill"))

  def extend(self, tokens: jax.Array, index: jax.Array) -> jax.Array:
    return self(tokens[:, None], "extend", index)[:, 0].astype(jnp.float32)

  def finish_decode(self, batch: dict[str, jax.Array], start: decoding.DecodeStart,
                    out: decoding.DecodeOutput,
                    settings: decoding.DecodeSettings) -> decoding.DecodeOutput:
    """Drops each row's forced prompt (generations start at column 0).

    max_decode_length needs no cut here: each row stopped at its own limit
    (decoding.prompt_start's row_limits), tokens and score alike.
    """
    lens = jnp.maximum(batch["prompt_lens"], 1)
    width = out.tokens.shape[-1]
    first = lens - (start.start_index + 1)  # the row's first generated output position
    cols = first[:, None] + jnp.arange(width)[None]
    gen = jnp.take_along_axis(out.tokens, jnp.minimum(cols, width - 1)[:, None, :], axis=2)
    keep = cols < width
    return out.replace(tokens=jnp.where(keep[:, None, :], gen, settings.pad_id))

  def cache_batch_axis(self, path: tuple[Any, ...]) -> int:
    return 1 if self.use_repeated_layer else 0  # scanned leaves lead with the layer axis

  # -------------------------------------------------------- plain methods

  def restack_params(self, params: Any) -> Any:
    """params (of any layer layout, read off the tree itself) in this model's layout."""
    return restack_tree(params, self.num_layers, self.layout())

  def initial_params(self, params: Any, rng: jax.Array) -> Any:
    """praxis's params_init: the weights redrawn with it (see draw_weight)."""
    if self.weight_init is None and self.softmax_weight_init is None:
      return params
    flat = flax.traverse_util.flatten_dict(params)
    for i, (path, leaf) in enumerate(sorted(flat.items())):
      spec = self.weight_init
      if path[0] == "softmax" and self.softmax_weight_init is not None:
        spec = self.softmax_weight_init  # praxis: a child's own params_init wins over its parent's
      if spec is None or path[-1] not in WEIGHT_NAMES:
        continue
      value = nn.unbox(leaf)
      lead = self.layout().lead_dims if path[0] == "transformer" else 0
      new = draw_weight(spec, jax.random.fold_in(rng, i), value.shape, value.dtype,
                        lead, path[-1])
      flat[path] = leaf.replace_boxed(new) if isinstance(leaf, nn.meta.AxisMetadata) else new
    return flax.traverse_util.unflatten_dict(flat)

  def special_ids(self) -> dict[str, int]:
    return {"eos_id": self.eos_id, "pad_id": 0}

  def input_features(self) -> tuple[str, ...]:
    return ("ids", "labels", "weights")

  def optional_features(self) -> tuple[str, ...]:
    return ("eval_sample_weights",) if self.apply_eval_sample_weights else ()

  def decode_features(self) -> tuple[str, ...]:
    return ("ids", "prompt_lens")

  def flops_dims(self, seq_len: int) -> flops.LmDims:
    return flops.LmDims(self.num_layers, self.model_dims, self.hidden_dims, self.num_heads,
                        self.dim_per_head, self.vocab_size, seq_len,
                        gated=self.use_gated_activation,
                        separate_embedding=self.separate_embedding, use_bias=self.use_bias,
                        position_table_len=(self.trainable_pe_max_seq_len
                                            if self.trainable_position_emb else 0),
                        norms_per_sublayer=2 if self.norm_policy == "primer_hybrid" else 1,
                        softmax_bias=self.softmax_has_bias, per_dim_scale=self.per_dim_scale,
                        num_kv_heads=self.num_kv_heads, ffn_bias=self.ffn_has_bias,
                        norm_bias=self.norm_type == "layernorm",
                        adapter_params=self.num_layers * flops.lora_adapter_params(
                            self.lora_rank, self.lora_target_layers, self.model_dims,
                            self.num_heads * self.dim_per_head,
                            (self.num_kv_heads or self.num_heads) * self.dim_per_head,
                            self.hidden_dims, 3 if self.use_gated_activation else 2,
                            self.combine_qkv),
                        moe_layers=len(self.moe_layers or ()), num_experts=self.num_experts,
                        moe_hidden_dims=((self.moe_hidden_dims or self.hidden_dims)
                                         if self.moe_layers else 0),
                        moe_gated=self.moe_gated_activation,
                        relpos_buckets=self.relative_bias[0] if self.relative_bias else 0)

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    batch, seq_len = specs["ids"].shape[:2]
    return flops.model_flops_per_step(self.flops_dims(seq_len), batch)

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    return int(np.prod(specs["ids"].shape[:2]))

  def padding_params(self) -> int:
    """The rows padding the vocabulary tables (and the softmax bias) to the 'mdl' axis."""
    pad = padded_vocab(self.vocab_size, self.vocab_pad_multiple) - self.vocab_size
    return pad * (self.model_dims * (2 if self.separate_embedding else 1)
                  + (1 if self.softmax_has_bias else 0))

  def pax_variables(self) -> str:
    return "lm"

  def compute_dtype(self) -> str:
    return np.dtype(self.fprop_dtype).name

  def prompt_and_target(self, host_batch: dict[str, np.ndarray]
                        ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    ids, weights, labels = host_batch["ids"], host_batch["weights"], host_batch["labels"]
    lens = host_batch.get("prompt_lens", np.ones(len(ids), np.int32))
    prompts = [ids[r, :int(lens[r])] for r in range(len(ids))]
    # The target continues the prompt: a chat row's earlier replies are prompt, not target.
    starts = [max(int(lens[r]), 1) - 1 for r in range(len(ids))]
    targets = [labels[r, s:][weights[r, s:] > 0] for r, s in enumerate(starts)]
    return prompts, targets, weights.any(axis=-1)

