"""BERT's masked-LM corruption (praxis's MaskedLmDataAugmenter), for numpy and JAX alike.

Each valid token (paddings 0) is picked with probability mask_prob +
random_prob + same_prob (praxis's 0.12 + 0.015 + 0.015: 15% of the tokens,
80/10/10 as in the BERT paper); a picked token becomes mask_token_id, a
random id below vocab_size, or stays itself, in those proportions. The
model (paxlike.models.bert) runs it on device with a JAX key; an input that
remasks its records (TFRecordBertInput's remask) runs it on the host with a
numpy generator. Both draw through `samplers`, so the rule is written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from paxlike.errors import UserError

# uniform(shape) -> floats in [0, 1); randint(shape, high) -> ints in [0, high).
Uniform = Callable[[tuple[int, ...]], Any]
RandInt = Callable[[tuple[int, ...], int], Any]


@dataclasses.dataclass
class MlmMasking:
  """praxis's MaskedLmDataAugmenter fields (Pax's bert.py edits them on the input's config:
  `p.mlm_augmenter.Set(mask_token_id=103, vocab_size=30522)`)."""

  vocab_size: int = 0
  mask_token_id: int = -1
  mask_prob: float = 0.12
  random_prob: float = 0.015
  same_prob: float = 0.015

  def check(self, where: str) -> None:
    """One line for settings praxis asserts on."""
    total = self.mask_prob + self.random_prob + self.same_prob
    if self.vocab_size <= 0:
      raise UserError(f"{where}: the masked-LM corruption needs vocab_size > 0, got "
                      f"{self.vocab_size}.")
    if self.mask_token_id < 0:
      raise UserError(f"{where}: the masked-LM corruption needs a mask_token_id >= 0, got "
                      f"{self.mask_token_id}.")
    if not 0.0 < total < 1.0 or min(self.mask_prob, self.random_prob, self.same_prob) < 0:
      raise UserError(f"{where}: mask_prob + random_prob + same_prob = {total:g} must be in "
                      "(0, 1), each one >= 0.")

  def apply(self, inputs: Any, paddings: Any, uniform: Uniform, randint: RandInt
            ) -> tuple[Any, Any]:
    """(corrupted ids, float 0/1 marks of the picked positions), the arrays of inputs' kind.

    inputs: int ids [batch, length]; paddings: 0 on tokens, 1 on padding.
    """
    shape = tuple(inputs.shape)
    total = self.mask_prob + self.random_prob + self.same_prob
    valid = 1.0 - paddings.astype(np.float32)
    picked = valid * (uniform(shape) < total).astype(np.float32)
    masked = picked * (uniform(shape) < self.mask_prob / total).astype(np.float32)
    rest = picked - masked
    rest_prob = total - self.mask_prob
    randomised = rest * (uniform(shape) < (self.random_prob / rest_prob if rest_prob else 0.0)
                         ).astype(np.float32)
    random_ids = randint(shape, self.vocab_size).astype(inputs.dtype)
    kind = inputs.dtype
    out = (inputs * (1 - masked - randomised).astype(kind)
           + masked.astype(kind) * self.mask_token_id + random_ids * randomised.astype(kind))
    return out, picked


def jax_samplers(key: jax.Array) -> tuple[Uniform, RandInt]:
  """uniform / randint drawing from key, a fresh subkey for every call."""
  keys = iter(jax.random.split(key, 8))

  def uniform(shape: tuple[int, ...]) -> jax.Array:
    return jax.random.uniform(next(keys), shape)

  def randint(shape: tuple[int, ...], high: int) -> jax.Array:
    return jax.random.randint(next(keys), shape, 0, high)

  return uniform, randint


def numpy_samplers(rng: np.random.Generator) -> tuple[Uniform, RandInt]:
  """uniform / randint drawing from a numpy generator."""
  return (lambda shape: rng.random(shape, dtype=np.float32),
          lambda shape, high: rng.integers(0, high, shape))
