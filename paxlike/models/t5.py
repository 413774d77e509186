"""T5 / Flan-T5: an encoder-decoder Transformer with relative position biases.

Batches use T5X / seqio's feature names: `encoder_input_tokens` [B, S],
`decoder_input_tokens`, `decoder_target_tokens` [B, T] (int32) and
`decoder_loss_weights` [B, T] (float32). Packed batches (several examples
per row) add `encoder_segment_ids` / `decoder_segment_ids` (0 = padding)
and may add `encoder_positions` / `decoder_positions`; attention and
relative positions then never cross an example's boundary. Without segment
ids, encoder padding is masked out as a key in the encoder's self-attention
and in cross-attention: a row's padding is what follows its last token that
is not pad_id (T5X masks each pad_id; the two differ only for a pad_id
inside a row, which no T5 tokenizer writes). Padding that trails lets cuDNN
take it as its own padding mask (paxlike.layers.attention.KeyLengths), with
the relative-position bias at its batch of 1.

The parameter tree uses T5X's names (see paxlike.layers.t5), so
paxlike.interop.hf maps Hugging Face checkpoints onto it one to one:

    token_embedder/embedding
    encoder/relpos_bias/rel_embedding, encoder/layers_{i}/... (or encoder/layers/...
        scanned, leading 'layers' axis), encoder/encoder_norm/scale
    decoder/relpos_bias/rel_embedding, decoder/layers_{i}/..., decoder/decoder_norm/scale,
    decoder/logits_dense/kernel (untied only)

Decoding: prefill runs the encoder once and caches every decoder layer's
cross-attention keys/values, the encoder padding mask and zero
self-attention caches; each extend feeds one decoder position. The 'cache'
collection's leaves under a scanned `layers` lead with the layer axis, so
their batch axis is 1; every other leaf's is 0. Decode, infer and export run
a scanned model's unrolled twin (for_decoding), whose caches are per layer.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike import decoding, flops
from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.layers.attention import KeyLengths, key_lengths
from paxlike.layers.linear import lora_targets
from paxlike.layers.relative_position import RelativePositionBias
from paxlike.layers.t5 import (
  EXTEND,
  FFN_ACTIVATIONS,
  FULL,
  PREFILL,
  DenseGeneral,
  Embed,
  RmsNorm,
  T5DecoderLayer,
  T5EncoderLayer,
  dropout_active,
)
from paxlike.layers.transformer import remat_policy, rematerialises
from paxlike.models.base import BaseModel
from paxlike.models.language_model import weighted_loss

Dtype = Any

EMBED_AXES = ("batch", "length", "activation_embed")
VOCAB_AXES = ("batch", "length", "activation_vocab")


def run_layers(layer_cls: type[nn.Module], kwargs: dict[str, Any], num_layers: int,
               x: jax.Array, inputs: dict[str, Any], *, scanned: bool, checkpoint_policy: str,
               remat: bool, names: tuple[str, str] = ("layers", "layers_{}")) -> jax.Array:
  """num_layers layers over x, each reading the same `inputs` (biases, masks, cache index).

  Scanned: one `layers` module whose parameters (and caches) lead with a
  'layers' axis; otherwise `layers_0`, `layers_1`, ... (`names`: the scanned
  module's name and the unrolled ones' pattern). Must be called from a compact
  method (the layers become the caller's children).
  """
  if remat and rematerialises(checkpoint_policy):
    layer_cls = nn.remat(layer_cls, policy=remat_policy(checkpoint_policy),
                         prevent_cse=not scanned)
  if scanned:
    stack = nn.scan(layer_cls, variable_axes={"params": 0, "cache": 0},
                    split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
                    length=num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
    x, _ = stack(**kwargs, name=names[0])(x, inputs)
    return x
  for i in range(num_layers):
    x, _ = layer_cls(**kwargs, name=names[1].format(i))(x, inputs)
  return x


class T5Stack(nn.Module):
  """What encoder and decoder share: layer hyperparameters and the layer loop."""

  num_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "gated-gelu"
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  use_repeated_layer: bool = False
  checkpoint_policy: str = "SAVE_NOTHING"
  dtype: Dtype = jnp.float32
  lora_rank: int = 0
  lora_target_layers: str = "all"

  def layer_kwargs(self) -> dict[str, Any]:
    return dict(num_heads=self.num_heads, dim_per_head=self.dim_per_head,
                hidden_dims=self.hidden_dims, activation=self.activation,
                layer_norm_epsilon=self.layer_norm_epsilon, dropout_rate=self.dropout_rate,
                dtype=self.dtype, lora_rank=self.lora_rank,
                lora_target_layers=self.lora_target_layers)

  def relpos(self, bidirectional: bool) -> RelativePositionBias:
    return RelativePositionBias(self.relative_attention_num_buckets,
                                self.relative_attention_max_distance, self.num_heads,
                                bidirectional, self.dtype, name="relpos_bias")

  def final(self, x: jax.Array, name: str) -> jax.Array:
    """The stack's final norm, then dropout."""
    x = RmsNorm(self.layer_norm_epsilon, self.dtype, scale_in_float32=True, name=name)(x)
    x = nn.Dropout(self.dropout_rate)(
        x, deterministic=not dropout_active(self, self.dropout_rate))
    return nn.with_logical_constraint(x, EMBED_AXES)


class T5Encoder(T5Stack):
  """Embedded inputs -> encoder output (bidirectional self-attention)."""

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, positions: jax.Array) -> jax.Array:
    """x [B, S, d]; mask [B, 1, S|1, S] bool or KeyLengths; positions [B|1, S]."""
    bias = self.relpos(bidirectional=True)(positions, positions)
    x = run_layers(T5EncoderLayer, self.layer_kwargs(), self.num_layers, x,
                   {"bias": bias, "mask": mask}, scanned=self.use_repeated_layer,
                   checkpoint_policy=self.checkpoint_policy, remat=True)
    return self.final(x, "encoder_norm")


