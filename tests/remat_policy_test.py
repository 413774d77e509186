"""CHECKPOINT_POLICY means in every model family what its name does in Pax: Pax's enum
(layers.AutodiffCheckpointType.X) as its name, and each named policy saves the tensors
Pax tags with those names."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from paxlike import config, experiment, registry
from paxlike import train_state as ts
from paxlike.pax import layers

FAMILIES = ["LmCloudSpmdTiny", "LlamaTiny", "FlanT5Tiny"]


def _loss_and_args(name: str, policy: object):
  """An unrolled `name` with CHECKPOINT_POLICY=policy: its loss and abstract arguments."""
  class Policy(registry.get(name)):
    CHECKPOINT_POLICY = policy
    USE_REPEATED_LAYER = False

  model = config.build(experiment.build_checked(experiment.instantiate(Policy, [])).task).model
  batch = model.init_batch({k: jax.ShapeDtypeStruct((1, 8), jnp.int32)
                            for k in model.input_features()})
  params = jax.eval_shape(lambda: nn.unbox(ts.init_params(model, jax.random.key(0), batch)))
  return (lambda p, b: model.apply({"params": p}, b, method="fprop")[0]), (params, batch)


def _rematerialised_calls(name: str, policy: object) -> int:
  loss, args = _loss_and_args(name, policy)
  text = str(jax.make_jaxpr(jax.grad(loss))(*args))
  return text.count("remat2[")  # how a jaxpr prints a jax.checkpoint call (JAX 0.10, 0.12)


@pytest.mark.parametrize("name", FAMILIES)
def test_an_enum_policy_rematerialises_as_its_name(name):
  # SAVE_EVERYTHING is no remat at all; the Llama and T5 families read the enum member
  # as a policy to remat by, and rematerialised every layer.
  assert _rematerialised_calls(name, layers.AutodiffCheckpointType.SAVE_EVERYTHING) == 0
  assert _rematerialised_calls(name, layers.AutodiffCheckpointType.SAVE_NOTHING) > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_save_qkv_out_proj_saves_the_projections_in_every_family(name, capsys):
  loss, args = _loss_and_args(name, "SAVE_QKV_OUT_PROJ")
  capsys.readouterr()
  jax.ad_checkpoint.print_saved_residuals(loss, *args)
  saved = set(re.findall(r"named '(\w+)'", capsys.readouterr().out))
  # The Llama and T5 families saved out_proj only: their q/k/v carried no names.
  assert saved == {"query_proj", "key_proj", "value_proj", "out_proj"}, saved
