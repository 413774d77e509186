"""Activation classes by Pax's names, for `ACTIVATION_CLS = layers.GELU`.

Pax's experiment files name the feed-forward activation by class
(praxis.layers.GELU, ReLU, SiLU, Swish, ...). paxlike's layers take the
activation as a string (paxlike.layers.linear.ACTIVATIONS); these classes
carry that string, so either form works and both reach the same layer.
"""

from __future__ import annotations

from typing import Any

from paxlike.errors import UserError


class BaseActivation:
  """An activation named as Pax's experiment files name it; `name` is paxlike's key.

  An instance is also the function (praxis's activation layers: a Pax user's
  own layer calls `self.activation(x)` after `create_child('activation',
  self.activation_tpl.clone())`).
  """

  name = ""

  def __call__(self, x: Any) -> Any:
    from paxlike.layers.linear import ACTIVATIONS

    if self.name == "gelu" and not getattr(self, "approximate", True):
      import jax

      return jax.nn.gelu(x, approximate=False)
    return ACTIVATIONS[self.name](x)

  def clone(self) -> BaseActivation:
    import copy

    return copy.copy(self)


class ReLU(BaseActivation):
  name = "relu"


class GELU(BaseActivation):
  """Pax's GELU (tanh approximation, as jax.nn.gelu's default).

  `approximate` is praxis's field (`activation_tpl.approximate = True` in Pax's
  GPT-3); paxlike's LM layers compute the tanh approximation only (its
  config tree refuses False), a Pax user's own layer calling it gets either.
  """

  name = "gelu"

  def __init__(self, approximate: bool = True) -> None:
    self.approximate = approximate


class SiLU(BaseActivation):
  name = "silu"


class Swish(BaseActivation):
  """Pax's Swish: x * sigmoid(x), the same function as SiLU."""

  name = "silu"


class Tanh(BaseActivation):
  name = "tanh"


class Sigmoid(BaseActivation):
  name = "sigmoid"


class Identity(BaseActivation):
  name = "none"


# Strings a user may write for each activation (Pax's class names in any case too).
ALIASES = {"swish": "silu", "identity": "none", "linear": "none"}


def activation_name(value: Any, known: tuple[str, ...], hparam: str = "ACTIVATION_CLS") -> str:
  """paxlike's activation key for a class (layers.GELU), an instance, or a string.

  Raises:
    UserError: naming the hyperparameter and the accepted values.
  """
  if isinstance(value, type) and issubclass(value, BaseActivation):
    name = value.name
  elif isinstance(value, BaseActivation):
    name = type(value).name
  elif isinstance(value, str):
    name = ALIASES.get(value.lower(), value.lower())
  else:
    name = None
  if name not in known:
    raise UserError(f"{hparam}={value!r} is not an activation paxlike has; use one of "
                    f"{', '.join(sorted(known))} (or layers.GELU, layers.ReLU, layers.SiLU, "
                    "layers.Swish, ...).")
  return name