class T5Decoder(T5Stack):
  """Embedded decoder inputs + encoder output -> logits; or the decode cache's prefill/extend."""

  vocab_size: int = 0
  tie_embeddings: bool = False

  @nn.compact
  def __call__(self, y: jax.Array, *, mode: str = FULL, embedding: jax.Array | None = None,
               encoded: jax.Array | None = None, encoder_valid: jax.Array | None = None,
               self_mask: jax.Array | None = None, cross_mask: jax.Array | None = None,
               positions: jax.Array | None = None, index: jax.Array | None = None,
               cache_len: int = 0) -> jax.Array | None:
    """Per mode:

    FULL     y [B, T, d], encoded [B, S, d], self_mask [B, 1, T, T] or None (self-
             attention is causal besides it),
             cross_mask [B, 1, T|1, S] or KeyLengths, positions [B|1, T] -> logits
             [B, T, V].
    PREFILL  encoded, encoder_valid [B, S] bool, cache_len -> None (fills the cache).
    EXTEND   y [N, 1, d] at position `index` -> logits [N, 1, V].

    embedding: the token table, for tied logits.
    """
    relpos = self.relpos(bidirectional=False)
    kwargs = dict(self.layer_kwargs(), mode=mode, cache_len=cache_len)
    if mode == PREFILL:
      rows = encoded.shape[0]
      self.variable("cache", "encoder_valid", jnp.zeros, encoder_valid.shape,
                    jnp.bool_).value = encoder_valid
      # Positions of the self-attention cache slots: the keys each extend attends.
      self.variable("cache", "key_positions", jnp.zeros, (rows, cache_len),
                    jnp.int32).value = jnp.broadcast_to(
                        jnp.arange(cache_len, dtype=jnp.int32), (rows, cache_len))
      run_layers(T5DecoderLayer, kwargs, self.num_layers, encoded[:, :1],
                 {"encoded": encoded}, scanned=self.use_repeated_layer,
                 checkpoint_policy=self.checkpoint_policy, remat=False)
      return None
    if mode == EXTEND:
      valid = self.variable("cache", "encoder_valid", jnp.zeros, (0,), jnp.bool_).value
      key_pos = self.variable("cache", "key_positions", jnp.zeros, (0,), jnp.int32).value
      query_pos = jnp.full((key_pos.shape[0], 1), index, jnp.int32)
      inputs = {"self_bias": relpos(query_pos, key_pos),
                "self_mask": (key_pos <= index)[:, None, None, :],
                "cross_mask": valid[:, None, None, :], "index": index}
    else:
      inputs = {"self_bias": relpos(positions, positions), "self_mask": self_mask,
                "cross_mask": cross_mask, "encoded": encoded}
    x = run_layers(T5DecoderLayer, kwargs, self.num_layers, y, inputs,
                   scanned=self.use_repeated_layer, checkpoint_policy=self.checkpoint_policy,
                   remat=mode == FULL)
    x = self.final(x, "decoder_norm")
    if self.tie_embeddings:
      # Original T5: the tied head scales the decoder output by d**-0.5 first.
      x = x * jnp.asarray(x.shape[-1] ** -0.5, self.dtype)
      logits = jnp.einsum("btd,vd->btv", x, embedding.astype(self.dtype))
    else:
      logits = DenseGeneral((self.vocab_size,), ("embed", "vocab"),
                            distribution="truncated_normal", dtype=self.dtype,
                            name="logits_dense")(x)
    return nn.with_logical_constraint(logits, VOCAB_AXES)


