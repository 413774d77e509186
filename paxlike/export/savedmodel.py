"""--export_format=savedmodel: a TF SavedModel of the decode, for TF Serving (`[export]` extra).

The program is the StableHLO export's serve function, converted with
jax2tf's native serialization (an XlaCallModule op holding the StableHLO,
batch size polymorphic), with its stablehlo.composite ops replaced by calls
of their decompositions: JAX lowers lax.top_k (sampling's top_k cut, every
beam-search step) to a composite that TensorFlow 2.21 cannot deserialize
("unregistered operation 'vhlo.composite_v2'"). Before the export is
declared written, TensorFlow runs its first warm-up request; a program this
TensorFlow cannot run is refused (UserError) and nothing is left on disk.
The parameters are tf.Variables the op reads, so they live in variables/ and
can be swapped like any SavedModel's. Signatures:

    serving_default   the decode features (int32 token ids) + seed (int32)
                      -> tokens [b, K, T] int32, scores [b, K] float32
    serve_text        (byte vocabulary only) text [b] string + seed
                      -> tokens, scores, generation [b, K] string

serve_text tokenizes and detokenizes inside the graph with plain TF ops
(bytes_split / decode_raw, the +offset shift, EOS and padding; back to
text up to the first EOS), exactly as the experiment's byte input does.
assets.extra/tf_serving_warmup_requests holds Predict warm-up requests for
both signatures at two batch sizes (see paxlike/export/warmup.py), and
manifest.json describes the signatures.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import numpy as np

from paxlike.errors import UserError
from paxlike.export import serving, warmup
from paxlike.export.job import ExportJob

FORMAT = "paxlike.savedmodel"
FORMAT_VERSION = 1
IDS_SIGNATURE = "serving_default"
TEXT_SIGNATURE = "serve_text"
TEXT_INPUT = "text"
TEXT_OUTPUT = "generation"


def _require_tensorflow() -> None:
  if importlib.util.find_spec("tensorflow") is None:
    raise UserError("--export_format=savedmodel needs TensorFlow; install the export extra: "
                    "pip install -e '.[export]'")


def _reason(e: Exception) -> str:
  """The line of a TensorFlow error that says why (it wraps it in a graph's stack)."""
  lines = [x.strip() for x in str(e).splitlines() if x.strip()] or [type(e).__name__]
  hits = [x for key in ("deserialize", "error: ") for x in lines if key in x]
  return (hits or lines)[0][:300]


def without_composites(exported: Any) -> Any:
  """exported with each stablehlo.composite replaced by a call of its decomposition.

  A composite names an operation a compiler may recognise (JAX lowers lax.top_k to
  "chlo.top_k") and carries its meaning as a function; the call keeps that meaning.
  TensorFlow 2.21's StableHLO (1.13.7) reads no vhlo.composite_v2, which JAX 0.10
  serializes, and does not refine a composite's decomposition to the batch size.
  XLA may then compile top_k as the sort its decomposition is, not as a TopK.
  """
  import dataclasses

  from jax.extend import mlir as jax_mlir
  from jax.interpreters import mlir
  from jaxlib.mlir import ir
  from jaxlib.mlir.dialects import func, stablehlo

  with mlir.make_ir_context():
    module = jax_mlir.deserialize_portable_artifact(exported.mlir_module_serialized)
    composites = []

    def visit(op: Any) -> Any:
      if op.operation.name == "stablehlo.composite":
        composites.append(op.operation)
      return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if not composites:
      return exported
    for op in composites:
      with ir.InsertionPoint(op), op.location:
        call = func.CallOp([r.type for r in op.results], op.attributes["decomposition"],
                           list(op.operands))
      for old, new in zip(op.results, call.results, strict=True):
        old.replace_all_uses_with(new)
      op.erase()
    # Only this JAX reads the result back (jax2tf serializes its own module), so the
    # newest StableHLO loses nothing; mixed serialization keeps Shardy's ops, as JAX does.
    serialized = jax_mlir.serialize_portable_artifact(
        module, stablehlo.get_current_version(), True)
  return dataclasses.replace(exported, mlir_module_serialized=serialized)


def tensorflow_reads_this_jax() -> str | None:
  """None when this TensorFlow runs what this JAX's jax2tf writes; else why not.

  jax2tf embeds StableHLO bytecode, which a TensorFlow built before the JAX
  release may not read (JAX promises about three weeks of forward
  compatibility): TensorFlow 2.21 does not read JAX 0.12's. A tiny
  shape-polymorphic program with a lax.top_k, converted the way build_module
  converts the decode and run, tells.
  """
  import jax
  import jax.numpy as jnp
  import tensorflow as tf
  from jax.experimental import jax2tf

  try:
    (b,) = jax.export.symbolic_shape("b")
    exported = without_composites(jax.export.export(
        jax.jit(lambda x: jnp.sum(jax.lax.top_k(x * 2, 2)[0], axis=-1)), platforms=("cpu",))(
            jax.ShapeDtypeStruct((b, 3), np.float32)))
    fn = jax2tf.convert(exported.call, polymorphic_shapes=["(b, 3)"], with_gradient=False)
    tf.function(fn, autograph=False)(tf.constant(np.ones((2, 3), np.float32)))
  except Exception as e:  # noqa: BLE001  (TF raises several kinds; the message says)
    return _reason(e)[:200]
  return None


def _variable_name(name: str) -> str:
  """A parameter path as a TF variable name ([A-Za-z0-9_.\\-/] only)."""
  return "".join(c if c.isalnum() or c in "_.-/" else "_" for c in name)


def _poly(feature: Any) -> str:
  return "(" + ", ".join(["b", *map(str, feature.shape)]) + ")"


def text_features(tf: Any, job: ExportJob, text: Any) -> dict[str, Any]:
  """[b] strings -> the decode features, the way the byte input tokenizes prompts."""
  vocab = job.vocabulary
  chars = tf.strings.bytes_split(text)  # ragged [b, None] of one-byte strings
  byte_values = tf.io.decode_raw(chars.flat_values, tf.uint8)[:, 0]
  ids = chars.with_flat_values(tf.cast(byte_values, tf.int32) + vocab["offset"])
  if job.append_eos:
    eos = tf.fill(tf.stack([ids.nrows(), 1]), tf.constant(vocab["eos_id"], tf.int32))
    ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
  out = {}
  width = next(f.shape[0] for f in job.features if f.text == "tokens")
  ids = ids[:, :width]
  for f in job.features:
    if f.text == "tokens":
      out[f.name] = tf.cast(ids.to_tensor(default_value=vocab["pad_id"], shape=[None, width]),
                            f.dtype)
    else:
      out[f.name] = tf.cast(ids.row_lengths(), f.dtype)
  return out


def detokenize(tf: Any, job: ExportJob, tokens: Any) -> Any:
  """tokens [b, K, T] -> [b, K] strings: the bytes before the first EOS."""
  vocab = job.vocabulary
  offset, eos = vocab["offset"], vocab["eos_id"]
  before_eos = tf.cumsum(tf.cast(tf.equal(tokens, eos), tf.int32), axis=-1) == 0
  is_byte = (tokens >= offset) & (tokens < offset + 256)
  table = tf.constant([bytes([i]) for i in range(256)])
  chars = tf.gather(table, tf.clip_by_value(tokens - offset, 0, 255))
  chars = tf.where(before_eos & is_byte, chars, tf.constant(b""))
  return tf.strings.reduce_join(chars, axis=-1)


def build_module(tf: Any, job: ExportJob, exported: Any, names: list[str],
                 values: list[np.ndarray]) -> tuple[Any, dict[str, Any]]:
  """The tf.Module holding the parameter variables, and the signatures' concrete functions.

  Args:
    tf: the tensorflow module.
    job: the export.
    exported: serve lowered by serving.lower, passed through without_composites.
    names: the parameters' names (serving.param_names).
    values: their values, in that order.

  The functions are not attributes of the module: tf.saved_model.save traces
  every tf.function it finds on the object graph again, which would lower the
  program a second time and store a second copy of it in saved_model.pb.
  """
  from jax.experimental import jax2tf

  # Converting the Exported's call embeds its module as it is: the decode is not traced
  # again, and the composites stay replaced.
  converted = jax2tf.convert(
      exported.call,
      polymorphic_shapes=[None, *(_poly(f) for f in job.features), "()"],
      native_serialization_platforms=job.platforms, with_gradient=False)
  module = tf.Module()
  module.params = [tf.Variable(v, trainable=False, name=_variable_name(n))
                   for n, v in zip(names, values, strict=True)]
  specs = [tf.TensorSpec([None, *f.shape], tf.as_dtype(f.dtype), name=f.name)
           for f in job.features]
  seed_spec = tf.TensorSpec([], tf.as_dtype(serving.SEED_DTYPE), name=serving.SEED_NAME)

  def serve_ids(*args: Any) -> dict[str, Any]:
    tokens, scores = converted(list(module.params), *args)
    return {"tokens": tokens, "scores": scores}

  ids_fn = tf.function(serve_ids, input_signature=[*specs, seed_spec],
                       autograph=False).get_concrete_function()
  signatures = {IDS_SIGNATURE: ids_fn}
  if job.vocabulary["kind"] == "byte" and job.has_text:

    def serve_text(text: Any, seed: Any) -> dict[str, Any]:
      features = text_features(tf, job, text)
      # The concrete function: the text signature runs the very same XlaCallModule.
      out = ids_fn(*(features[f.name] for f in job.features), seed)
      return {**out, TEXT_OUTPUT: detokenize(tf, job, out["tokens"])}

    signatures[TEXT_SIGNATURE] = tf.function(
        serve_text, autograph=False,
        input_signature=[tf.TensorSpec([None], tf.string, name=TEXT_INPUT), seed_spec]
    ).get_concrete_function()
  return module, signatures


def warmup_records(tf: Any, job: ExportJob, has_text: bool) -> list[bytes]:
  """PredictionLogs for each signature, at batch 1 and at the examples' batch."""

  def tensor(x: np.ndarray) -> bytes:
    return tf.make_tensor_proto(x).SerializeToString()

  seed = tensor(np.asarray(0, serving.SEED_DTYPE))
  n = len(next(iter(job.examples.values())))
  records = []
  for rows in sorted({1, n}):
    ids = {f.name: tensor(np.asarray(job.examples[f.name][:rows], f.dtype))
           for f in job.features}
    records.append(warmup.predict_log(IDS_SIGNATURE, {**ids, serving.SEED_NAME: seed}))
    if has_text:
      texts = np.asarray([t.encode() for t in job.example_texts[:rows]], object)
      records.append(warmup.predict_log(
          TEXT_SIGNATURE, {TEXT_INPUT: tensor(texts), serving.SEED_NAME: seed}))
  return records


def run_first_request(tf: Any, job: ExportJob, ids_fn: Any) -> None:
  """Runs the ids signature on the first warm-up request's input (batch 1) in TensorFlow.

  TF Serving replays the warm-up requests when it loads the model and fails the load if
  one fails; an export TensorFlow cannot run is refused here instead of written.

  Raises:
    UserError: this TensorFlow cannot run the program (the reason it gave is in the message).
  """
  from paxlike import log

  if "cpu" not in job.platforms:  # TensorFlow's CPU cannot run it; a server's device will
    log.warning("--export_platforms=%s has no cpu: the SavedModel was not run in TensorFlow "
                "before it was written", ",".join(job.platforms))
    return
  args = [tf.constant(np.asarray(job.examples[f.name][:1], f.dtype)) for f in job.features]
  try:
    with tf.device("/CPU:0"):
      ids_fn(*args, tf.constant(0, tf.as_dtype(serving.SEED_DTYPE)))["tokens"].numpy()
  except Exception as e:  # noqa: BLE001  (TF raises several kinds; the message says)
    import jax

    raise UserError(
        f"TensorFlow {tf.__version__} cannot run the SavedModel of this decode "
        f"({serving.describe_settings(job.settings)}) that jax {jax.__version__}'s jax2tf "
        f"writes ({_reason(e)}); use --export_format=stablehlo, whose run.py runs it with "
        "jax alone.") from None


def _signature(fn: Any) -> dict[str, Any]:
  """A concrete function's inputs and outputs as the manifest lists them."""
  inputs = [{"name": s.name, "dtype": s.dtype.name,
             "shape": ["b" if d is None else d for d in s.shape.as_list()]}
            for s in fn.structured_input_signature[0]]
  outputs = [{"name": k, "dtype": v.dtype.name,
              "shape": ["b" if d is None else d for d in v.shape.as_list()]}
             for k, v in sorted(fn.structured_outputs.items())]
  return {"inputs": inputs, "outputs": outputs}


class SavedModelExporter:
  """A TF SavedModel for TF Serving (see the module docstring)."""

  name = "savedmodel"

  def check(self, job: ExportJob) -> tuple[ExportJob, Any]:
    """TensorFlow is installed and runs this JAX's programs, and the decode lowers.

    Returns:
      (job, the lowered decode without composites): write() converts that program.
    """
    _require_tensorflow()
    problem = tensorflow_reads_this_jax()
    if problem:
      import jax
      import tensorflow as tf

      raise UserError(f"TensorFlow {tf.__version__} cannot run what jax {jax.__version__}'s "
                      f"jax2tf writes ({problem}); install a TensorFlow released after this "
                      "JAX, or use --export_format=stablehlo.")
    return job, without_composites(serving.lower(job))

  def write(self, plan: tuple[ExportJob, Any], params: Any, step: int, out_dir: str) -> None:
    import jax
    import tensorflow as tf

    job, exported = plan
    names = serving.param_names(job.abstract_params)
    module, signatures = build_module(tf, job, exported, names,
                                      serving.flat_params(params, job.abstract_params))
    run_first_request(tf, job, signatures[IDS_SIGNATURE])
    tf.saved_model.save(module, out_dir, signatures=signatures)
    extra = os.path.join(out_dir, warmup.DIR)
    os.makedirs(extra)
    with tf.io.TFRecordWriter(os.path.join(extra, warmup.FILE)) as w:
      for record in warmup_records(tf, job, TEXT_SIGNATURE in signatures):
        w.write(record)
    import jaxlib

    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "experiment": job.experiment,
        "step": step,
        "job_log_dir": job.job_log_dir,
        "model": {"family": type(job.model).__name__,
                  "decode_features": list(job.model.decode_features())},
        "vocabulary": job.vocabulary,
        "text": {"append_eos": job.append_eos} if TEXT_SIGNATURE in signatures else None,
        "signatures": {k: _signature(v) for k, v in signatures.items()},
        "params": {"as": "tf.Variable", "count": len(names), "names": names},
        "platforms": list(job.platforms),
        "decode_settings": job.settings.record(),
        "warmup_requests": f"{warmup.DIR}/{warmup.FILE}",
        "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                     "tensorflow": tf.__version__},
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
      json.dump(manifest, f, indent=2)
      f.write("\n")
