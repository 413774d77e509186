"""Which implementation attention takes per call, and the run's record of the choices.

The policy ("auto", "xla" or "cudnn") is process-wide (`set_attention_policy`,
or `attention_policy(...)` as a context); paxlike.main sets it per run from
Pax's USE_CUDNN_FLASH_ATTENTION / USE_FLASH_ATTENTION. Exports lower with
"xla" (see `portable`): cuDNN cannot be lowered on a host without a GPU, and
its custom call is not among jax.export's stable ones. `choose_implementation`
decides each call from static facts (paxlike.layers.attention calls it as a
program is lowered); `note` records each distinct choice for run_env.json.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from paxlike.errors import UserError
from paxlike.layers.platform import lowering_platform

POLICIES = ("auto", "xla", "cudnn")
CUDNN, XLA = "cudnn", "xla"
_FUSED_DTYPES = ("bfloat16", "float16")

_state = threading.local()  # a policy context on this thread
_global = {"policy": "auto"}
_run: dict[str, Any] = {"choices": [], "listener": None}


# ------------------------------------------------------------------ the policy


def _check_policy(policy: str) -> str:
  if policy not in POLICIES:
    raise ValueError(f"attention policy {policy!r}: choose one of {', '.join(POLICIES)}")
  return policy


def set_attention_policy(policy: str) -> None:
  """Sets the process-wide policy: "auto" (cuDNN where it applies), "xla" or "cudnn".

  "cudnn" follows the same rule as "auto" (cuDNN wherever it can run, XLA in
  the cases it cannot); it states the intent, and paxlike.main warns when
  the run's platform cannot honour it. The policy is read as a program is
  traced: set it before the run's first step (paxlike.main does); a
  function jax has already traced keeps the choice it was traced with.
  """
  _global["policy"] = _check_policy(policy)


def current_policy() -> str:
  """The policy in force on this thread: the innermost `attention_policy` context, else global."""
  stack = getattr(_state, "stack", None)
  return stack[-1] if stack else _global["policy"]


@contextlib.contextmanager
def attention_policy(policy: str) -> Iterator[None]:
  """Programs traced inside use `policy` (on this thread)."""
  stack = getattr(_state, "stack", None)
  if stack is None:
    stack = _state.stack = []
  stack.append(_check_policy(policy))
  try:
    yield
  finally:
    stack.pop()


def portable() -> contextlib.AbstractContextManager[None]:
  """The policy exports lower under: XLA attention, which every platform runs."""
  return attention_policy(XLA)


def policy_from_flags(use_cudnn_flash_attention: Any = None,
                      use_flash_attention: Any = None) -> str:
  """Pax's USE_CUDNN_FLASH_ATTENTION / USE_FLASH_ATTENTION -> a policy.

  None (both): "auto". The first one set decides: True -> "cudnn" (fused
  attention where the platform has it), False -> "xla".

  Raises:
    UserError: a value that is neither None nor a bool.
  """
  for name, value in (("USE_CUDNN_FLASH_ATTENTION", use_cudnn_flash_attention),
                      ("USE_FLASH_ATTENTION", use_flash_attention)):
    if value is not None and not isinstance(value, bool):
      raise UserError(f"{name} must be True, False or None (auto), got {value!r}.")
  for value in (use_cudnn_flash_attention, use_flash_attention):
    if value is not None:
      return CUDNN if value else XLA
  return "auto"


# ---------------------------------------------------------------- the choice


def cudnn_max_head_dim() -> int:
  """cuDNN's largest head dim for bf16/fp16 flash attention: 256 from Hopper on, else 128."""
  try:
    capability = jax.devices()[0].compute_capability
    return 256 if tuple(int(x) for x in str(capability).split(".")) >= (9, 0) else 128
  except Exception:  # no compute capability (not CUDA): the conservative bound
    return 128


