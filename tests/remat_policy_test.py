"""CHECKPOINT_POLICY given as Pax's enum (layers.AutodiffCheckpointType.X) means what its
name does, in every model family."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from paxlike import config, experiment, registry
from paxlike import train_state as ts
from paxlike.pax import layers


def _rematerialised_calls(name: str, policy: object) -> int:
  """How many rematerialised calls the gradient of an unrolled `name` makes."""
  class Policy(registry.get(name)):
    CHECKPOINT_POLICY = policy
    USE_REPEATED_LAYER = False

  model = config.build(experiment.build_checked(experiment.instantiate(Policy, [])).task).model
  batch = model.init_batch({k: jax.ShapeDtypeStruct((1, 8), jnp.int32)
                            for k in model.input_features()})
  params = jax.eval_shape(lambda: nn.unbox(ts.init_params(model, jax.random.key(0), batch)))
  loss = lambda p, b: model.apply({"params": p}, b, method="fprop")[0]
  text = str(jax.make_jaxpr(jax.grad(loss))(params, batch))
  return text.count("remat2[")  # how a jaxpr prints a jax.checkpoint call (JAX 0.10, 0.12)


@pytest.mark.parametrize("name", ["LmCloudSpmdTiny", "LlamaTiny", "FlanT5Tiny"])
def test_an_enum_policy_rematerialises_as_its_name(name):
  # SAVE_EVERYTHING is no remat at all; the Llama and T5 families read the enum member
  # as a policy to remat by, and rematerialised every layer.
  assert _rematerialised_calls(name, layers.AutodiffCheckpointType.SAVE_EVERYTHING) == 0
  assert _rematerialised_calls(name, layers.AutodiffCheckpointType.SAVE_NOTHING) > 0