def _names(path: tuple[Any, ...]) -> list[str]:
  return [str(getattr(p, "key", p)) for p in path]


def _segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
  """[B, 1, Tq, Tk]: True where query and key belong to the same example."""
  return q_segments[:, None, :, None] == k_segments[:, None, None, :]


class T5Model(BaseModel):
  """T5 / Flan-T5 (T5 v1.1) for paxlike's model contract; see the module docstring.

  activation "gated-gelu" with untied embeddings is T5 v1.1 / Flan-T5;
  "relu" with tie_embeddings is the original T5.
  """

  vocab_size: int
  model_dims: int
  num_encoder_layers: int
  num_decoder_layers: int
  num_heads: int
  dim_per_head: int
  hidden_dims: int
  activation: str = "gated-gelu"
  tie_embeddings: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  use_repeated_layer: bool = False
  checkpoint_policy: str = "SAVE_NOTHING"
  fprop_dtype: Dtype = jnp.float32
  max_target_len: int = 64  # decode length when DecodeSettings.max_decode_length is None
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0
  # Pax's USE_LORA: LORA_RANK-wide adapters on LORA_TARGET_LAYERS' projections ("all",
  # "attention": every attention's query/key/value/out, "mlp": wi_0/wi_1/wo); 0: none.
  lora_rank: int = 0
  lora_target_layers: str = "all"

  def setup(self) -> None:
    lora_targets(self.lora_rank, self.lora_target_layers)
    if self.activation not in FFN_ACTIVATIONS:
      raise UserError(f"ACTIVATION={self.activation!r} is not one of {FFN_ACTIVATIONS}.")
    self.token_embedder = Embed(self.vocab_size, self.model_dims, self.fprop_dtype)
    stack = dict(num_heads=self.num_heads, dim_per_head=self.dim_per_head,
                 hidden_dims=self.hidden_dims, activation=self.activation,
                 relative_attention_num_buckets=self.relative_attention_num_buckets,
                 relative_attention_max_distance=self.relative_attention_max_distance,
                 layer_norm_epsilon=self.layer_norm_epsilon, dropout_rate=self.dropout_rate,
                 use_repeated_layer=self.use_repeated_layer,
                 checkpoint_policy=self.checkpoint_policy, dtype=self.fprop_dtype,
                 lora_rank=self.lora_rank, lora_target_layers=self.lora_target_layers)
    self.encoder = T5Encoder(num_layers=self.num_encoder_layers, **stack)
    self.decoder = T5Decoder(num_layers=self.num_decoder_layers, vocab_size=self.vocab_size,
                             tie_embeddings=self.tie_embeddings, **stack)
    self.embed_dropout = nn.Dropout(self.dropout_rate)

  # ------------------------------------------------------------- forward

  def _embed(self, ids: jax.Array) -> jax.Array:
    x = self.token_embedder(ids)
    x = self.embed_dropout(x, deterministic=not dropout_active(self, self.dropout_rate))
    return nn.with_logical_constraint(x, EMBED_AXES)

  def _segments(self, batch: dict[str, jax.Array]) -> tuple[jax.Array | None, jax.Array | None]:
    enc, dec = batch.get("encoder_segment_ids"), batch.get("decoder_segment_ids")
    if (enc is None) != (dec is None):
      raise UserError("a packed T5 batch needs both encoder_segment_ids and "
                      "decoder_segment_ids; give both or neither.")
    return enc, dec

  def _encoder_keys(self, batch: dict[str, jax.Array]) -> KeyLengths | jax.Array:
    """The encoder positions anyone may attend: KeyLengths (each row's tokens up to its last
    that is not pad_id, at least one) or, packed, [B, S] bool (segment id above 0)."""
    segments = batch.get("encoder_segment_ids")
    if segments is not None:
      return segments > 0
    return key_lengths(batch["encoder_input_tokens"] != self.pad_id)

  def _encoder_valid(self, batch: dict[str, jax.Array]) -> jax.Array:
    """[B, S] bool: _encoder_keys spelt out (the decode cache's cross-attention mask)."""
    keys = self._encoder_keys(batch)
    if isinstance(keys, KeyLengths):
      return keys.spelt_out(batch["encoder_input_tokens"].shape[1])[:, 0, 0, :]
    return keys

  def encode(self, batch: dict[str, jax.Array]) -> jax.Array:
    """The encoder output [B, S, d] (after the final norm)."""
    tokens = batch["encoder_input_tokens"]
    enc_seg, _ = self._segments(batch)
    mask = self._encoder_keys(batch)
    if enc_seg is not None:
      mask = mask[:, None, None, :] & _segment_mask(enc_seg, enc_seg)
    positions = batch.get("encoder_positions")
    if positions is None:  # numpy: the position bias's buckets become constants
      positions = np.arange(tokens.shape[1], dtype=np.int32)[None]
    return self.encoder(self._embed(tokens), mask, positions)

  def __call__(self, batch: dict[str, jax.Array]) -> jax.Array:
    """Decoder logits [B, T, vocab] in float32 (teacher forcing on decoder_input_tokens)."""
    encoded = self.encode(batch)
    dec_tokens = batch["decoder_input_tokens"]
    length = dec_tokens.shape[1]
    enc_seg, dec_seg = self._segments(batch)
    self_mask = None  # the decoder's self-attention is causal: no [T, T] mask is built
    cross_mask = self._encoder_keys(batch)
    if dec_seg is not None:
      self_mask = _segment_mask(dec_seg, dec_seg)
      cross_mask = cross_mask[:, None, None, :] & _segment_mask(dec_seg, enc_seg)
    positions = batch.get("decoder_positions")
    if positions is None:
      positions = np.arange(length, dtype=np.int32)[None]
    logits = self.decoder(self._embed(dec_tokens), mode=FULL,
                          embedding=self.token_embedder.embedding, encoded=encoded,
                          self_mask=self_mask, cross_mask=cross_mask, positions=positions)
    return logits.astype(jnp.float32)

  def fprop(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Returns (mean weighted cross-entropy, metrics)."""
    return weighted_loss(self(batch), batch["decoder_target_tokens"],
                         batch["decoder_loss_weights"])

  # ------------------------------------------------------------- decoding

  def prefill(self, batch: dict[str, jax.Array],
              settings: decoding.DecodeSettings) -> decoding.DecodeStart:
    """Encodes once and fills the decoder's caches; decoding starts at position 0."""
    num_steps = settings.max_decode_length or self.max_target_len
    encoded = self.encode(batch)
    self.decoder(encoded, mode=PREFILL, encoded=encoded,
                 encoder_valid=self._encoder_valid(batch), cache_len=num_steps)
    rows = encoded.shape[0]
    return decoding.DecodeStart(
        first_tokens=jnp.full((rows,), self.decoder_start_id, jnp.int32),
        start_index=jnp.zeros((), jnp.int32),
        forced_tokens=jnp.zeros((rows, num_steps), jnp.int32),
        forced_mask=jnp.zeros((rows, num_steps), jnp.bool_),
        limit=jnp.asarray(num_steps, jnp.int32), num_steps=num_steps)

  def extend(self, tokens: jax.Array, index: jax.Array) -> jax.Array:
    """tokens [N] at decoder position `index` -> next-token logits [N, vocab] float32."""
    logits = self.decoder(self._embed(tokens[:, None]), mode=EXTEND,
                          embedding=self.token_embedder.embedding, index=index)
    return logits[:, 0].astype(jnp.float32)

  def cache_batch_axis(self, path: tuple[Any, ...]) -> int:
    """A scanned stack's cache leaves lead with the layer axis; the rest with the example."""
    return 1 if self.use_repeated_layer and "layers" in _names(path) else 0

  def for_decoding(self) -> T5Model:
    """Both stacks unrolled (BaseModel.for_decoding): the decoder's for its caches, and
    the encoder, which runs once per decode, with it (one field sets both)."""
    if not self.use_repeated_layer:
      return self
    return self.clone(use_repeated_layer=False, parent=None)

  def restack_params(self, params: Any) -> Any:
    """params (either layer layout, read off the tree itself) in this model's layout:
    each stack's layers as `layers` [L, ...] scanned, else `layers_i`."""
    out = dict(params)
    for name, n in (("encoder", self.num_encoder_layers), ("decoder", self.num_decoder_layers)):
      stack = params.get(name)
      if isinstance(stack, dict):
        layout = pipeline.Layout(n, self.use_repeated_layer)
        out[name] = pipeline.from_stack(
            pipeline.restack(pipeline.to_stack(stack), n, layout), stack)
    return out

  # -------------------------------------------------------- plain methods

  def input_features(self) -> tuple[str, ...]:
    return ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
            "decoder_loss_weights")

  def decode_features(self) -> tuple[str, ...]:
    return ("encoder_input_tokens",)

  def flops_dims(self, input_len: int, target_len: int) -> flops.EncDecDims:
    return flops.EncDecDims(
        num_encoder_layers=self.num_encoder_layers, num_decoder_layers=self.num_decoder_layers,
        model_dims=self.model_dims, hidden_dims=self.hidden_dims, num_heads=self.num_heads,
        dims_per_head=self.dim_per_head, vocab_size=self.vocab_size, input_len=input_len,
        target_len=target_len, gated=self.activation.startswith("gated"),
        lora_rank=self.lora_rank, lora_target_layers=self.lora_target_layers)

  def model_flops_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> float:
    batch, input_len = specs["encoder_input_tokens"].shape[:2]
    target_len = specs["decoder_input_tokens"].shape[1]
    return flops.enc_dec_flops_per_step(self.flops_dims(input_len, target_len), batch)

  def tokens_per_step(self, specs: dict[str, jax.ShapeDtypeStruct]) -> int:
    batch, input_len = specs["encoder_input_tokens"].shape[:2]
    return int(batch * (input_len + specs["decoder_input_tokens"].shape[1]))

  def compute_dtype(self) -> str:
    return np.dtype(self.fprop_dtype).name

  def special_ids(self) -> dict[str, int]:
    return {"eos_id": self.eos_id, "pad_id": self.pad_id}

  def prompt_and_target(self, host_batch: dict[str, np.ndarray]
                        ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    inputs = host_batch["encoder_input_tokens"]
    prompts = [row[row != self.pad_id] for row in inputs]
    if "decoder_target_tokens" not in host_batch:  # a predict-only input: no references
      real = (inputs != self.pad_id).any(axis=-1)
      return prompts, [np.zeros((0,), inputs.dtype) for _ in prompts], real
    weights = host_batch["decoder_loss_weights"]
    targets = [t[w > 0] for t, w in zip(host_batch["decoder_target_tokens"], weights,
                                        strict=True)]
    return prompts, targets, weights.any(axis=-1)

  def padding_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**host_batch,
            "decoder_loss_weights": np.zeros_like(host_batch["decoder_loss_weights"])}

  def hf_config(self) -> dict[str, Any]:
    """The transformers T5Config (as config.json) this model corresponds to."""
    if self.activation not in FFN_ACTIVATIONS:
      raise UserError(f"ACTIVATION={self.activation!r} is not one of {FFN_ACTIVATIONS}.")
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "d_model": self.model_dims,
        "d_ff": self.hidden_dims,
        "d_kv": self.dim_per_head,
        "num_heads": self.num_heads,
        "num_layers": self.num_encoder_layers,
        "num_decoder_layers": self.num_decoder_layers,
        "vocab_size": self.vocab_size,
        "feed_forward_proj": self.activation,
        "tie_word_embeddings": self.tie_embeddings,
        # transformers >= 5 always ties lm_head to shared in the config object and keeps
        # the d**-0.5 output scale apart under this name; writing it keeps both readings.
        "scale_decoder_outputs": self.tie_embeddings,
        "relative_attention_num_buckets": self.relative_attention_num_buckets,
        "relative_attention_max_distance": self.relative_attention_max_distance,
        "layer_norm_epsilon": self.layer_norm_epsilon,
        "dropout_rate": self.dropout_rate,
        "initializer_factor": 1.0,
        "pad_token_id": self.pad_id,
        "eos_token_id": self.eos_id,
        "decoder_start_token_id": self.decoder_start_id,
        "is_encoder_decoder": True,
        "use_cache": True,
    }
