"""The shipped experiments with Pax's names are Pax's, field by field.

The table below is typed from paxml's tasks/lm/params/lm_cloud.py, c4.py
and tasks/lm/model_params.py (each class's own values and what it inherits
from Pax's templates), and the parameter counts are computed from it with
Pax's formula by hand; both are compared with what paxlike builds.
"""

from __future__ import annotations

import dataclasses

import fiddle as fdl
import jax
import pytest

from paxlike import config, experiment, registry
from paxlike import train_state as ts


@dataclasses.dataclass(frozen=True)
class Pax:
  """One Pax class: what its file and its templates set."""

  layers: int
  model: int
  heads: int
  dims_per_head: int
  vocab: int
  seq: int
  percore: int
  ici: list[int] | None
  dtype: str
  activation: str = "gelu"
  repeated: bool = True
  policy: str = "SAVE_NOTHING"
  combine_qkv: bool = True
  optimizer: str = "adam"
  lr: float = 2.5e-4
  schedule: str = "linear_rampup_exponential_decay"
  warmup: int = 4000
  decay_start: int = 4001
  decay_end: int = 300000
  min_ratio: float = 0.1
  clip: float = 5.0
  beta2: float = 0.99
  epsilon: float = 1e-6
  weight_decay: float = 1e-3
  save_every: int = 5000
  summary_every: int = 100
  eval_every: int = 100
  train_steps: int = 10_000_000
  dcn: list[int] | None = None
  training_optimized: bool = True
  # GPT-3's model knobs (counted in the parameters).
  trainable_pe: int = 0  # rows of the trainable position table; 0: none
  attention_bias: bool = False
  per_dim_scale: bool = True
  softmax_bias: bool = True


LM_CLOUD = dict(vocab=32000, seq=1024, dtype="bfloat16")  # LmCloudSpmd + its SyntheticDataset
PMAP = dict(model=1024, heads=16, dims_per_head=64, vocab=32000, seq=1024, percore=16, ici=None,
            dtype="float32", activation="relu", repeated=False, combine_qkv=False, lr=1e-3)
C4 = dict(seq=1024, dtype="float32", lr=1e-3, repeated=False, save_every=1000)  # C4SpmdAdam
C4_BF16 = dict(C4, vocab=32000, dtype="bfloat16", repeated=True, summary_every=10)
GPT3 = dict(C4, layers=96, model=12288, heads=96, dims_per_head=128, seq=2048, percore=2,
            ici=[1, 64, 12], vocab=50257, lr=6e-5, schedule="linear_rampup_cosine_decay",
            warmup=265, decay_start=266, decay_end=108600, clip=1.0, beta2=0.95, epsilon=1e-8,
            weight_decay=0.1, save_every=100, summary_every=10, repeated=True,
            trainable_pe=16384, attention_bias=True, per_dim_scale=False, softmax_bias=False)