def choose_implementation(platform: str, dtype: Any, *, policy: str = "auto",
                          dropout: bool = False, logit_cap: float = 0.0, q_len: int = 2,
                          kv_len: int = 2, head_dim: int = 64, has_bias: bool = False,
                          max_head_dim: int = 128, extra_logit: float | None = None
                          ) -> tuple[str, str]:
  """("cudnn" | "xla", why) for one attention call, decided from static facts.

  Args:
    platform: what the program is lowered for ('cpu', 'cuda', 'rocm', 'tpu').
    dtype: the inputs' dtype.
    policy: "auto" or "cudnn": cuDNN wherever the rule allows; "xla": never.
    dropout: attention dropout is on (cuDNN never returns the probabilities).
    logit_cap: > 0 caps the logits (jax.nn's fused call has no cap).
    q_len, kv_len, head_dim, has_bias: the call's shape; cuDNN refuses one
      query position (a bias or mask must span the query axis), head dims
      that are not a multiple of 8 or above max_head_dim, and odd lengths
      with a bias.
    max_head_dim: cuDNN's bound on this GPU (cudnn_max_head_dim()).
    extra_logit: not None adds a logit to the softmax's denominator (no fused kernel does).
  """
  dtype_name = np.dtype(dtype).name
  where = f"{platform}, {dtype_name}"
  if _check_policy(policy) == XLA:
    return XLA, f"{where}, policy xla"
  if platform != "cuda":
    return XLA, platform
  if dtype_name not in _FUSED_DTYPES:
    return XLA, where
  if dropout:
    return XLA, f"{where}, attention dropout"
  if logit_cap > 0.0:
    return XLA, f"{where}, attention logit cap"
  if extra_logit is not None:
    return XLA, f"{where}, attention extra logit"
  if q_len == 1:
    return XLA, f"{where}, one query position"
  if head_dim % 8 or head_dim > max_head_dim:
    return XLA, f"{where}, head dim {head_dim}"
  if has_bias and (q_len % 2 or kv_len % 2):
    return XLA, f"{where}, odd length {q_len}x{kv_len} with a bias"
  return CUDNN, where


def describe(implementation: str, reason: str) -> str:
  """The log line's text: 'cudnn fused (cuda, bfloat16)' or 'xla (cpu)'."""
  return f"{'cudnn fused' if implementation == CUDNN else implementation} ({reason})"


# ------------------------------------------------------------ run bookkeeping


def start_run(policy: str, log: Callable[[str], None] | None = None) -> None:
  """Sets the run's policy and forgets earlier choices; each new choice is logged once."""
  set_attention_policy(policy)
  _run.update(policy=policy, choices=[], listener=None, log=log)


def policy_warning() -> str | None:
  """The warning a run gets when fused attention was asked for on a platform without cuDNN."""
  platform = lowering_platform()
  if current_policy() == CUDNN and platform != "cuda":
    return f"fused attention was asked for, but this run is on {platform}: attention runs on XLA"
  return None


def on_choice(listener: Callable[[dict[str, Any]], None] | None) -> None:
  """Calls listener(run_record()) now and whenever a new choice is made."""
  _run["listener"] = listener
  if listener is not None:
    listener(run_record())


def run_record() -> dict[str, Any]:
  """run_env.json's "attention": the policy and each distinct (implementation, reason)."""
  record = {"policy": _run.get("policy", _global["policy"]),
            "choices": [{"implementation": i, "reason": r} for i, r in _run["choices"]]}
  if key_mask_fold():
    record["key_mask_fold"] = True
  if not key_mask_lengths():
    record["key_mask_lengths"] = False
  return record


def note(implementation: str, reason: str) -> None:
  """Records one choice (once per distinct one): logged, and passed to the listener."""
  if (implementation, reason) in _run["choices"]:
    return
  _run["choices"].append((implementation, reason))
  if _run.get("log") is not None:
    _run["log"](f"attention: {describe(implementation, reason)}")
  if _run["listener"] is not None:
    _run["listener"](run_record())


def set_key_mask_fold(on: bool) -> None:
  """Whether the cuDNN path folds a key-only mask into the head dim (fold_key_mask).

  Off: it is exact (tests/attention_test.py, tests/key_mask_fold_test.py), but on
  an H200 the FlanT5Base step took 1.07x the time, where key counts take 0.905x
  (`python -m benchmarks.key_masks`, benchmarks/gpu_check.sh's flan_t5_key_masks).
  Key counts come first: the fold takes a bool key mask, never KeyLengths.
  Read as programs are traced, like the policy; run_env.json's "attention" says
  so when it is on.
  """
  _global["key_mask_fold"] = bool(on)


def key_mask_fold() -> bool:
  """Whether the key-mask fold is on (set_key_mask_fold)."""
  return _global.get("key_mask_fold", False)


def set_key_mask_lengths(on: bool) -> None:
  """Whether the cuDNN path hands a KeyLengths mask to cuDNN as per-row key counts.

  paxlike.layers.attention.KeyLengths is a key mask that keeps each row's
  first keys (T5's encoder padding). On, cuDNN takes the counts as its own
  padding mask and the bias keeps its batch (T5's relative-position bias:
  1), so no [b, n, t, s] bias is built; off, the counts are spelt out as a
  mask and folded into the bias, as any mask is. Read as programs are
  traced, like the policy; run_env.json's "attention" says so when it is
  off. On by default: the same attention either way, and on an H200 the
  FlanT5Base step takes 0.905x the time (docs/mfu.md).
  """
  _global["key_mask_lengths"] = bool(on)


def key_mask_lengths() -> bool:
  """Whether KeyLengths masks reach cuDNN as key counts (set_key_mask_lengths)."""
  return _global.get("key_mask_lengths", True)
