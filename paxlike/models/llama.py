"""The Llama family (Llama 2/3.x, Mistral, Qwen2/2.5): a decoder-only model on the contract.

Batches use the LM's feature names: int `ids`, `labels` [B, T] and float
`weights` [B, T] (0 for padding). Packed rows (several examples per row)
add `segment_ids` (1, 2, ... per example, 0 = padding) and `positions`
(restarting at 0 for each example): attention never crosses an example and
the rotary positions restart with it. Decoding reads `ids` and `prompt_lens`
as the LM does (row r's prompt is ids[r, :prompt_lens[r]]).

Parameter tree (Hugging Face's names; `layers` scanned with a leading
'layers' axis, or `layers_{i}`; pipelined (NUM_STAGES, as the LM's),
`layers/pipeline/{repeat|x_layers_j}` with leading [circular_repeat, stage]
axes; decoding and export restack any of them to `layers_{i}`, see
BaseModel.for_decoding):

    embed_tokens/embedding               [vocab, embed]
    layers/input_layernorm/scale, layers/self_attn/{q,k,v}_proj/w (and /b with
        QKV_BIAS), layers/self_attn/o_proj/w, layers/post_attention_layernorm/scale,
        layers/mlp/{gate,up,down}_proj/w
    norm/scale
    lm_head/w                            [embed, vocab] (untied only)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike import decoding, flops
from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.layers.linear import lora_targets
from paxlike.layers.llama import (
  EMBED_AXES,
  EXTEND,
  FULL,
  PREFILL,
  LlamaDecoderLayer,
  RmsNorm,
  VocabHead,
  rope_inv_freq,
)
from paxlike.layers.transformer import remat_policy, rematerialises
from paxlike.models.base import BaseModel
from paxlike.models.language_model import LanguageModel, weighted_loss
from paxlike.models.t5 import run_layers

Dtype = Any


class LlamaModel(pipeline.PipelinedModel, BaseModel):
  """Token ids -> next-token logits: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

  vocab_size: int
  model_dims: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  hidden_dims: int
  tie_embeddings: bool = False
  rope_theta: float = 10000.0
  rope_scaling: Any = None  # a config.json rope_scaling dict (rope_type llama3) or None
  norm_epsilon: float = 1e-5
  qkv_bias: bool = False
  max_seq_len: int = 2048  # max_position_embeddings in the HF config
  use_repeated_layer: bool = True
  checkpoint_policy: str = "SAVE_NOTHING"
  fprop_dtype: Dtype = jnp.float32
  eos_id: int = 1
  pad_id: int = 0
  # Pax's pipeline (NUM_STAGES; None: none), as the LM's (paxlike.layers.pipeline).
  num_stages: int | None = None
  circular_repeat: int = 1
  num_microbatches: int | None = None  # the pipeline's; or microbatch_size
  microbatch_size: int | None = None
  stream_io: bool = False
  # Pax's USE_LORA: LORA_RANK-wide adapters on LORA_TARGET_LAYERS' projections ("all",
  # "attention": q/k/v/o_proj, "mlp": gate/up/down_proj); 0: none. See lora_output.
  lora_rank: int = 0
  lora_target_layers: str = "all"

  def setup(self) -> None:
    lora_targets(self.lora_rank, self.lora_target_layers)
    if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
      raise UserError(f"NUM_KV_HEADS={self.num_kv_heads} must divide NUM_HEADS="
                      f"{self.num_heads}.")
    self.embed_tokens = self.param(
        "embed_tokens", nn.with_logical_partitioning(
            nn.initializers.normal(stddev=0.02), ("vocab", "embed")),
        (self.vocab_size, self.model_dims), jnp.float32)
    self.norm = RmsNorm(self.norm_epsilon, self.fprop_dtype)
    if not self.tie_embeddings:
      self.lm_head = VocabHead(self.vocab_size, self.fprop_dtype)

  def _layers(self, x: jax.Array, inputs: dict[str, Any], mode: str) -> jax.Array:
    kwargs = dict(num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                  head_dim=self.head_dim, hidden_dims=self.hidden_dims,
                  inv_freq=tuple(float(f) for f in rope_inv_freq(
                      self.head_dim, self.rope_theta, self.rope_scaling)),
                  qkv_bias=self.qkv_bias, norm_epsilon=self.norm_epsilon,
                  dtype=self.fprop_dtype, mode=mode, lora_rank=self.lora_rank,
                  lora_target_layers=self.lora_target_layers)
    if self.num_stages is not None:
      if mode != FULL:
        raise UserError("a pipelined Llama decodes through its unpipelined model "
                        "(LlamaModel.for_decoding); it has no KV cache of its own.")
      return _PipelinedLayers(tuple(kwargs.items()), self.layout(), self.checkpoint_policy,
                              self.num_microbatches, self.microbatch_size, self.stream_io,
                              name="layers")(x, inputs)
    return run_layers(LlamaDecoderLayer, kwargs, self.num_layers, x, inputs,
                      scanned=self.use_repeated_layer, checkpoint_policy=self.checkpoint_policy,
                      remat=mode == FULL)

  @nn.compact
  def __call__(self, ids: jax.Array, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None, mode: str = FULL,
               index: jax.Array | None = None) -> jax.Array:
    """[B, T] ids -> [B, T, vocab] float32 logits.

    positions [B, T] default to 0..T-1 (index.. for an extend); segment_ids
    [B, T] keep packed examples apart.
    """
    x = jnp.take(self.embed_tokens, ids, axis=0).astype(self.fprop_dtype)
    x = nn.with_logical_constraint(x, EMBED_AXES)
    if positions is None:
      start = 0 if index is None else index
      positions = (start + jnp.arange(ids.shape[1], dtype=jnp.int32))[None]
    inputs: dict[str, Any] = {"positions": positions}
    if segment_ids is not None:
      inputs["segment_ids"] = segment_ids
    if index is not None:
      inputs["index"] = index
    x = self._layers(x, inputs, mode)
    # Outside a pipeline the head runs data-parallel over every core, stages included.
    batch_axis = "batch" if self.num_stages is None else "pipeline_batch"
    x = nn.with_logical_constraint(x, (batch_axis, "length", "activation_embed"))
    x = self.norm(x)
    if self.tie_embeddings:
      logits = jnp.einsum("btd,vd->btv", x, self.embed_tokens.astype(self.fprop_dtype))
    else:
      logits = self.lm_head(x)
    logits = nn.with_logical_constraint(logits, (batch_axis, "length", "activation_vocab"))
    return logits.astype(jnp.float32)

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Returns (mean weighted cross-entropy, metrics)."""
    logits = self(batch["ids"], batch.get("positions"), batch.get("segment_ids"))
    return weighted_loss(logits, batch["labels"], batch["weights"])

  # ------------------------------------------------------------- decoding

  def prefill(self, batch: dict[str, jax.Array],
              settings: decoding.DecodeSettings) -> decoding.DecodeStart:
    """One pass over the prompt buffer fills every layer's KV cache (the LM's scheme,
    decoding.prompt_start)."""
    return decoding.prompt_start(batch, settings, lambda tokens: self(tokens, mode=PREFILL))

  def extend(self, tokens: jax.Array, index: jax.Array) -> jax.Array:
    """tokens [N] at position `index` -> next-token logits [N, vocab] float32."""
    return self(tokens[:, None], mode=EXTEND, index=index)[:, 0]

  def finish_decode(self, batch: dict[str, jax.Array], start: decoding.DecodeStart,
                    out: decoding.DecodeOutput,
                    settings: decoding.DecodeSettings) -> decoding.DecodeOutput:
    """Drops each row's forced prompt, as the LM does (the same decode features)."""
    return LanguageModel.finish_decode(self, batch, start, out, settings)

  def cache_batch_axis(self, path: tuple[Any, ...]) -> int:
    return 1 if self.use_repeated_layer else 0  # scanned leaves lead with the layer axis

  # ------------------------------------------------------ layer layouts

  def restack_params(self, params: Any) -> Any:
    """params (of any layer layout, read off the tree itself) in this model's layout."""
    stack = pipeline.restack(pipeline.to_stack(params), self.num_layers, self.layout())
    return pipeline.from_stack(stack, params)

  def stack_form(self) -> LlamaStackForm:
    return LlamaStackForm()

  # -------------------------------------------------------- plain methods

  def input_features(self) -> tuple[str, ...]:
    return ("ids", "labels", "weights")

  def decode_features(self) -> tuple[str, ...]:
    return ("ids", "prompt_lens")

  def flops_dims(self, seq_len: int) -> flops.LlamaDims:
    return flops.LlamaDims(self.num_layers, self.model_dims, self.hidden_dims, self.num_heads,
                           self.num_kv_heads, self.head_dim, self.vocab_size, seq_len,
                           adapter_params=self.num_layers * flops.lora_adapter_params(
                               self.lora_rank, self.lora_target_layers, self.model_dims,
                               self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                               self.hidden_dims, 3))

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    batch, seq_len = specs["ids"].shape[:2]
    return flops.llama_flops_per_step(self.flops_dims(seq_len), batch)

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    return int(np.prod(specs["ids"].shape[:2]))

  def compute_dtype(self) -> str:
    return np.dtype(self.fprop_dtype).name

  def special_ids(self) -> dict[str, int]:
    return {"eos_id": self.eos_id, "pad_id": self.pad_id}

  def prompt_and_target(self, host_batch: dict[str, np.ndarray]
                        ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    return LanguageModel.prompt_and_target(self, host_batch)

  def pax_variables(self) -> str:
    return "llama"

  def hf_config(self) -> dict[str, Any]:
    """The transformers config (config.json) of this model: Llama, or Qwen2 with QKV_BIAS."""
    from paxlike.interop import hf_llama

    return hf_llama.model_config(self)


class _LlamaStage(nn.Module):
  """One pipeline stage: num_layers decoder layers, scanned (`repeat`) or unrolled
  (`x_layers_j`), the names paxlike.layers.pipeline's layouts use."""

  layer_kwargs: tuple[tuple[str, Any], ...]
  num_layers: int
  scanned: bool
  checkpoint_policy: str  # pipeline.Layout.stage_policy

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, Any]) -> jax.Array:
    return run_layers(LlamaDecoderLayer, dict(self.layer_kwargs), self.num_layers, x, inputs,
                      scanned=self.scanned, checkpoint_policy=self.checkpoint_policy,
                      remat=True, names=("repeat", "x_layers_{}"))