PAX = {
    "LmCloudSpmd2B": Pax(18, 3072, 24, 128, percore=8, ici=[1, 4, 1], **LM_CLOUD),
    "LmCloudSpmd2BLimitSteps": Pax(18, 3072, 24, 128, percore=8, ici=[1, 4, 1], train_steps=300,
                                   **LM_CLOUD),
    "LmCloudSpmd32B": Pax(40, 8192, 64, 128, percore=8, ici=[1, 16, 4],
                          policy="SAVE_CONTEXT_AND_OUT_PROJ", **LM_CLOUD),
    "LmCloudSpmd64B": Pax(51, 10240, 80, 128, percore=4, ici=[1, 16, 8],
                          policy="SAVE_CONTEXT_AND_OUT_PROJ", **LM_CLOUD),
    "LmCloudSpmd128B": Pax(71, 12288, 96, 128, percore=4, ici=[1, 64, 4], **LM_CLOUD),
    "LmCloudSpmd256B": Pax(80, 16384, 128, 128, percore=4, ici=[1, 64, 8], **LM_CLOUD),
    "LmCloudSpmd512B": Pax(102, 20480, 160, 128, percore=4, ici=[1, 64, 16], **LM_CLOUD),
    "LmCloudSpmd1024B": Pax(142, 24576, 192, 128, percore=2, ici=[1, 256, 8], **LM_CLOUD),
    "LmCloudSpmdTest": Pax(2, 64, 8, 8, percore=4, ici=[1, 1, 1], **LM_CLOUD),
    "LmCloudTransformerAdam": Pax(32, **PMAP),
    "LmCloudTransformerAdamTest": Pax(2, **PMAP),
    "LmCloudTransformerAdamLimitSteps": Pax(10, train_steps=2000, **PMAP),
    "C4SpmdAdam": Pax(24, 2048, 32, 64, vocab=32128, percore=1, ici=[1, 4, 2],
                      policy="SAVE_DOT_FOR_MLPERF_200B", **C4),
    "C4Spmd1BAdam4Replicas": Pax(13, 2560, 20, 128, percore=32, ici=[1, 4, 1], **C4_BF16),
    "C4Spmd2BAdam4Replicas": Pax(18, 3072, 24, 128, percore=32, ici=[1, 4, 1], **C4_BF16),
    "C4Spmd16BAdam32Replicas": Pax(36, 6144, 48, 128, percore=16, ici=[1, 16, 2], **C4_BF16),
    "C4Spmd32BAdam64Replicas": Pax(40, 8192, 64, 128, percore=8, ici=[1, 16, 4], **C4_BF16),
    "C4SpmdGpt3AdamOrgHP": Pax(**GPT3),
    "C4SpmdGpt3AdamOrgHP1536Replicas": Pax(**dict(GPT3, vocab=51200, percore=1,
                                                  ici=[1, 64, 24], eval_every=25)),
}
GPT3_NAMES = ("C4SpmdGpt3AdamOrgHP", "C4SpmdGpt3AdamOrgHP1536Replicas")


def pax_param_count(p: Pax) -> int:
  """Parameters of Pax's TransformerLm for this config, by praxis's layer shapes.

  Per layer: Q, K, V and output projections (4 x model x heads x dims), the
  query's per-dim scale, attention biases when set, two FFN matmuls with
  their biases, and two LayerNorms (scale and bias). Then the tied
  embedding / softmax table with its bias, the final LayerNorm, and a
  trainable position table when set.
  """
  d, f, width = p.model, 4 * p.model, p.heads * p.dims_per_head
  layer = 4 * d * width + 2 * d * f + f + d + 2 * 2 * d
  layer += p.dims_per_head if p.per_dim_scale else 0
  layer += 3 * width + d if p.attention_bias else 0
  total = p.layers * layer + p.vocab * d + 2 * d + p.trainable_pe * d
  return total + (p.vocab if p.softmax_bias else 0)


def build(name: str) -> tuple[experiment.BaseExperiment, object, list]:
  exp = experiment.instantiate(registry.get(name))
  return exp, config.build(exp.task()), exp.datasets()


_COUNTS: dict[tuple, int] = {}


def paxlike_param_count(task, seq: int = 8) -> int:
  """paxlike's parameter count from jax.eval_shape of the model's init (nothing allocated).

  The rows that only pad a vocabulary table to the 'mdl' axis are not counted
  (Pax pads GPT-3's 50257 to 51200 in the data, not in the count).
  """
  m = task.model
  key = repr(m)  # every model field: knobs change the count
  if key not in _COUNTS:
    batch = {k: jax.ShapeDtypeStruct((1, seq), jax.numpy.int32) for k in m.input_features()}
    params = jax.eval_shape(lambda: ts.init_params(m, jax.random.key(0), m.init_batch(batch)))
    _COUNTS[key] = ts.count_params(params) - m.padding_params()
  return _COUNTS[key]


