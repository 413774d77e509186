"""Unregistered experiment templates for Transformer LMs, with Pax's defaults.

The shipped experiments in experiments/lm/ subclass these (model template x
data mixin x size), as Pax's lm_cloud.py subclasses its model_params. Every
derived value is computed in task()/datasets() from `self.X`, so a `--set`
override of X reaches everything that depends on it.

The templates carry the values of Pax's templates of the same name (paxml's
tasks/lm/model_params.py and c4.py's TransformerLmSpmdAdam): pod-sized,
bfloat16 or float32 as Pax has them. They define no input sizes
(MAX_SEQ_LEN, PERCORE_BATCH_SIZE): those belong to the data mixin, so a class
written in Pax's order, `class X(Template, DataMixin)`, gets the mixin's.
The CPU-sized values live in the CPU experiments.
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.experiment import warn
from paxlike.file_data import FilesDataset
from paxlike.inputs.synthetic import SyntheticLmInput
from paxlike.layers import activations
from paxlike.layers.activations import activation_name
from paxlike.layers.embedding import LOOKUP_STYLES
from paxlike.layers.linear import ACTIVATIONS
from paxlike.layers.transformer import NORM_POLICIES
from paxlike.models.language_model import LanguageModel
from paxlike.pax.config_tree import LmConfig
from paxlike.training_experiment import AdamTraining, LoraHParams, PaxLearner

# The Adam knobs whose 0 Pax's c4.py reads as this default (`cls.ADAM_BETA1 if
# cls.ADAM_BETA1 else 0.9`); paxlike runs the 0, and says so.
PAX_FALSY_DEFAULTS = {"ADAM_BETA1": 0.9, "ADAM_BETA2": 0.999, "ADAM_EPSILON": 1e-6,
                      "CLIP_GRADIENT_NORM_TO_VALUE": 5.0, "ADAM_CLIP_THRESHOLD": 1.0}


class TransformerLmSpmdAdam(PaxLearner, LoraHParams, AdamTraining):
  """A decoder-only Transformer LM trained with Adam on a device mesh.

  Pax's c4.TransformerLmSpmdAdam: its own values, and those it inherits
  from model_params.TransformerLmSpmdAdafactor. Like Pax's, it sets both
  NUM_HEADS and DIMS_PER_HEAD; a subclass sets the dims that fit together.
  The model knobs below the dims carry Pax's template defaults: logit caps
  on, packed input honoured, pre-norm, tied tables, no gate.
  """

  MODEL_CLASS = LanguageModel  # Pax's: the model task_p.model configures; a LanguageModel
  NUM_LAYERS = 32
  MODEL_DIMS = 1024
  HIDDEN_DIMS = None  # None: 4 x MODEL_DIMS
  NUM_HEADS = 16  # None: MODEL_DIMS // DIMS_PER_HEAD
  DIMS_PER_HEAD = 128  # None: MODEL_DIMS // NUM_HEADS
  VOCAB_SIZE = 32000
  FPROP_DTYPE = jnp.float32
  USE_REPEATED_LAYER = False
  CHECKPOINT_POLICY = "SAVE_NOTHING"
  COMBINE_QKV = True
  ACTIVATION = "relu"

  # Pax's model knobs, with Pax's template defaults.
  ACTIVATION_CLS = activations.ReLU  # Pax's name; ACTIVATION (a string) is the other spelling
  USE_GATED_ACTIVATION = False
  TRAINABLE_POSITION_EMB = False  # True: a learned position table instead of sinusoids
  TRAINABLE_PE_MAX_SEQ_LEN = 16 * 1024
  SEPARATE_EMBEDDING = False  # True: the input table is not the softmax's
  USE_BIAS = False  # biases on the attention's q/k/v and output projections
  ATTEN_LOGIT_CAP = 50.0  # cap * tanh(logits / cap) on attention logits; <= 0: none
  SOFTMAX_CAP_LOGITS = 30.0  # the same on the output logits; <= 0: none
  PACKED_INPUT = True  # honour the batch's segment_ids / segment_pos when it has them
  DROPOUT_PROB = 0.0
  LAYERNORM_EPSILON = 1e-6
  NORM_POLICY = "pre"  # or 'post', 'primer_hybrid'
  EMBEDDING_LOOKUP_STYLE = "index"  # or 'matmul' (one-hot matmul, as Pax can)
  # Two parameters praxis's LM layers have by default; Pax's GPT-3 (c4's
  # C4SpmdGpt3AdamOrgHP) switches both off in its task().
  SOFTMAX_HAS_BIAS = True  # praxis softmax_tpl.feed_forward_tpl.has_bias: a [vocab] logit bias
  PER_DIM_SCALE = True  # praxis tr_atten_tpl.internal_enable_per_dim_scale: learned query scale
  # Pax's RELATIVE_BIAS: praxis's RelativeBias in every layer's attention (32 causal T5-style
  # buckets up to distance 128, a [buckets, heads] table per layer), beside the positions.
  RELATIVE_BIAS = False
  # Pax's USE_ROTARY_POSITION_EMB: rotary positions (praxis's timescales 1 to 10^4) on every
  # layer's queries and keys, beside the position embedding; not with RELATIVE_BIAS.
  USE_ROTARY_POSITION_EMB = False
  ENABLE_DCONV = False  # Pax's Primer q/k/v depthwise convolution: refused when True

  LEARNING_RATE = 1e-3
  ADAM_BETA1 = 0.9
  ADAM_BETA2 = 0.99
  ADAM_EPSILON = 1e-6
  WEIGHT_DECAY = 1e-3
  CLIP_GRADIENT_NORM_TO_VALUE = 5.0
  LR_SCHEDULE = "linear_rampup_exponential_decay"
  LR_LRED_WARMUP = 4000
  LR_LRED_DECAY_START = 4001
  LR_LRED_DECAY_END = 300000
  LR_LRED_MIN_RATIO = 0.1

  NUM_TRAIN_STEPS = 10_000_000  # Pax's task default (1e7): a Pax LM trains until stopped
  CHECKPOINT_EVERY_N_STEPS = 5000
  SUMMARY_INTERVAL_STEPS = 100
  EVAL_INTERVAL_STEPS = 100
  ICI_MESH_SHAPE = None  # Pax: a subclass sets the mesh; None runs the pmap loop
  TRAINING_OPTIMIZED_SHARDING = True
  # Pax's switch to the expert-parallel mesh [replica, data, data_expert, mdl]: 4-axis
  # ICI/DCN shapes; the experts go over data_expert (paxlike.mesh).
  USE_EXPERT_PARALLEL = False
  # Pax's USE_FP8: every layer's attention and feed-forward projections in FP8 with
  # delayed scaling (paxlike.layers.linear.fp8_project); FP8 matmuls on GPUs that have them.
  USE_FP8 = False

  def validate(self) -> None:
    super().validate()
    # MAX_SEQ_LEN and PERCORE_BATCH_SIZE come from the data mixin, when it has them.
    self.check_positive(*(n for n in (
        "NUM_LAYERS", "MODEL_DIMS", "VOCAB_SIZE", "MAX_SEQ_LEN", "PERCORE_BATCH_SIZE",
        "NUM_TRAIN_STEPS", "CHECKPOINT_EVERY_N_STEPS", "SUMMARY_INTERVAL_STEPS")
        if hasattr(self, n)))
    self.check_heads()
    if (self.NUM_HEADS is not None and self.DIMS_PER_HEAD is not None
        and self.NUM_HEADS * self.DIMS_PER_HEAD != self.MODEL_DIMS):
      raise UserError(f"MODEL_DIMS={self.MODEL_DIMS} is not NUM_HEADS x DIMS_PER_HEAD = "
                      f"{self.NUM_HEADS} x {self.DIMS_PER_HEAD}, which Pax's LM requires; set "
                      "DIMS_PER_HEAD=None (or NUM_HEADS=None) to derive it from the other.")
    self.activation()
    self.model_class()
    if self.NORM_POLICY not in NORM_POLICIES:
      raise UserError(f"NORM_POLICY={self.NORM_POLICY!r} is not one of {list(NORM_POLICIES)}.")
    if self.EMBEDDING_LOOKUP_STYLE not in LOOKUP_STYLES:
      raise UserError(f"EMBEDDING_LOOKUP_STYLE={self.EMBEDDING_LOOKUP_STYLE!r} is not one of "
                      f"{list(LOOKUP_STYLES)}.")
    if not 0.0 <= self.DROPOUT_PROB < 1.0:
      raise UserError(f"DROPOUT_PROB must be in [0, 1), got {self.DROPOUT_PROB}.")
    if zeros := [f"{n}=0 (Pax: {d})" for n, d in PAX_FALSY_DEFAULTS.items()
                 if getattr(self, n, None) == 0 and not isinstance(getattr(self, n), bool)]:
      warn(f"{type(self).__name__}: paxlike runs {', '.join(zeros)} as set; Pax's c4 "
           "set_adam_and_learning_rate_schedule reads a 0 there as its default.")
    if self.USE_EXPERT_PARALLEL and "data_expert" not in self.mesh_axis_names():
      raise UserError(
          "USE_EXPERT_PARALLEL=True needs the 4-axis mesh [replica, data, data_expert, mdl] "
          f"(ICI_MESH_SHAPE={self.ICI_MESH_SHAPE}, DCN_MESH_SHAPE={self.DCN_MESH_SHAPE}); "
          "give both shapes four entries.")

  def activation(self) -> str:
    """The FFN activation's key from ACTIVATION_CLS (Pax's) or ACTIVATION (a string).

    The one set closer to the experiment wins (--set, then the class chain from
    the experiment's own class up); set at the same place with different
    activations, they conflict.
    """
    names = {}
    for hparam in ("ACTIVATION_CLS", "ACTIVATION"):
      value = getattr(self, hparam)
      if value is not None:
        names[hparam] = (self._hparam_depth(hparam),
                         activation_name(value, tuple(ACTIVATIONS), hparam))
    if not names:
      raise UserError("ACTIVATION_CLS and ACTIVATION are both None; set ACTIVATION_CLS, "
                      "e.g. layers.GELU.")
    (depth, name), *rest = sorted(names.values())
    if rest and rest[0][0] == depth and rest[0][1] != name:
      raise UserError(f"ACTIVATION_CLS={self.ACTIVATION_CLS!r} and ACTIVATION="
                      f"{self.ACTIVATION!r} are set together and disagree; set only "
                      "ACTIVATION_CLS (Pax's name).")
    return name

  def model_class(self) -> type[LanguageModel]:
    """MODEL_CLASS: paxlike's LanguageModel or a subclass (praxis's CustomMetricsLM, Pax's GPU
    configs' model, is one: paxlike.pax.contrib.gpu.scripts_gpu.models)."""
    cls = self.MODEL_CLASS
    if not (isinstance(cls, type) and issubclass(cls, LanguageModel)):
      raise UserError(f"MODEL_CLASS={getattr(cls, '__name__', cls)!r}: this template builds "
                      "paxlike's LanguageModel; set MODEL_CLASS to it or a subclass of it.")
    return cls

  def _hparam_depth(self, name: str) -> int:
    """0 for an instance value (--set), else 1 + the index of the defining class in the MRO."""
    if name in vars(self):
      return 0
    for i, cls in enumerate(type(self).__mro__):
      if name in vars(cls):
        return i + 1
    return len(type(self).__mro__) + 1

  def mesh_axis_size(self, name: str) -> int:
    """Devices on the mesh's axis `name` ('data', 'mdl', ...: ICI x DCN); 1 without a mesh
    (pmap)."""
    if self.ICI_MESH_SHAPE is None:
      return 1
    ici, dcn = list(self.ICI_MESH_SHAPE), self.DCN_MESH_SHAPE
    names = list(self.mesh_axis_names())
    if name not in names:
      return 1
    i = names.index(name)
    return int(ici[i]) * (int(dcn[i]) if dcn else 1)

  def expert_axis(self) -> str:
    """The mesh axis a mixture-of-experts layer's experts are split over: 'data_expert' on
    the expert-parallel mesh, else 'data' (as Pax's set_sharding_params_v1 puts them)."""
    return "data_expert" if "data_expert" in self.mesh_axis_names() else "data"

  def file_input_settings(self) -> dict[str, Any]:
    """TRAIN_FILES / EVAL_FILES: the LM's features (packed rows with segment_ids /
    segment_pos, honoured with PACKED_INPUT)."""
    return {"seq_len": self.MAX_SEQ_LEN}

  def model(self) -> fdl.Config[LanguageModel]:
    """The LM's config; praxis's `lm_tpl` / `params_init` edits reach it (config_tree)."""
    if self.ENABLE_DCONV:
      raise UserError("ENABLE_DCONV=True: paxlike's attention has no depthwise convolution of "
                      "q/k/v (Primer's dconv); leave it False.")
    if self.RELATIVE_BIAS and self.USE_ROTARY_POSITION_EMB:
      raise UserError("RELATIVE_BIAS and USE_ROTARY_POSITION_EMB are both True; Pax's template "
                      "allows one of them.")
    return LmConfig(
        self.model_class(), vocab_size=self.VOCAB_SIZE, model_dims=self.MODEL_DIMS,
        num_layers=self.NUM_LAYERS, num_heads=self.num_heads(),
        dim_per_head=self.dims_per_head(), hidden_dims=self.hidden_dims(),
        activation=self.activation(), combine_qkv=self.COMBINE_QKV,
        use_repeated_layer=self.USE_REPEATED_LAYER, checkpoint_policy=self.CHECKPOINT_POLICY,
        fprop_dtype=self.FPROP_DTYPE, use_gated_activation=self.USE_GATED_ACTIVATION,
        use_bias=self.USE_BIAS, norm_policy=self.NORM_POLICY,
        layernorm_epsilon=self.LAYERNORM_EPSILON, dropout_prob=self.DROPOUT_PROB,
        atten_logit_cap=self.ATTEN_LOGIT_CAP, softmax_cap_logits=self.SOFTMAX_CAP_LOGITS,
        packed_input=self.PACKED_INPUT, separate_embedding=self.SEPARATE_EMBEDDING,
        trainable_position_emb=self.TRAINABLE_POSITION_EMB,
        trainable_pe_max_seq_len=self.TRAINABLE_PE_MAX_SEQ_LEN,
        embedding_lookup_style=self.EMBEDDING_LOOKUP_STYLE,
        vocab_pad_multiple=self.mesh_axis_size("mdl"), softmax_has_bias=self.SOFTMAX_HAS_BIAS,
        per_dim_scale=self.PER_DIM_SCALE, relative_bias=(32, 128) if self.RELATIVE_BIAS else None,
        **({"rope_timescales": (1.0, 10_000.0)} if self.USE_ROTARY_POSITION_EMB else {}),
        use_fp8=self.USE_FP8,
        expert_shards=self.mesh_axis_size(self.expert_axis()),
        **self.lora_fields()).set_mesh(*self._pax_mesh())

  def _pax_mesh(self) -> tuple[Any, Any, Any]:
    """praxis's model_p.ici_mesh_shape / dcn_mesh_shape / mesh_axis_names: the experiment's."""
    ici = self.ICI_MESH_SHAPE
    if ici is None:
      return None, None, None
    dcn = self.DCN_MESH_SHAPE
    return list(ici), None if dcn is None else list(dcn), list(self.mesh_axis_names())


class TransformerLmSpmdAdafactor(TransformerLmSpmdAdam):
  """Pax's model_params.TransformerLmSpmdAdafactor: the base of Pax's SPMD LMs.

  paxlike keeps the model in TransformerLmSpmdAdam; this template differs
  from it in what Pax's Adafactor template has that c4's Adam one changes.
  """

  NUM_LAYERS = 10
  MODEL_DIMS = 2048
  NUM_HEADS = None
  DIMS_PER_HEAD = 128
  FPROP_DTYPE = jnp.bfloat16
  OPTIMIZER = "adafactor"  # Pax's set_default_adafactor: beta1 0.9, decay 0.99
  LEARNING_RATE = 2.5e-4
  LR_LRED_DECAY_END = 100000  # Pax's DECAY_END for Adafactor


class PipelineHParams:
  """Pax's pipeline hyperparameters and their checks, for a pipelined template (the LM's
  and the Llama family's; paxlike.layers.pipeline).

  NUM_LAYERS / (NUM_STAGES x CIRCULAR_REPEAT) layers per stage; the global
  batch runs in NUM_MICROBATCHES pieces, or pieces of MICROBATCH_SIZE rows
  (set one; praxis derives the other from the batch); CIRCULAR_REPEAT > 1
  passes every microbatch R times over the stages, each time through other
  layers. STREAM_IO shards the pipeline's input/output buffer over the stages
  instead of keeping it on every stage. On a pipelined experiment
  NUM_MICROBATCHES is the pipeline's (as in Pax's files); gradient
  accumulation is GRADIENT_ACCUMULATION_STEPS. The mesh has 4 axes,
  [stage, replica, data, mdl], or 5 with expert parallelism (Pax's USE_EXPERT_PARALLEL),
  [stage, replica, data, data_expert, mdl].
  """

  NUM_STAGES: int | None = None
  CIRCULAR_REPEAT = 1
  PIPELINE_BROADCAST_INPUTS = False
  NUM_MICROBATCHES: int | None = None  # one of the two must be set
  MICROBATCH_SIZE: int | None = None
  GRADIENT_ACCUMULATION_STEPS = 1
  ICI_MESH_SHAPE = None  # a subclass sets [NUM_STAGES, replica, data, mdl]
  DCN_MESH_SHAPE = [1, 1, 1, 1]
  MESH_AXIS_NAMES = ["stage", "replica", "data", "mdl"]
  STREAM_IO = False

  def validate(self) -> None:
    super().validate()
    s, r = self.NUM_STAGES, self.CIRCULAR_REPEAT
    if s is None or not isinstance(s, int) or s < 1:
      raise UserError(f"NUM_STAGES={s!r}: a {type(self).__name__} experiment needs the number "
                      "of pipeline stages, a positive int.")
    if not isinstance(r, int) or r < 1:
      raise UserError(f"CIRCULAR_REPEAT must be a positive int, got {r!r}.")
    if self.NUM_LAYERS % (s * r):
      raise UserError(f"NUM_LAYERS={self.NUM_LAYERS} is not a multiple of NUM_STAGES x "
                      f"CIRCULAR_REPEAT = {s} x {r} = {s * r}: every stage needs the same "
                      "number of layers.")
    m, size = self.NUM_MICROBATCHES, self.MICROBATCH_SIZE
    if m is None and size is None:
      raise UserError("NUM_MICROBATCHES and MICROBATCH_SIZE are both None; a pipeline needs "
                      "one of them (the other follows from the batch).")
    for name, value in (("NUM_MICROBATCHES", m), ("MICROBATCH_SIZE", size),
                        ("GRADIENT_ACCUMULATION_STEPS", self.GRADIENT_ACCUMULATION_STEPS)):
      if value is not None and (not isinstance(value, int) or value < 1):
        raise UserError(f"{name} must be a positive int, got {value!r}.")
    if r > 1 and m is not None and m < s:
      raise UserError(f"NUM_MICROBATCHES={m} is fewer than NUM_STAGES={s}: the circular "
                      f"schedule (CIRCULAR_REPEAT={r}) needs at least one microbatch per stage.")
    if list(self.MESH_AXIS_NAMES) != list(self.mesh_axis_names()):
      raise UserError(f"MESH_AXIS_NAMES={list(self.MESH_AXIS_NAMES)}: this pipeline's mesh "
                      f"of {len(self.mesh_axis_names())} axes is "
                      f"{list(self.mesh_axis_names())}; set those names.")
    if getattr(self, "USE_FP8", False):
      raise UserError("USE_FP8=True on a pipelined experiment: a stage's FP8 scales are used "
                      "once per microbatch, and their next values would add up instead of "
                      "being written; drop USE_FP8 or the pipeline.")
    if self.PIPELINE_BROADCAST_INPUTS:
      raise UserError("PIPELINE_BROADCAST_INPUTS=True: paxlike feeds the microbatches to the "
                      "first stage only (praxis's default); drop it.")

  def pipelined_mesh(self) -> bool:
    return True

  def accumulation_knob(self) -> str:
    return "GRADIENT_ACCUMULATION_STEPS"

  def pipeline_fields(self) -> dict[str, Any]:
    """The model config's pipeline fields."""
    return {"num_stages": self.NUM_STAGES, "circular_repeat": self.CIRCULAR_REPEAT,
            "num_microbatches": self.NUM_MICROBATCHES, "microbatch_size": self.MICROBATCH_SIZE,
            "stream_io": self.STREAM_IO}


class TransformerLmSpmdPipelineAdafactor(PipelineHParams, TransformerLmSpmdAdafactor):
  """Pax's model_params.TransformerLmSpmdPipelineAdafactor: the LM pipelined over a
  4-axis [stage, replica, data, mdl] mesh (PipelineHParams, paxlike.layers.pipeline).

  EMB_W_DATA_DIMS: the mesh axes the embedding/softmax table's embed dim is
  split over.
  """

  NUM_LAYERS = 10
  HIDDEN_DIMS = None  # 4 x MODEL_DIMS
  USE_REPEATED_LAYER = False  # Pax: the pipeline already loops over stages
  CHECKPOINT_EVERY_N_STEPS = 5000
  SUMMARY_INTERVAL_STEPS = 100
  CHECKPOINT_MAX_TO_KEEP = 10
  EMB_W_DATA_DIMS: Any = "data"

  def validate(self) -> None:
    super().validate()
    names = tuple(a for a in self.mesh_axis_names() if a != "stage")
    dims = self.EMB_W_DATA_DIMS
    dims = [dims] if isinstance(dims, str) or dims is None else list(dims)
    if any(d not in names for d in dims if d is not None):
      raise UserError(f"EMB_W_DATA_DIMS={self.EMB_W_DATA_DIMS!r} names an axis that is not "
                      f"one of {list(names)}.")

  def emb_w_data_dims(self) -> Any:
    dims = self.EMB_W_DATA_DIMS
    return tuple(dims) if isinstance(dims, list | tuple) else dims

  def axis_rules(self, rules: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """EMB_W_DATA_DIMS on the tables' embed dim."""
    emb = self.emb_w_data_dims()
    return tuple((name, emb if name == "table_embed" else axes)
                 for name, axes in super().axis_rules(rules))

  def model(self) -> fdl.Config[LanguageModel]:
    cfg = super().model()
    self.emb_w_data_dims()  # read with the model: axis_rules applies it after the read check
    for name, value in self.pipeline_fields().items():
      setattr(cfg, name, value)
    return cfg


class TransformerLmSpmdPipelineAdam(TransformerLmSpmdPipelineAdafactor):
  """Pax's model_params.TransformerLmSpmdPipelineAdam: the pipelined LM with Adam."""

  OPTIMIZER = "adam"
  NUM_LAYERS = 32
  NUM_HEADS = 16
  MODEL_DIMS = 1024
  FPROP_DTYPE = jnp.float32
  LEARNING_RATE = 1e-3


class TransformerLmPmapAdam(TransformerLmSpmdAdam):
  """Pax's model_params.TransformerLmPmapAdam: data parallel (no mesh), Adam.

  Pax builds it with set_default_adam (gradient clip 5.0, warmup 4000,
  exponential decay to 0.1 at 300k), no combined QKV, no output logit cap.
  """

  ICI_MESH_SHAPE = None
  NUM_LAYERS = 32
  MODEL_DIMS = 1024
  NUM_HEADS = 16
  DIMS_PER_HEAD = None
  FPROP_DTYPE = jnp.float32
  COMBINE_QKV = False
  SOFTMAX_CAP_LOGITS = 0.0  # Pax's pmap template caps only the attention logits (50)


def synthetic_train_input(exp: Any) -> fdl.Config:
  """The learnable synthetic LM stream of an experiment's VOCAB_SIZE, MAX_SEQ_LEN,
  SYNTHETIC_NOISE_RATE and DATA_SEED, the per-host share of its batch."""
  return fdl.Config(
      SyntheticLmInput, name="train", batch_size=exp.per_host_batch_size(),
      is_training=True, vocab_size=exp.VOCAB_SIZE, seq_len=exp.MAX_SEQ_LEN,
      noise_rate=exp.SYNTHETIC_NOISE_RATE, seed=exp.DATA_SEED)


class SyntheticDataset(FilesDataset):
  """Data mixin: the learnable synthetic LM stream of paxlike.inputs.synthetic.

  Its sizes are Pax's lm_cloud.SyntheticDataset's.
  """

  PERCORE_BATCH_SIZE = 16
  MAX_SEQ_LEN = 1024
  DATA_SEED = 4321
  SYNTHETIC_NOISE_RATE = 0.05
  _replaced_by_files = ("DATA_SEED", "SYNTHETIC_NOISE_RATE")

  def _dataset_common(self, is_training: bool) -> fdl.Config:
    """The train or the eval stream (Pax's method: a subclass's override is what runs)."""
    cfg = synthetic_train_input(self)
    if not is_training:
      cfg.name, cfg.is_training = "eval", False
      cfg.batch_size = self.per_host_eval_batch_size()
    return cfg

  def own_datasets(self) -> list[fdl.Config]:
    """The train stream, and, as Pax's SyntheticDataset, an eval stream (one batch an eval
    run, a part of the stream training never reads) when EVAL_INTERVAL_STEPS > 0."""
    out = [self._dataset_common(is_training=True)]
    if self.EVAL_INTERVAL_STEPS:
      out.append(self._dataset_common(is_training=False))
    return out