class _PipelinedLayers(nn.Module):
  """The decoder layers pipelined over the mesh's 'stage' axis (the parameter `pipeline`)."""

  layer_kwargs: tuple[tuple[str, Any], ...]
  layout: pipeline.Layout
  checkpoint_policy: str
  num_microbatches: int | None
  microbatch_size: int | None
  stream_io: bool

  @nn.compact
  def __call__(self, x: jax.Array, inputs: dict[str, Any]) -> jax.Array:
    stage = _LlamaStage(self.layer_kwargs, self.layout.layers_per_stage,
                        self.layout.use_repeated_layer,
                        self.layout.stage_policy(self.checkpoint_policy), parent=None)

    def init_stage(key: jax.Array, sample: jax.Array) -> Any:
      positions = jnp.arange(sample.shape[1], dtype=jnp.int32)[None]
      return stage.init({"params": key}, sample, {"positions": positions})["params"]

    def apply_stage(w: Any, h: jax.Array, seg: Any, pos: Any, key: Any
                    ) -> tuple[jax.Array, dict[str, jax.Array]]:
      del key  # the Llama family has no dropout
      stage_inputs = {"positions": pos, **({} if seg is None else {"segment_ids": seg})}
      return stage.apply({"params": w}, h, stage_inputs), {}

    return pipeline.stacked(
        self, self.layout, x, init_stage=init_stage, apply_stage=apply_stage,
        num_microbatches=self.num_microbatches, microbatch_size=self.microbatch_size,
        policy=remat_policy(self.checkpoint_policy),
        remat=rematerialises(self.checkpoint_policy),
        stream_io=self.stream_io, segment_ids=inputs.get("segment_ids"),
        positions=inputs["positions"])[0]