@pytest.mark.parametrize("name", sorted(PAX))
def test_shipped_experiment_has_paxs_hyperparameters(name):
  p = PAX[name]
  exp, task, datasets = build(name)
  m, opt, train = task.model, task.learner.optimizer, task.train
  sched = opt.lr_schedule  # Pax's templates: a praxis optimizer config, as Pax's set it
  train_cfg = datasets[0]
  derived = dict(
      layers=m.num_layers, model=m.model_dims, hidden=m.hidden_dims, heads=m.num_heads,
      dims_per_head=m.dim_per_head, vocab=m.vocab_size, seq=train_cfg.seq_len,
      per_host_batch=train_cfg.batch_size, ici=exp.ICI_MESH_SHAPE, dcn=exp.DCN_MESH_SHAPE,
      dtype=jax.numpy.dtype(m.fprop_dtype).name, activation=m.activation,
      repeated=m.use_repeated_layer, policy=getattr(m.checkpoint_policy, "name",
                                                    m.checkpoint_policy),
      combine_qkv=m.combine_qkv,
      optimizer={"Adam": "adam", "ShardedAdafactor": "adafactor"}[type(opt).__name__],
      lr=opt.learning_rate, schedule=getattr(sched, "KIND", "constant"),
      warmup=sched.warmup_steps, decay_start=sched.decay_start, decay_end=sched.decay_end,
      min_ratio=sched.min_ratio, clip=opt.clip_gradient_norm_to_value, beta1=opt.beta1,
      beta2=opt.beta2, epsilon=opt.epsilon, weight_decay=opt.weight_decay,
      save_every=train.save_interval_steps, summary_every=train.summary_interval_steps,
      eval_every=train.eval_interval_steps, train_steps=train.num_train_steps,
      training_optimized=exp.TRAINING_OPTIMIZED_SHARDING)
  expected = dict(
      layers=p.layers, model=p.model, hidden=4 * p.model, heads=p.heads,
      dims_per_head=p.dims_per_head, vocab=p.vocab, seq=p.seq,
      per_host_batch=p.percore * jax.local_device_count(), ici=p.ici, dcn=p.dcn, dtype=p.dtype,
      activation=p.activation, repeated=p.repeated, policy=p.policy,
      combine_qkv=p.combine_qkv, optimizer=p.optimizer, lr=p.lr, schedule=p.schedule,
      warmup=p.warmup, decay_start=p.decay_start, decay_end=p.decay_end,
      min_ratio=p.min_ratio, clip=p.clip, beta1=0.9, beta2=p.beta2, epsilon=p.epsilon,
      weight_decay=p.weight_decay, save_every=p.save_every, summary_every=p.summary_every,
      eval_every=p.eval_every, train_steps=p.train_steps,
      training_optimized=p.training_optimized if p.ici else exp.TRAINING_OPTIMIZED_SHARDING)
  assert {k: v for k, v in derived.items() if v != expected[k]} == {}, (
      f"{name} differs from Pax: expected {expected}")


def test_pax_formula_by_hand_for_lm_cloud_2b():
  # 18 x (4·3072² + 2·3072·12288 + 12288 + 3072 + 4·3072 + 128) + 32000·3072 + 2·3072 + 32000
  assert pax_param_count(PAX["LmCloudSpmd2B"]) == 2_137_273_856


@pytest.mark.parametrize("name", sorted(PAX))
def test_parameter_count_equals_paxs(name):
  _, task, _ = build(name)
  assert paxlike_param_count(task) == pax_param_count(PAX[name])


@pytest.mark.parametrize("name", sorted(PAX))
def test_model_knobs_are_paxs(name):
  p = PAX[name]
  exp, _, _ = build(name)
  gpt3 = name in GPT3_NAMES
  pmap = p.ici is None
  expected = dict(
      ATTEN_LOGIT_CAP=-1.0 if gpt3 else 50.0, SOFTMAX_CAP_LOGITS=0.0 if gpt3 or pmap else 30.0,
      TRAINABLE_POSITION_EMB=gpt3, USE_BIAS=gpt3, PACKED_INPUT=True,
      USE_GATED_ACTIVATION=False, SEPARATE_EMBEDDING=False)
  got = {k: getattr(exp, k, "<missing>") for k in expected}
  assert got == expected


