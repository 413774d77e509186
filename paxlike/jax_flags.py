"""JAX's own options as command-line flags (`--jax_debug_nans`, `--jax_compilation_cache_dir`).

Pax's main.py calls `jax.config.config_with_absl()`, so a Pax launch script
may pass any JAX option as a flag. paxlike does the same, on demand: the
JAX options become flags only when the command line names one (importing
JAX costs a second, which `--help` and most error lines need not pay).

What paxlike adds around JAX's own handling:
  - the PGLE options are refused in one line naming paxlike's flag, which
    also sets the XLA scheduler flag PGLE needs and records both;
  - `--jax_platforms` / `--jax_platform_name` are also put in the
    environment, where paxlike's platform-aware XLA flags look (and a dry
    run, which always compiles on fake CPU devices, refuses them);
  - run_env.json records the JAX options the command line and the
    environment (`JAX_*`) set, and with a persistent compilation cache the
    run logs how many of its compiles the cache answered.
"""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from paxlike.errors import UserError

# JAX options with a paxlike flag of their own, which does more than the option.
PAXLIKE_OWN = {
    "jax_enable_pgle": "--pgle=auto (it also turns on the latency-hiding scheduler PGLE "
                       "needs, and records both in run_env.json)",
    "jax_pgle_profiling_runs": "--pgle_profiling_runs",
    "jax_pgle_aggregation_percentile": "--pgle_aggregation_percentile",
}
PLATFORM_OPTIONS = ("jax_platforms", "jax_platform_name")
ENV_PREFIX = "JAX_"


def _flag_name(arg: str) -> str:
  """The flag an argument names ('' for a value): --jax_x=1 -> jax_x, --nojax_x -> jax_x."""
  if not arg.startswith("-"):
    return ""
  name = arg.lstrip("-").split("=", 1)[0]
  return name[2:] if name.startswith("nojax_") else name


def define_if_named(args: list[str], defined: flags.FlagValues) -> None:
  """Makes JAX's options absl flags when an argument names one paxlike does not define."""
  if any(n.startswith("jax_") and n not in defined for n in map(_flag_name, args)):
    define(defined)


def define(defined: flags.FlagValues) -> None:
  """JAX's options as absl flags (once); JAX applies each one present after parsing."""
  if "jax_debug_nans" not in defined:
    import jax

    jax.config.config_with_absl()


def given(values: flags.FlagValues) -> dict[str, Any]:
  """{option: value} of the JAX options the command line set."""
  import jax

  return {n: values[n].value for n in jax.config.values if n in values and values[n].present}


def check(values: flags.FlagValues) -> None:
  """Refuses what paxlike does otherwise; exports the platform for the XLA flag plan.

  Raises:
    UserError: a PGLE option, or a platform with --mode=dry_run.
  """
  set_here = given(values) if "jax_debug_nans" in values else {}  # JAX's flags defined
  for name in sorted(set_here):
    if name in PAXLIKE_OWN:
      raise UserError(f"--{name} is JAX's option behind paxlike's {PAXLIKE_OWN[name]}; "
                      "use that flag instead.")
  platforms = {n: set_here[n] for n in PLATFORM_OPTIONS if set_here.get(n)}
  if platforms and values.mode == "dry_run":
    name = next(iter(platforms))
    raise UserError(f"--{name}={platforms[name]} with --mode=dry_run: a dry run always "
                    "compiles on fake CPU devices; drop the flag.")
  for name, value in platforms.items():
    os.environ[name.upper()] = str(value)  # where xla_flags.detect_platform looks


def environment() -> dict[str, str]:
  """The JAX_* environment variables (JAX reads its options' at import)."""
  return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIX)}


def record(values: flags.FlagValues) -> dict[str, Any]:
  """run_env.json's keys: the JAX options set on the command line and by JAX_* variables."""
  out: dict[str, Any] = {}
  if set_here := given(values):
    out["jax_flags"] = set_here
  if env := environment():
    out["jax_env"] = env
  return out


class CacheReport:
  """Counts what JAX's persistent compilation cache answered (jax.monitoring's events).

  Listens from construction on; `summary()` is None when no cache directory is set.
  """

  EVENTS = {"/jax/compilation_cache/compile_requests_use_cache": "requests",
            "/jax/compilation_cache/cache_hits": "hits"}

  def __init__(self) -> None:
    import jax
    from jax import monitoring

    self._dir = jax.config.jax_compilation_cache_dir
    self.counts = {"requests": 0, "hits": 0}
    if self._dir:
      monitoring.register_event_listener(self._on_event)

  def _on_event(self, event: str, **_: Any) -> None:
    if (key := self.EVENTS.get(event)) is not None:
      self.counts[key] += 1

  def summary(self) -> dict[str, Any] | None:
    if not self._dir:
      return None
    return {"dir": self._dir, **self.counts}

  def line(self) -> str | None:
    """One log line, or None without a cache."""
    s = self.summary()
    if s is None:
      return None
    return (f"compilation cache {s['dir']}: {s['hits']} of {s['requests']} compiles read "
            "from it (JAX stores programs that took at least "
            "jax_persistent_cache_min_compile_time_secs to compile)")
