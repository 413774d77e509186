"""MFU suite: tokens/s and MFU across model sizes, always beside the plain-JAX reference.

    python -m benchmarks.mfu_suite [--device_kind=cpu] [--sizes=tiny,small,medium]
        [--steps=10] --out=DIR [--list]

`--device_kind=h100` (any GPU kind) runs what fits one GPU by default: the 1B
LM shape of C4Spmd1BAdam4Replicas (batch 8 x 1024, bf16), FlanT5Base and
FlanT5Large, each on a [1, 1, 1] mesh; `--list` prints a plan without running it.

Each size runs `python -m benchmarks.train_step` (the step paxlike.trainer runs
and the hand-written JAX step of the model's family, benchmarks/reference_lm.py
or benchmarks/reference_t5.py, timed alternately in one process) in its own
process, with as many fake CPU devices as its mesh needs on a CPU. The suite
adds the peak FLOP/s per device (the device table for --device_kind, or on a
CPU a matmul calibration with the same device count, or
--peak_tflops_per_device) and writes:

  report.json   every record, the peaks and where they came from
  report.md     one table: params, tokens/s, MFU of paxlike and the reference, ratio
  mfu.png       tokens/s and MFU against model size, paxlike and reference

MFU = model FLOPs per step (paxlike.flops: the LM's 6N + 6·L·S·D_attn per
token, causal attention halved; T5's encoder-decoder formula) / step time /
devices / peak. The ratio is paxlike's step time over the reference's: 1.0 is
parity, above is slower.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import train_step as ts

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_FLAG = "--xla_force_host_platform_device_count"

# name -> (experiment, overrides). CPU sizes grow the tiny LM; accelerator sizes are
# Pax's own experiments (their meshes must match the machine's devices).
SIZES: dict[str, tuple[str, list[str]]] = {
    "tiny": ("LmCloudSpmdTiny", []),
    "small": ("LmCloudSpmdTiny", ["MODEL_DIMS=128", "NUM_LAYERS=4", "VOCAB_SIZE=1024",
                                  "MAX_SEQ_LEN=128", "PERCORE_BATCH_SIZE=8"]),
    "medium": ("LmCloudSpmdTiny", ["MODEL_DIMS=256", "NUM_LAYERS=4", "VOCAB_SIZE=4096",
                                   "MAX_SEQ_LEN=128", "PERCORE_BATCH_SIZE=8"]),
    "large": ("LmCloudSpmdTiny", ["MODEL_DIMS=512", "NUM_LAYERS=6", "NUM_HEADS=8",
                                  "VOCAB_SIZE=8192", "MAX_SEQ_LEN=256",
                                  "PERCORE_BATCH_SIZE=4"]),
    # Encoder-decoder: the CPU-sized Flan-T5 grown; its reference is benchmarks/reference_t5.py.
    "t5_tiny": ("FlanT5Tiny", []),
    "t5_small": ("FlanT5Tiny", ["MODEL_DIMS=128", "HIDDEN_DIMS=256", "NUM_HEADS=4",
                                "DIMS_PER_HEAD=32", "VOCAB_SIZE=1024", "MAX_INPUT_LEN=64",
                                "MAX_TARGET_LEN=32", "PERCORE_BATCH_SIZE=8"]),
    "t5_medium": ("FlanT5Tiny", ["MODEL_DIMS=256", "HIDDEN_DIMS=512", "NUM_HEADS=4",
                                 "DIMS_PER_HEAD=64", "NUM_ENCODER_LAYERS=4",
                                 "NUM_DECODER_LAYERS=4", "VOCAB_SIZE=4096", "MAX_INPUT_LEN=128",
                                 "MAX_TARGET_LEN=64", "PERCORE_BATCH_SIZE=8"]),
    "lmcloud_2b": ("LmCloudSpmd2B", []),
    "c4_1b": ("C4Spmd1BAdam4Replicas", []),
    "c4_16b": ("C4Spmd16BAdam32Replicas", []),
    "lmcloud_32b": ("LmCloudSpmd32B", []),
    # One GPU (an H100 80GB): Pax's models on a [1, 1, 1] mesh, bf16, at the batch sizes of
    # ../shared/GPU_FACTS.md. No dropout: the T5 reference has none, and attention
    # dropout would keep attention off cuDNN's fused kernel.
    # COMBINE_QKV=False: the plain-JAX reference has separate q/k/v projections; the same
    # math, three matmuls instead of one, so both sides run the same model.
    "c4_1b_1gpu": ("C4Spmd1BAdam4Replicas", ["ICI_MESH_SHAPE=[1,1,1]",
                                             "PERCORE_BATCH_SIZE=8", "COMBINE_QKV=False"]),
    "flan_t5_base_1gpu": ("FlanT5Base", ["ICI_MESH_SHAPE=[1,1,1]", "PERCORE_BATCH_SIZE=32",
                                         "DROPOUT_PROB=0.0"]),
    "flan_t5_large_1gpu": ("FlanT5Large", ["ICI_MESH_SHAPE=[1,1,1]", "PERCORE_BATCH_SIZE=16",
                                           "DROPOUT_PROB=0.0"]),
}
DEFAULT_SIZES = {"cpu": ["tiny", "small", "medium", "t5_tiny", "t5_small", "t5_medium"],
                 "gpu": ["c4_1b_1gpu", "flan_t5_base_1gpu", "flan_t5_large_1gpu"],
                 "tpu": ["large", "lmcloud_2b", "c4_1b"]}
# On GPUs attention runs without a logit cap (Pax's GPU configs set ATTEN_LOGIT_CAP=-1:
# cuDNN's fused kernel has no cap, and the PyTorch peers use none); added where the
# experiment has the knob.
GPU_NO_LOGIT_CAP = "ATTEN_LOGIT_CAP=-1.0"
# --device_kind -> the device table's key in paxlike.flops.PEAK_FLOPS.
DEVICE_KINDS = {"cpu": None, "tpu_v4": "TPU v4", "tpu_v5e": "TPU v5e", "tpu_v5p": "TPU v5p",
                "tpu_v6e": "TPU v6", "a100": "A100", "h100": "H100", "h200": "H200"}


class SuiteError(Exception):
  """Bad input: printed as `error: ...`, exit 2."""


def _family(device_kind: str) -> str:
  return "cpu" if device_kind == "cpu" else ("tpu" if device_kind.startswith("tpu") else "gpu")


def mesh_devices(exp_name: str, overrides: Sequence[str]) -> int:
  """Devices the experiment's mesh needs (1 for pmap experiments on a CPU)."""
  from paxlike import experiment, registry

  exp = experiment.instantiate(registry.get(exp_name), list(overrides))
  if exp.ICI_MESH_SHAPE is None:
    return 1
  n = 1
  for d in list(exp.ICI_MESH_SHAPE) + list(exp.DCN_MESH_SHAPE or []):
    n *= d
  return n


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
  """The sizes this invocation runs: name, experiment, overrides and devices, checked.

  Each experiment is instantiated with its overrides (an unknown or mistyped
  hyperparameter fails here, before anything runs), nothing is compiled.
  """
  from paxlike import experiment, registry

  family = _family(args.device_kind)
  sizes = args.sizes or DEFAULT_SIZES[family]
  unknown = [s for s in sizes if s not in SIZES]
  if unknown:
    raise SuiteError(f"unknown sizes {unknown}; choose from {', '.join(SIZES)}.")
  out = []
  for size in sizes:
    exp_name, overrides = SIZES[size]
    overrides = [*overrides, *args.set]
    names = {h.name for h in experiment.hparams(registry.get(exp_name)())}
    if family == "gpu" and "ATTEN_LOGIT_CAP" in names and not any(
        o.startswith("ATTEN_LOGIT_CAP=") for o in overrides):
      overrides.append(GPU_NO_LOGIT_CAP)
    out.append({"size": size, "exp": exp_name, "overrides": overrides,
                "devices": mesh_devices(exp_name, overrides)})
  return out