def test_a_class_in_either_order_gets_paxs_template_and_the_mixins_sizes():
  from paxlike.lm_experiments import SyntheticDataset, TransformerLmSpmdAdafactor

  class PaxOrder(TransformerLmSpmdAdafactor, SyntheticDataset):
    ICI_MESH_SHAPE = [1, 1, 1]

  class MixinFirst(SyntheticDataset, TransformerLmSpmdAdafactor):
    ICI_MESH_SHAPE = [1, 1, 1]

  built = []
  for cls in (PaxOrder, MixinFirst):
    exp = experiment.instantiate(cls)
    task, data = config.build(exp.task()), exp.datasets()[0]
    m, opt = task.model, task.learner.optimizer
    built.append((m.num_layers, m.model_dims, m.hidden_dims, m.num_heads, m.dim_per_head,
                  m.vocab_size, jax.numpy.dtype(m.fprop_dtype).name, m.combine_qkv,
                  type(opt).__name__, opt.decay_adam, opt.learning_rate,
                  opt.lr_schedule.decay_end, opt.clip_gradient_norm_to_value,
                  data.seq_len, data.batch_size // jax.local_device_count()))
  # model_params.TransformerLmSpmdAdafactor's defaults (set_default_adafactor's optimizer);
  # lm_cloud.SyntheticDataset's sizes.
  pax = (10, 2048, 8192, 16, 128, 32000, "bfloat16", True, "ShardedAdafactor", 0.99, 2.5e-4,
         100000, 5.0, 1024, 16)
  assert built == [pax, pax]


# Pax's set_default_adam (paxml's tasks/lm/model_params.py), typed from it: praxis's
# optimizers.Adam with beta1 0.9, beta2 0.99, the class's WEIGHT_DECAY, gradient norm clipped
# to 5.0 (praxis's defaults for the rest: epsilon 1e-6, epsilon_root 0, update clip 1.0), the
# class's LEARNING_RATE, and LinearRampupExponentialDecay(warmup_steps=4000, decay_start=4001,
# decay_end=300000, min_ratio=0.1, max=1.0): its keyword defaults, which none of these
# classes' task() overrides.
SET_DEFAULT_ADAM = dict(beta1=0.9, beta2=0.99, epsilon=1e-6, epsilon_root=0.0,
                        clip_threshold=1.0, clip_gradient_norm_to_value=5.0)
SET_DEFAULT_ADAM_SCHEDULE = dict(warmup_steps=4000, decay_start=4001, decay_end=300000,
                                 min_ratio=0.1, max=1.0)
# Every shipped class mirroring a Pax class whose task() calls set_default_adam, with the
# LEARNING_RATE and WEIGHT_DECAY Pax's class passes it: lm_cloud.py's LmCloudSpmd and
# LmCloudSpmdPipeline families (their Adafactor templates' 2.5e-4, 1e-3), the pmap
# TransformerLmPmapAdam family and MLP benchmarks (ClassificationModelAdam), bert.py's
# BertAdamL4H128 (TransformerBertPmapAdam), all 1e-3, 1e-3.
SPMD_ADAM = (2.5e-4, 1e-3)
PMAP_ADAM = (1e-3, 1e-3)
DEFAULT_ADAM_CLASSES = {
    **{name: SPMD_ADAM for name in (
        "LmCloudSpmd2B", "LmCloudSpmd2BLimitSteps", "LmCloudSpmd32B", "LmCloudSpmd64B",
        "LmCloudSpmd128B", "LmCloudSpmd256B", "LmCloudSpmd512B", "LmCloudSpmd1024B",
        "LmCloudSpmdTest", "LmCloudSpmdPipeline9B", "LmCloudSpmdPipeline175B",
        "LmCloudSpmdPipelineMultislice2B", "LmCloudSpmdPipelineMultislice2BCircular")},
    **{name: PMAP_ADAM for name in (
        "LmCloudTransformerAdam", "LmCloudTransformerAdamTest",
        "LmCloudTransformerAdamLimitSteps", "LargeMlp", "SmallMlp", "BertAdamL4H128")},
}


@pytest.mark.parametrize("name", sorted(DEFAULT_ADAM_CLASSES))
def test_a_class_whose_pax_task_calls_set_default_adam_has_its_optimizer_and_schedule(name):
  from paxlike.pax import optimizers, schedules

  lr, weight_decay = DEFAULT_ADAM_CLASSES[name]
  exp = experiment.instantiate(registry.get(name))
  opt = exp.task().train.learner.optimizer  # the config: nothing is built
  sched = opt.lr_schedule
  assert (fdl.get_callable(opt), fdl.get_callable(sched)) == (
      optimizers.Adam, schedules.LinearRampupExponentialDecay)
  got = {k: getattr(opt, k) for k in SET_DEFAULT_ADAM}
  got.update(learning_rate=opt.learning_rate, weight_decay=opt.weight_decay,
             **{k: getattr(sched, k) for k in SET_DEFAULT_ADAM_SCHEDULE})
  assert got == dict(SET_DEFAULT_ADAM, learning_rate=lr, weight_decay=weight_decay,
                     **SET_DEFAULT_ADAM_SCHEDULE)
