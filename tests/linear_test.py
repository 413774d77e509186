"""The dense layers' product (`linear.project`) and its CPU gradient."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import linear


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("in_dims", [1, 2])
def test_cpu_projection_gradients_are_the_plain_ones(in_dims, dtype, tol):
  """The CPU path's x- and w-gradients (w's accumulated in float32) equal autodiff's of
  the plain product, in the operands' dtypes."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 3, 4)), dtype)
  w = jnp.asarray(rng.normal(size=(*x.shape[4 - in_dims:], 6)) * 0.3, dtype)
  out_shape = (*x.shape[:4 - in_dims], 6)
  cot = jnp.asarray(rng.normal(size=out_shape), dtype)

  def loss(product):
    return lambda x, w: jnp.sum((product(x, w, in_dims) * cot).astype(jnp.float32))

  got = jax.grad(loss(linear._project_cpu), argnums=(0, 1))(x, w)
  want = jax.grad(loss(linear._dot), argnums=(0, 1))(x, w)
  for g, v in zip(got, want, strict=True):
    assert g.dtype == v.dtype == dtype and g.shape == v.shape
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(v, np.float32),
                               rtol=tol, atol=tol)
  np.testing.assert_array_equal(linear._project_cpu(x, w, in_dims), linear._dot(x, w, in_dims))


def _unfused_dots(hlo: str, dtype: str) -> list[str]:
  """The `dtype` dot instructions of a compiled module that no fusion holds."""
  fused = set(re.findall(r"fusion\(.*?calls=%([\w.\-]+)", hlo))
  found, computation = [], None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
    if header and line.rstrip().endswith("{"):
      computation = header.group(1)
    elif computation not in fused and re.search(rf"= {dtype}\[[^\]]*\]\S* dot\(", line):
      found.append(line.strip()[:160])
  return found


@pytest.mark.skipif(linear._jaxlib_version() < (0, 11),
                    reason="jaxlib 0.10 keeps bfloat16 weight gradients in its fast matmuls")
def test_bfloat16_weight_gradients_stay_in_fast_matmuls():
  """A scanned, rematerialised bfloat16 MLP of Linear layers: its compiled gradient on a CPU
  has no bfloat16 matmul outside XLA's fused (YNNPACK) ones. With the plain product jaxlib
  0.11 and 0.12 left its three weight gradients there (2x the step under 0.12)."""

  class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      h = linear.Linear((256,), ("embed", "mlp"), jnp.bfloat16, name="wi")(x)
      y = linear.Linear((128,), ("mlp", "embed"), jnp.bfloat16, name="wo")(jax.nn.gelu(h))
      return x + y, None

  stack = nn.scan(nn.remat(Mlp), variable_axes={"params": 0}, split_rngs={"params": True},
                  metadata_params={nn.PARTITION_NAME: "layers"}, length=3)()
  x = jnp.ones((4, 64, 128), jnp.bfloat16)
  params = stack.init(jax.random.key(0), x, None)

  def loss(params):
    y, _ = stack.apply(params, x, None)
    return jnp.mean(jnp.square(y.astype(jnp.float32)))

  hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  assert " dot(" in hlo or "ynn" in hlo
  assert _unfused_dots(hlo, "bf16") == []