def _env(devices: int | None) -> dict[str, str]:
  env = dict(os.environ)
  if devices is not None:  # a CPU: fake devices
    kept = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    env["XLA_FLAGS"] = " ".join([*kept, f"{DEVICE_FLAG}={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                   else "")
  return env


def run_train_step(exp_name: str, overrides: Sequence[str], steps: int, warmup: int,
                   devices: int | None, timeout: float) -> dict[str, Any]:
  """benchmarks.train_step in a fresh process; its JSON record."""
  cmd = [sys.executable, "-m", "benchmarks.train_step", f"--exp={exp_name}",
         f"--steps={steps}", f"--warmup={warmup}"]
  if overrides:
    cmd += ["--set", *overrides]
  proc = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(devices), capture_output=True, text=True,
                        timeout=timeout)
  if proc.returncode != 0:
    raise SuiteError(f"benchmarks.train_step --exp={exp_name} {' '.join(overrides)} failed "
                     f"(exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def calibrate(devices: int, dtype: str, timeout: float) -> float:
  """Per-device matmul peak with `devices` fake CPU devices working at once (a fresh process)."""
  code = ("import jax; from paxlike import flops; "
          f"print(flops.calibrate_peak_flops(jax.devices(), {dtype!r}))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(devices),
                        capture_output=True, text=True, timeout=timeout)
  if proc.returncode != 0:
    raise SuiteError(f"the CPU peak calibration failed: {proc.stderr.strip()[-300:]}")
  return float(proc.stdout.strip().splitlines()[-1])


def table_peak(device_kind: str, dtype: str) -> float | None:
  from paxlike import flops

  key = DEVICE_KINDS[device_kind]
  return flops.peak_flops_per_device(key, dtype) if key else None


def add_mfu(record: dict[str, Any], peak: float | None) -> dict[str, Any]:
  """MFU of both sides from the record's model FLOPs, step times and device count."""
  flops_step, n = record["model_flops_per_step"], record["devices"]
  record["peak_flops_per_device"] = peak
  record["paxlike_mfu"] = flops_step / record["step_s_median"] / n / peak if peak else None
  ref_s = record.get("ref_step_s_median")
  record["ref_tokens_per_sec"] = (record["tokens_per_sec"] * record["step_s_median"] / ref_s
                                  if ref_s else None)
  record["ref_mfu"] = flops_step / ref_s / n / peak if (peak and ref_s) else None
  return record


def _fmt(x: float | None, spec: str) -> str:
  return "n/a" if x is None else format(x, spec)


def table_rows(report: dict[str, Any]) -> list[str]:
  """The report's markdown table (docs/mfu.md shows it as rendered here, never retyped)."""
  rows = ["| size | experiment | params | devices | dtype | paxlike tokens/s | reference "
          "tokens/s | ratio (step time) | paxlike MFU | reference MFU |",
          "|---|---|---|---|---|---|---|---|---|---|"]
  for r in report["results"]:
    rows.append(
        f"| {r['size']} | {r['exp'].rsplit('.', 1)[-1]} | {r['num_params'] / 1e6:,.2f}M | "
        f"{r['devices']} | {r['fprop_dtype']} | {r['tokens_per_sec']:,.0f} | "
        f"{_fmt(r['ref_tokens_per_sec'], ',.0f')} | {_fmt(r['ratio'], '.3f')} | "
        f"{_fmt(r['paxlike_mfu'] and 100 * r['paxlike_mfu'], '.2f')}% | "
        f"{_fmt(r['ref_mfu'] and 100 * r['ref_mfu'], '.2f')}% |")
  return rows


def markdown(report: dict[str, Any]) -> str:
  rows = table_rows(report)
  release = f"; JAX {report['jax']}" if report.get("jax") else ""
  peaks = ", ".join(f"{k}: {v['tflops']:.4g} TFLOP/s ({v['source']})"
                    for k, v in report["peaks"].items())
  return "\n".join([
      f"# MFU suite: {report['device_kind']} ({report['machine']}{release})", "",
      f"{report['steps']} timed steps per side, alternating; ratio = paxlike step time / "
      "reference step time (1.0 = parity).", "",
      f"Peak per device: {peaks}.", "",
      "MFU = model FLOPs per step (paxlike.flops: LM 6N + 6·L·S·D_attn per token, causal "
      "attention halved; T5 the encoder-decoder formula) / step time / devices / peak.", "",
      *rows, ""])


def plot(report: dict[str, Any], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  res = sorted(report["results"], key=lambda r: r["num_params"])
  x = [r["num_params"] for r in res]
  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
  a.plot(x, [r["tokens_per_sec"] for r in res], "o-", label="paxlike")
  a.plot(x, [r["ref_tokens_per_sec"] or float("nan") for r in res], "s--", label="JAX reference")
  a.set(xscale="log", yscale="log", xlabel="parameters", ylabel="tokens / s",
        title="Throughput")
  b.plot(x, [100 * (r["paxlike_mfu"] or float("nan")) for r in res], "o-", label="paxlike")
  b.plot(x, [100 * (r["ref_mfu"] or float("nan")) for r in res], "s--", label="JAX reference")
  b.set(xscale="log", xlabel="parameters", ylabel="MFU (%)", title="MFU")
  for ax in (a, b):
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
  for r in res:
    if r["ratio"]:
      a.annotate(f"{r['ratio']:.2f}x", (r["num_params"], r["tokens_per_sec"]),
                 textcoords="offset points", xytext=(4, 6), fontsize=8)
  fig.suptitle(f"MFU suite on {report['device_kind']} (labels: paxlike / reference step time)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(report: dict[str, Any], out_dir: str) -> dict[str, str]:
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, n) for k, n in
           (("json", "report.json"), ("md", "report.md"), ("png", "mfu.png"))}
  with open(paths["json"], "w") as f:
    json.dump(report, f, indent=2, sort_keys=True)
    f.write("\n")
  with open(paths["md"], "w") as f:
    f.write(markdown(report))
  plot(report, paths["png"])
  return paths


def run_suite(args: argparse.Namespace, runner=run_train_step, calibrator=calibrate
              ) -> dict[str, Any]:
  """Every size: train_step record + peak + MFU; the whole report."""
  family = _family(args.device_kind)
  peaks: dict[str, dict[str, Any]] = {}
  results = []
  for entry in plan(args):
    size, exp_name, overrides, devices = (entry[k] for k in ("size", "exp", "overrides",
                                                              "devices"))
    t0 = time.time()
    record = runner(exp_name, overrides, args.steps, args.warmup,
                    devices if family == "cpu" else None, args.timeout)
    dtype = record["fprop_dtype"]
    key = f"{devices}x{dtype}"
    if key not in peaks:
      if args.peak_tflops_per_device:
        peaks[key] = {"tflops": args.peak_tflops_per_device, "source": "--peak_tflops_per_device"}
      elif family == "cpu":
        peaks[key] = {"tflops": calibrator(devices, dtype, args.timeout) / 1e12,
                      "source": f"calibrated: {devices}-device {dtype} matmul"}
      else:
        peak = table_peak(args.device_kind, dtype)
        peaks[key] = {"tflops": (peak or 0) / 1e12,
                      "source": f"table: {DEVICE_KINDS[args.device_kind]} {dtype}"}
    record = add_mfu(record, peaks[key]["tflops"] * 1e12 or None)
    record.update(size=size, overrides=overrides, wall_s=time.time() - t0)
    results.append(record)
    print(f"{size}: {record['num_params'] / 1e6:.2f}M params, {record['tokens_per_sec']:,.0f} "
          f"tokens/s, ratio {_fmt(record['ratio'], '.3f')}, MFU "
          f"{_fmt(record['paxlike_mfu'] and 100 * record['paxlike_mfu'], '.2f')}% "
          f"(reference {_fmt(record['ref_mfu'] and 100 * record['ref_mfu'], '.2f')}%)",
          flush=True)
  return {"device_kind": args.device_kind, "machine": f"{platform.machine()}, "
          f"{os.cpu_count()} cores", "jax": importlib.metadata.version("jax"),
          "steps": args.steps, "peaks": peaks, "results": results}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = ts.Parser(prog="python -m benchmarks.mfu_suite", description=__doc__.split("\n")[0])
  p.add_argument("--device_kind", default="cpu", choices=sorted(DEVICE_KINDS),
                 help="what runs the suite: its peak and its default sizes (default cpu).")
  p.add_argument("--sizes", type=lambda s: [x for x in s.split(",") if x], default=None,
                 help=f"comma-separated, from {', '.join(SIZES)}.")
  p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                 help="overrides applied to every size.")
  p.add_argument("--steps", type=int, default=10, help="timed steps per side and size.")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation.")
  p.add_argument("--peak_tflops_per_device", type=float, default=None,
                 help="use this peak instead of the table / CPU calibration.")
  p.add_argument("--out", default=None,
                 help="the directory report.json, report.md and mfu.png go to (required to "
                      "run; nothing is written into the repository unless named here).")
  p.add_argument("--timeout", type=float, default=1800, help="seconds per size.")
  p.add_argument("--list", action="store_true",
                 help="print the sizes that would run (experiment, overrides, devices) and "
                      "exit; nothing is compiled.")
  args = p.parse_args(argv)
  if args.steps < 1 or args.warmup < 0:
    ts.fail("--steps must be at least 1 and --warmup at least 0.")
  return args


def check_out(out: str | None) -> str:
  """--out as an absolute path: required, and not an existing file."""
  if not out:
    ts.fail("--out is required: name the directory report.json, report.md and mfu.png go "
            "to, e.g. --out=/tmp/mfu (or --list to only print the plan).")
  out = os.path.abspath(os.path.expanduser(out))
  if os.path.exists(out) and not os.path.isdir(out):
    ts.fail(f"--out={out} is a file; name a directory.")
  return out


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  from paxlike.errors import UserError

  try:
    entries = plan(args)
    if args.list:
      for entry in entries:
        print(f"{entry['size']}: {entry['exp']} on {entry['devices']} device(s), "
              f"--set {' '.join(entry['overrides']) or '(none)'}")
      return 0
    args.out = check_out(args.out)  # before the steps run, not after
    report = run_suite(args)
  except (SuiteError, UserError) as e:
    ts.fail(str(e))
  paths = write_report(report, args.out)
  print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