STACK_KEY = "transformer"  # paxlike.relayout's layer stack key


@dataclasses.dataclass(frozen=True)
class LlamaStackForm(pipeline.StackForm):
  """paxlike.relayout reads layer stacks as `transformer` subtrees (the LM's form): this
  puts a stored state's Llama layers (top-level `layers`, `layers_i`) in that form and
  back, at every params-like node (the parameters and each optimizer slot mirroring
  them)."""

  def to(self, tree: Any) -> Any:
    return _map_params_nodes(tree, lambda node: {
        **{k: v for k, v in node.items() if k != "layers" and not pipeline.LAYER_KEY.match(k)},
        STACK_KEY: pipeline.to_stack(node)})

  def back(self, tree: Any) -> Any:
    return _map_params_nodes(tree, lambda node: pipeline.from_stack(
        node[STACK_KEY], {k: v for k, v in node.items() if k != STACK_KEY}))

  def name(self, name: str) -> str:
    """A parameter or slot name (`params/layers_3/mlp/...`) as `to` names it."""
    parts = name.split("/")
    for i, part in enumerate(parts):
      if part == "layers" or pipeline.LAYER_KEY.match(part):
        nested = parts[i + 1:i + 2] == [pipeline.PIPELINE_PARAM]
        new = ([STACK_KEY] if nested else [STACK_KEY, "repeat"]) if part == "layers" \
            else [STACK_KEY, f"x_{part}"]
        return "/".join([*parts[:i], *new, *parts[i + 1:]])
    return name


def _map_params_nodes(tree: Any, fn: Any) -> Any:
  """tree with fn applied to every dict that holds a Llama parameter tree's top level
  (its `embed_tokens`), through dicts, lists and tuples."""
  if isinstance(tree, dict):
    if "embed_tokens" in tree:
      return fn(tree)
    return {k: _map_params_nodes(v, fn) for k, v in tree.items()}
  if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
    return type(tree)(_map_params_nodes(v, fn) for v in tree)
  return tree
