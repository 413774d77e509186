"""--mode=export --export_format=stablehlo|savedmodel, end to end.

Two tiny jobs are trained in this process (the arithmetic LM and the
arithmetic Flan-T5, a few steps each) and exported through the CLI; fresh
processes that never import paxlike load the artifacts and decode the same
prompts paxlike decodes here from the same checkpoints. The CLI runs go in
the background while this process trains and decodes, so the file stays
within its time budget on two cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, describe, train_in_process, xla_flags_with_devices

STEPS = 3
LM = "ArithmeticAdditionTiny"
T5 = "FlanT5ArithmeticTiny"
TRAIN_SET = [f"NUM_TRAIN_STEPS={STEPS}", f"CHECKPOINT_EVERY_N_STEPS={STEPS}"]
# One encoder and one decoder layer: the same family at half the compile time. Every run
# on the T5 job (training, export, paxlike's decode) passes these.
T5_SET = ["NUM_ENCODER_LAYERS=1", "NUM_DECODER_LAYERS=1"]
T5_BEAMS = 2
# Two batch sizes, 2 and 5, from the one artifact. The first is also the batch of the
# SavedModel's warm-up requests (the decode input's first two prompts), so the TF check
# compiles one program fewer.
BATCH_ROWS = ((0, 2), (2, 7))


def _env(compile_cache: Path | None = None) -> dict[str, str]:
  env = dict(os.environ)
  if compile_cache:  # identical programs compiled twice in a loader are compiled once
    env["JAX_COMPILATION_CACHE_DIR"] = str(compile_cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  env["XLA_FLAGS"] = xla_flags_with_devices(1)
  env["JAX_PLATFORMS"] = "cpu"
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  env.pop("PYTHONPATH", None)  # the loaders must not find paxlike through it
  return env


class Background:
  """A subprocess started now and waited for later (the CLI or a loader script)."""

  def __init__(self, args: list[str], cwd: Path, compile_cache: Path | None = None) -> None:
    self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=_env(compile_cache),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self._done: subprocess.CompletedProcess | None = None

  def result(self, timeout: float = 300) -> subprocess.CompletedProcess:
    if self._done is None:
      out, err = self.proc.communicate(timeout=timeout)
      self._done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)
    return self._done


def cli(*args: str) -> Background:
  return Background(["-m", "paxlike.main", *args], REPO_ROOT)


def listing(root: Path) -> dict[str, tuple[int, int] | None]:
  """Every path under root: (size, mtime_ns) for files, None for directories."""
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for d in dirs:
      out[os.path.relpath(os.path.join(dirpath, d), root)] = None
    for f in files:
      st = os.stat(os.path.join(dirpath, f))
      out[os.path.relpath(os.path.join(dirpath, f), root)] = (st.st_size, st.st_mtime_ns)
  return out


def paxlike_decode(exp_name: str, overrides: list[str], job_log_dir: Path,
                   settings_kw: dict, batch_rows: tuple = BATCH_ROWS) -> dict:
  """paxlike's own decode of the job's checkpoint on batches of its decode input."""
  import jax

  from paxlike import config, decoding, evaluator, experiment, mesh, registry
  from paxlike.partitioning import SpmdPartitioner

  exp = experiment.instantiate(registry.get(exp_name), overrides)
  partitioner = SpmdPartitioner(mesh.build(exp.ICI_MESH_SHAPE, devices=jax.devices()[:1]))
  task = config.build(exp.task())
  train_input = next(config.build(c) for c in exp.datasets() if c.is_training)
  decode_input = config.build(exp.decode_datasets()[0])
  state, step = evaluator.restore_for_eval(task, train_input, partitioner, str(job_log_dir))
  model = task.model
  settings = decoding.DecodeSettings(**settings_kw, **model.special_ids())
  batch = decode_input.get_next()
  prompts, _, _ = model.prompt_and_target(batch)
  fn = jax.jit(lambda params, b, key: model.decode(params, b, key, settings))
  batches, tokens, texts = [], [], []
  for lo, hi in batch_rows:
    b = {k: np.asarray(batch[k][lo:hi]) for k in model.decode_features() if k in batch}
    with partitioner.context():
      out = fn(partitioner.decode_params(state), b, jax.random.key(0))
    batches.append({k: v.tolist() for k, v in b.items()})
    tokens.append(np.asarray(out.tokens).tolist())
    texts.append([decode_input.ids_to_strings(np.asarray(prompts[r])[None])[0]
                  for r in range(lo, hi)])
  return {"step": step, "batches": batches, "tokens": tokens, "texts": texts,
          # The export holds the parameters of the model that decodes: unrolled, one array
          # per layer (decoding.decoding_model), where state.params may stack them.
          "num_params": len(jax.tree.leaves(decoding.decoding_model(model, state.params)[1]))}


JAX_LOADER = textwrap.dedent('''
    """Loads StableHLO exports without paxlike: through run.py, and through the manifest alone."""
    import contextlib, importlib.util, io, json, os, sys
    import numpy as np

    spec = json.load(open(sys.argv[1]))
    results = {}
    for name, job in spec.items():
      d = job["dir"]
      mod_spec = importlib.util.spec_from_file_location(f"run_{name}", os.path.join(d, "run.py"))
      run = importlib.util.module_from_spec(mod_spec)
      mod_spec.loader.exec_module(run)
      decoder = run.load(d)
      api = [decoder(b, seed=0)[0].tolist() for b in job["batches"]]
      encoded = [{k: v.tolist() for k, v in decoder.encode(t).items()} for t in job["texts"]]
      generated = [[r["tokens"] for r in decoder.generate(t)] for t in job["texts"]]
      stdout = io.StringIO()
      with contextlib.redirect_stdout(stdout):
        code = run.main([d, *job["texts"][0]])
      cli_rows = [json.loads(line) for line in stdout.getvalue().splitlines()]
      stderr = io.StringIO()
      with contextlib.redirect_stderr(stderr):  # a list where a JSON object belongs
        bad_ids = (run.main([d, "--ids", "[[1, 2]]"]), stderr.getvalue())
      stderr = io.StringIO()
      with contextlib.redirect_stderr(stderr):  # a prompt longer than the export's input
        decoder.encode(["12+34=" * 200])
      long_prompt = stderr.getvalue()

      # Only what manifest.json says: files, argument order, input names and dtypes.
      import jax
      from safetensors.numpy import load_file
      m = json.load(open(os.path.join(d, "manifest.json")))
      with open(os.path.join(d, m["function"]["file"]), "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
      weights = load_file(os.path.join(d, m["params"]["file"]))
      params = [weights[t["name"]] for t in m["params"]["tensors"]]
      in_avals = [[str(x) for x in a.shape] + [str(a.dtype)] for a in exported.in_avals]
      raw, out_shapes = [], []
      call = jax.jit(exported.call)
      for b in job["batches"]:
        inputs = {i["name"]: np.asarray(0 if i["name"] == m["function"]["seed"] else b[i["name"]],
                                        dtype=i["dtype"]) for i in m["inputs"]}
        outs = call(*[params if a == "params" else inputs[a] for a in m["function"]["arguments"]])
        n = len(b[m["inputs"][0]["name"]])
        for o, want in zip(outs, m["outputs"]):
          out_shapes.append([list(o.shape), str(o.dtype),
                             [n if x == "b" else x for x in want["shape"]], want["dtype"]])
        raw.append(np.asarray(outs[0]).tolist())
      results[name] = {"api": api, "raw": raw, "encoded": encoded, "generated": generated,
                       "cli_code": code, "cli_rows": cli_rows, "bad_ids": bad_ids,
                       "long_prompt": long_prompt,
                       "in_avals": in_avals,
                       "out_shapes": out_shapes}
    results["paxlike_imported"] = "paxlike" in sys.modules
    print(json.dumps(results))
''')

TF_LOADER = textwrap.dedent('''
    """Loads SavedModel exports with TensorFlow alone and replays their warm-up requests."""
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.core.framework import tensor_pb2

    def prediction_log_class():
      """TF Serving's PredictionLog, as much as a Predict warm-up uses (values kept as bytes)."""
      F = descriptor_pb2.FieldDescriptorProto
      f = descriptor_pb2.FileDescriptorProto(name="warmup_check.proto", package="tfs",
                                             syntax="proto3")
      def msg(name, *fields, parent=None):
        m = (parent.nested_type if parent else f.message_type).add(name=name)
        for fname, number, ftype, type_name, label in fields:
          m.field.add(name=fname, number=number, type=ftype, type_name=type_name, label=label)
        return m
      one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
      msg("ModelSpec", ("name", 1, F.TYPE_STRING, None, one),
          ("signature_name", 3, F.TYPE_STRING, None, one))
      req = msg("PredictRequest", ("model_spec", 1, F.TYPE_MESSAGE, ".tfs.ModelSpec", one),
                ("inputs", 2, F.TYPE_MESSAGE, ".tfs.PredictRequest.InputsEntry", many))
      entry = msg("InputsEntry", ("key", 1, F.TYPE_STRING, None, one),
                  ("value", 2, F.TYPE_BYTES, None, one), parent=req)
      entry.options.map_entry = True
      msg("PredictLog", ("request", 1, F.TYPE_MESSAGE, ".tfs.PredictRequest", one))
      msg("PredictionLog", ("predict_log", 6, F.TYPE_MESSAGE, ".tfs.PredictLog", one))
      pool = descriptor_pool.DescriptorPool()
      pool.Add(f)
      return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfs.PredictionLog"))

    spec = json.load(open(sys.argv[1]))
    PredictionLog = prediction_log_class()
    results = {}
    for name, job in spec.items():
      d = job["dir"]
      model = tf.saved_model.load(d)
      ids_sig, text_sig = model.signatures["serving_default"], model.signatures["serve_text"]
      # One batch size here (each costs a compile); the warm-up replay below runs two others.
      out = ids_sig(**{k: tf.constant(v, tf.int32) for k, v in job["batch"].items()},
                    seed=tf.constant(0, tf.int32))
      ids_tokens = out["tokens"].numpy().tolist()
      out = text_sig(text=tf.constant(job["texts"]), seed=tf.constant(0, tf.int32))
      text_tokens = out["tokens"].numpy().tolist()
      text_out = [[g.decode("utf-8", "replace") for g in row] for row in out["generation"].numpy()]
      warmup = []
      path = os.path.join(d, "assets.extra", "tf_serving_warmup_requests")
      for record in tf.data.TFRecordDataset(path):
        log = PredictionLog.FromString(record.numpy())
        req = log.predict_log.request
        args = {k: tf.make_ndarray(tensor_pb2.TensorProto.FromString(v))
                for k, v in req.inputs.items()}
        rows = len(next(v for k, v in sorted(args.items()) if k != "seed"))
        tokens = None
        if rows == len(job["texts"]):  # replayed at the batch compiled above (no new compile)
          out = model.signatures[req.model_spec.signature_name](
              **{k: tf.constant(v) for k, v in args.items()})
          tokens = out["tokens"].numpy().tolist()
        warmup.append([req.model_spec.signature_name, sorted(args), rows, tokens])
      results[name] = {"ids_tokens": ids_tokens, "text_tokens": text_tokens,
                       "text_out": text_out, "warmup": warmup,
                       "num_variables": sum(isinstance(v, tf.Variable) for v in model.params)}
    results["paxlike_imported"] = "paxlike" in sys.modules
    print(json.dumps(results))
''')


HF_LOADER = textwrap.dedent('''
    """generate() with no arguments on a T5 Hugging Face export, as a transformers user calls
    it; then the export's tokenizer (AutoTokenizer) on the prompts' text and the output."""
    import json, sys
    import torch
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    spec = json.load(open(sys.argv[1]))
    model = T5ForConditionalGeneration.from_pretrained(spec["dir"])
    ids = torch.tensor(spec["batch"]["encoder_input_tokens"])
    out = model.generate(input_ids=ids, attention_mask=(ids != 0).long())
    result = {"tokens": out[:, 1:].tolist()}  # after the decoder start
    try:
      tok = AutoTokenizer.from_pretrained(spec["dir"])
    except Exception as e:  # the test names it
      result["tokenizer_error"] = f"{type(e).__name__}: {e}"
    else:
      result.update(tokenizer_class=type(tok).__name__, tokenizer_len=len(tok),
                    encoded=tok(spec["texts"]).input_ids,
                    decoded=tok.batch_decode(out, skip_special_tokens=True))
    print(json.dumps(result))
''')


def _json_result(bg: Background) -> dict:
  done = bg.result()
  assert done.returncode == 0, describe(done)
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Trains, exports and loads everything once; the tests below read the outcome."""
  root = tmp_path_factory.mktemp("export")
  lm_job, t5_job = root / "lm", root / "t5"
  train_in_process(LM, TRAIN_SET, lm_job)
  from paxlike.export.savedmodel import tensorflow_reads_this_jax

  # TensorFlow 2.21 cannot read the StableHLO JAX 0.12 writes (Python 3.12 installs
  # both): the SavedModel export is then refused (tested below) instead of checked.
  tf_problem = tensorflow_reads_this_jax()

  # The error cases run on their own copies, beside the real exports.
  empty = root / "empty"
  empty.mkdir()
  taken = root / "taken"
  shutil.copytree(lm_job, taken)
  old_export = taken / "export" / f"{STEPS:08d}" / "stablehlo"
  old_export.mkdir(parents=True)
  (old_export / "manifest.json").write_text("{}\n")
  errors_before = {"empty": listing(empty), "taken": listing(taken)}
  export = ["--mode=export", "--enable_summary_writer=false"]
  procs = {
      "lm_stablehlo": cli(f"--exp={LM}", f"--job_log_dir={lm_job}", *export,
                          "--export_format=stablehlo"),
      "lm_savedmodel": cli(f"--exp={LM}", f"--job_log_dir={lm_job}", *export,
                           "--export_format=savedmodel"),
      "no_checkpoint": cli(f"--exp={LM}", f"--job_log_dir={empty}", *export,
                           "--export_format=stablehlo"),
      "unknown_step": cli(f"--exp={LM}", f"--job_log_dir={taken}", *export,
                          "--export_format=stablehlo", "--restore_checkpoint_step=999"),
      "exists": cli(f"--exp={LM}", f"--job_log_dir={taken}", *export,
                    "--export_format=stablehlo"),
  }
  train_in_process(T5, TRAIN_SET + T5_SET, t5_job)
  procs["t5_stablehlo"] = cli(f"--exp={T5}", f"--job_log_dir={t5_job}", *export,
                              *(f"--set={s}" for s in T5_SET), "--export_format=stablehlo",
                              f"--decode_num_beams={T5_BEAMS}")
  # Beam search picks with lax.top_k, which JAX lowers to a composite TensorFlow 2.21 reads
  # only as a call (savedmodel.without_composites).
  procs["t5_savedmodel"] = cli(f"--exp={T5}", f"--job_log_dir={t5_job}", *export,
                               *(f"--set={s}" for s in T5_SET), "--export_format=savedmodel",
                               f"--decode_num_beams={T5_BEAMS}")
  procs["t5_hf"] = cli(f"--exp={T5}", f"--job_log_dir={t5_job}", *export,
                       *(f"--set={s}" for s in T5_SET), "--export_format=hf")
  expected = {"lm": paxlike_decode(LM, [], lm_job, {}),
              "t5": paxlike_decode(T5, T5_SET, t5_job, {"num_beams": T5_BEAMS}),
              "t5_greedy": paxlike_decode(T5, T5_SET, t5_job, {}, BATCH_ROWS[:1])}
  dirs = {
      "lm": lm_job / "export" / f"{STEPS:08d}" / "stablehlo",
      "t5": t5_job / "export" / f"{STEPS:08d}" / "stablehlo",
      "lm_savedmodel": lm_job / "export" / f"{STEPS:08d}" / "savedmodel",
      "t5_savedmodel": t5_job / "export" / f"{STEPS:08d}" / "savedmodel",
      "t5_hf": t5_job / "export" / f"{STEPS:08d}" / "hf",
  }

  savedmodels = () if tf_problem else ("lm_savedmodel", "t5_savedmodel")
  for name in ("lm_stablehlo", "t5_stablehlo", "t5_hf", *savedmodels):
    assert procs[name].result().returncode == 0, describe(procs[name].result())
  spec_hf = root / "hf_spec.json"
  spec_hf.write_text(json.dumps({"dir": str(dirs["t5_hf"]),
                                 "batch": expected["t5_greedy"]["batches"][0],
                                 "texts": expected["t5_greedy"]["texts"][0]}))
  (root / "hf_loader.py").write_text(HF_LOADER)
  hf_loader = None
  if all(importlib.util.find_spec(m) for m in ("transformers", "torch")):
    hf_loader = Background([str(root / "hf_loader.py"), str(spec_hf)], root)
  tf_loader = None
  if not tf_problem:
    spec_tf = root / "tf_spec.json"
    spec_tf.write_text(json.dumps({
        name: {"dir": str(dirs[f"{name}_savedmodel"]), "batch": expected[name]["batches"][0],
               "texts": expected[name]["texts"][0]} for name in ("lm", "t5")}))
    (root / "tf_loader.py").write_text(TF_LOADER)
    tf_loader = Background([str(root / "tf_loader.py"), str(spec_tf)], root, root / "cache")
  spec_jax = root / "jax_spec.json"
  spec_jax.write_text(json.dumps({
      name: {"dir": str(dirs[name]), "batches": expected[name]["batches"],
             "texts": expected[name]["texts"]} for name in ("lm", "t5")}))
  (root / "jax_loader.py").write_text(JAX_LOADER)
  jax_loader = Background([str(root / "jax_loader.py"), str(spec_jax)], root, root / "cache")
  errors = {k: procs[k].result() for k in ("no_checkpoint", "unknown_step", "exists")}
  return {"expected": expected, "dirs": dirs, "procs": procs, "errors": errors,
          "errors_before": errors_before, "errors_after": {"empty": listing(empty),
                                                           "taken": listing(taken)},
          "jax": _json_result(jax_loader), "tf_problem": tf_problem,
          "hf": _json_result(hf_loader) if hf_loader else None,
          "tf": _json_result(tf_loader) if tf_loader else None}


def test_stablehlo_decodes_like_paxlike_without_paxlike(run):
  got = run["jax"]
  assert got["paxlike_imported"] is False
  for name in ("lm", "t5"):
    want = run["expected"][name]["tokens"]
    assert [len(t) for t in want] == [2, 5]  # two batch sizes, one artifact
    assert got[name]["api"] == want, f"{name}: run.load(...) differs from paxlike's decode"
    assert got[name]["raw"] == want, f"{name}: the manifest-driven call differs"
  assert np.asarray(got["t5"]["api"][0]).shape[1] == T5_BEAMS


def _prompt_only(batch: dict) -> dict:
  """The LM's input rows hold prompt + target; decode reads the first prompt_lens ids."""
  if "prompt_lens" not in batch:
    return batch
  ids = np.asarray(batch["ids"])
  keep = np.arange(ids.shape[1])[None] < np.asarray(batch["prompt_lens"])[:, None]
  return {**batch, "ids": np.where(keep, ids, 0).tolist()}


def test_text_prompts_become_the_inputs_paxlike_reads(run):
  got = run["jax"]
  for name in ("lm", "t5"):
    expected = run["expected"][name]
    assert got[name]["encoded"] == [_prompt_only(b) for b in expected["batches"]], name
    assert got[name]["generated"] == [[beams[0] for beams in t] for t in expected["tokens"]]
    assert got[name]["cli_code"] == 0
    rows = got[name]["cli_rows"]
    assert [r["prompt"] for r in rows] == expected["texts"][0]
    assert [r["tokens"] for r in rows] == [beams[0] for beams in expected["tokens"][0]]
    assert all(isinstance(r["generation"], str) for r in rows)
    assert "1 of 1 prompts were longer than the export's" in got[name]["long_prompt"]
    code, err = got[name]["bad_ids"]
    assert code == 2 and err.startswith("error: --ids must be a JSON object") and \
        "Traceback" not in err, err


def test_manifest_describes_the_artifact(run):
  for name, family, features in (("lm", "LanguageModel", ["ids", "prompt_lens"]),
                                 ("t5", "T5Model", ["encoder_input_tokens"])):
    d = run["dirs"][name]
    m = json.loads((d / "manifest.json").read_text())
    assert m["format_version"] == 1 and m["step"] == STEPS
    assert m["model"]["family"] == family
    assert m["vocabulary"] == {"kind": "byte", "offset": 3, "pad_id": 0, "eos_id": 1,
                               "size": 259}
    assert m["text"] == {"append_eos": name == "t5"}  # T5's inputs end with EOS
    assert m["function"]["platforms"] == ["cpu", "cuda", "tpu"]
    assert m["function"]["arguments"] == ["params", *features, "seed"]
    assert isinstance(m["function"]["calling_convention_version"], int)
    assert m["params"]["count"] == run["expected"][name]["num_params"]
    assert [i["name"] for i in m["inputs"]] == [*features, "seed"]
    assert all(i["shape"][0] == "b" for i in m["inputs"][:-1])
    assert m["inputs"][-1]["shape"] == []
    beams = T5_BEAMS if name == "t5" else 1
    assert m["decode_settings"]["num_beams"] == beams
    assert m["outputs"][0]["shape"][:2] == ["b", beams]
    # The Exported's own signature is the manifest's, parameters first.
    want = [[*map(str, t["shape"]), t["dtype"]] for t in m["params"]["tensors"]]
    want += [[*map(str, i["shape"]), i["dtype"]] for i in m["inputs"]]
    assert run["jax"][name]["in_avals"] == want
    for got_shape, got_dtype, want_shape, want_dtype in run["jax"][name]["out_shapes"]:
      assert (got_shape, got_dtype) == (want_shape, want_dtype)
    # Weights live beside the program, not inside it.
    program, weights = (d / "model.stablehlo").stat().st_size, (
        d / "params.safetensors").stat().st_size
    assert program < weights / 4, (program, weights)


def test_savedmodel_signatures_and_warmup(run):
  if run["tf_problem"]:
    for name in ("lm_savedmodel", "t5_savedmodel"):
      refused = run["procs"][name].result()
      assert refused.returncode == 2, describe(refused)
      assert "cannot run what jax" in refused.stderr and "Traceback" not in refused.stderr
      assert not run["dirs"][name].exists()
    pytest.skip(f"this TensorFlow cannot read this JAX's StableHLO: {run['tf_problem']}")
  assert run["tf"]["paxlike_imported"] is False
  got, want = run["tf"]["lm"], run["expected"]["lm"]
  assert got["ids_tokens"] == want["tokens"][0]
  assert got["text_tokens"] == want["tokens"][0]
  # In-graph detokenization reads like run.py's.
  assert [row[0] for row in got["text_out"]] == [
      r["generation"] for r in run["jax"]["lm"]["cli_rows"]]
  assert got["num_variables"] == want["num_params"]  # tf.Variables, not constants
  d = run["dirs"]["lm_savedmodel"]
  variables = sum(f.stat().st_size for f in (d / "variables").iterdir())
  assert (d / "saved_model.pb").stat().st_size < variables / 4
  signatures = {(w[0], tuple(w[1])) for w in got["warmup"]}
  assert signatures == {("serving_default", ("ids", "prompt_lens", "seed")),
                        ("serve_text", ("seed", "text"))}
  assert sorted(w[2] for w in got["warmup"]) == [1, 1, 2, 2]
  replayed = [w[3] for w in got["warmup"] if w[3] is not None]
  assert replayed == [want["tokens"][0]] * 2  # the batch-2 requests of both signatures


def test_savedmodel_beam_search_runs_in_tensorflow(run):
  """Beam search's lax.top_k: the SavedModel decodes in TensorFlow as paxlike does."""
  if run["tf_problem"]:
    pytest.skip(f"this TensorFlow cannot read this JAX's StableHLO: {run['tf_problem']}")
  done = run["procs"]["t5_savedmodel"].result()
  assert f"exported step {STEPS} as savedmodel" in done.stdout, describe(done)
  got, want = run["tf"]["t5"], run["expected"]["t5"]
  assert np.asarray(got["ids_tokens"]).shape[1] == T5_BEAMS
  assert got["ids_tokens"] == want["tokens"][0]
  assert got["text_tokens"] == want["tokens"][0]  # T5's prompts end with EOS in the graph too
  assert [[row[0]] for row in got["text_out"]] == [
      [r["generation"]] for r in run["jax"]["t5"]["cli_rows"]]
  signatures = {(w[0], tuple(w[1])) for w in got["warmup"]}
  assert signatures == {("serving_default", ("encoder_input_tokens", "seed")),
                        ("serve_text", ("seed", "text"))}
  replayed = [w[3] for w in got["warmup"] if w[3] is not None]
  assert replayed == [want["tokens"][0]] * 2  # TF Serving's warm-up replay succeeds


def test_export_errors_leave_the_job_untouched(run):
  errors = run["errors"]
  for name, needle in (("no_checkpoint", "no checkpoint to export"),
                       ("unknown_step", "step 999"),
                       ("exists", "--export_overwrite")):
    done = errors[name]
    assert done.returncode == 2, describe(done)
    assert needle in done.stderr, describe(done)
    assert "Traceback" not in done.stderr
  assert run["errors_after"] == run["errors_before"]


def test_missing_tensorflow_names_the_extra(monkeypatch):
  import importlib.util

  from paxlike.errors import UserError
  from paxlike.export import savedmodel

  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorflow" else real(name, *a))
  with pytest.raises(UserError, match=r"pip install -e '\.\[export\]'"):
    savedmodel.SavedModelExporter().check(None)


def test_unexportable_decode_is_a_user_error():
  """A decode that needs a concrete batch size cannot take a symbolic one: UserError, why."""
  import jax
  import jax.numpy as jnp

  from paxlike import decoding
  from paxlike.errors import UserError
  from paxlike.export import job as job_lib
  from paxlike.export import serving

  class ConcreteBatchModel:
    def decode_features(self):
      return ("ids",)

    def decode(self, params, batch, key, settings):
      rows = int(batch["ids"].shape[0])  # fails for the symbolic batch
      return decoding.DecodeOutput(jnp.zeros((rows, 1, 2), jnp.int32),
                                   jnp.zeros((rows, 1)), jnp.zeros((rows, 1), jnp.int32))

  job = job_lib.ExportJob(
      experiment="x", model=ConcreteBatchModel(), settings=decoding.DecodeSettings(),
      abstract_params={"w": jax.ShapeDtypeStruct((2,), jnp.float32)},
      features=(job_lib.Feature("ids", (4,), "int32", None),), vocabulary={"kind": "none"},
      append_eos=None, examples={}, example_texts=(), platforms=("cpu",), job_log_dir="")
  with pytest.raises(UserError, match="cannot be exported .* symbolic batch size"):
    serving.lower(job)


def test_publish_replaces_only_with_overwrite_and_cleans_up(tmp_path):
  from paxlike import export
  from paxlike.errors import UserError

  target = tmp_path / "export" / "00000001" / "fmt"
  export.publish(str(target), lambda d: Path(d, "manifest.json").write_text("1"))
  assert (target / "manifest.json").read_text() == "1"
  with pytest.raises(UserError, match="--export_overwrite"):
    export.check_free(str(target))
  export.check_free(str(target), overwrite=True)
  export.publish(str(target), lambda d: Path(d, "manifest.json").write_text("2"),
                 overwrite=True)
  assert (target / "manifest.json").read_text() == "2"
  assert sorted(os.listdir(target.parent)) == ["fmt"]  # no partial or replaced leftovers

  def fail(d):
    Path(d, "half").write_text("x")
    raise RuntimeError("disk full")

  fresh = tmp_path / "other" / "00000002" / "fmt"
  with pytest.raises(RuntimeError):
    export.publish(str(fresh), fail)
  assert not (tmp_path / "other").exists()  # nothing left, not even the parents it made
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("keep")
  with pytest.raises(UserError, match="holds no export"):
    export.check_free(str(tmp_path / "mine"), overwrite=True)


def test_cli_formats_match_the_registry():
  from paxlike import command_line, export

  assert set(command_line.EXPORT_FORMATS) == set(export.EXPORTERS)


def test_warmup_varint():
  from paxlike.export import warmup

  assert warmup.varint(1) == b"\x01"
  assert warmup.varint(300) == b"\xac\x02"
  assert warmup.field(3, b"ab") == b"\x1a\x02ab"


def test_hf_generation_config_takes_the_sampling_flags():
  from paxlike.decoding import DecodeSettings
  from paxlike.export.hf import generation_settings

  assert generation_settings(DecodeSettings()) == {}  # greedy: transformers' default
  assert generation_settings(DecodeSettings(temperature=0.7, top_k=40, top_p=0.9)) == {
      "do_sample": True, "temperature": 0.7, "top_k": 40, "top_p": 0.9}


def test_hf_generate_with_no_arguments_decodes_like_paxlike(run):
  """generation_config.json carries T5's MAX_TARGET_LEN (12 here), not transformers'
  default max_length 20: generate() alone gives paxlike's greedy ids."""
  d = run["dirs"]["t5_hf"]
  generation = json.loads((d / "generation_config.json").read_text())
  assert generation["max_new_tokens"] == 12  # FlanT5ArithmeticTiny.MAX_TARGET_LEN
  if run["hf"] is None:
    pytest.skip("transformers and torch are not installed")
  (want,) = run["expected"]["t5_greedy"]["tokens"]
  want = [beams[0] for beams in want]
  got = run["hf"]["tokens"]
  assert len(want[0]) == 12
  assert any(1 not in row for row in want)  # a row decodes to the limit: the length shows
  got = [row + [0] * (len(want[0]) - len(row)) for row in got]  # transformers stops at EOS
  assert got == want



def _byte_text(ids) -> str:
  """paxlike's byte vocabulary's text of ids, less the U+FFFD it writes for bytes that are no
  UTF-8 (ByT5Tokenizer drops them; an untrained model may emit any byte)."""
  from paxlike.inputs.vocabulary import ByteVocabulary

  return ByteVocabulary().decode(ids).replace("\ufffd", "")


def test_hf_export_of_a_byte_job_carries_the_byt5_tokenizer(run):
  """The T5 job reads bytes (pad 0, EOS 1, unk 2, byte b -> b + 3: ByT5Tokenizer's ids): the
  export's tokenizer_config.json names ByT5Tokenizer, with the table's ids past the bytes
  (VOCAB_SIZE 264) as its extra_ids; AutoTokenizer encodes the prompts to the ids paxlike's
  decode input holds (EOS appended) and decodes generate()'s output to paxlike's text."""
  from paxlike.inputs.vocabulary import ByteVocabulary

  d = run["dirs"]["t5_hf"]
  assert (d / "tokenizer_config.json").is_file(), sorted(p.name for p in d.iterdir())
  config = json.loads((d / "tokenizer_config.json").read_text())
  assert (config["tokenizer_class"], config["extra_ids"]) == ("ByT5Tokenizer", 5)
  if run["hf"] is None:
    pytest.skip("transformers and torch are not installed")
  hf = run["hf"]
  assert "tokenizer_error" not in hf, hf["tokenizer_error"]
  assert hf["tokenizer_class"] == "ByT5Tokenizer"
  assert hf["tokenizer_len"] == json.loads((d / "config.json").read_text())["vocab_size"]
  vocab, expected = ByteVocabulary(), run["expected"]["t5_greedy"]
  texts = expected["texts"][0]
  assert texts and all(texts)
  assert hf["encoded"] == [vocab.encode(t) + [vocab.eos_id] for t in texts]
  rows = expected["batches"][0]["encoder_input_tokens"]
  assert hf["encoded"] == [row[:row.index(vocab.eos_id) + 1] for row in rows]
  (tokens,) = expected["tokens"]
  assert hf["decoded"] == [_byte_text(beams[0]) for beams in tokens]


def test_hf_export_of_a_byte_decoder_only_model_carries_the_byt5_tokenizer(tmp_path):
  """The same for the Llama family, written by the exporter from random weights (no
  training): a prompt encodes as paxlike's LM prompt does (no EOS: add_special_tokens=False,
  ByT5Tokenizer otherwise appends one), and generate()'s new ids, ids past the bytes
  included, decode to what paxlike's vocabulary makes of them."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  import torch
  from llama_test import _random_params
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from paxlike.export.hf import HfExporter
  from paxlike.inputs.vocabulary import ByteVocabulary
  from paxlike.models.llama import LlamaModel

  model = LlamaModel(vocab_size=264, model_dims=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=16, hidden_dims=64, max_seq_len=32, use_repeated_layer=False)
  vocab = ByteVocabulary()
  HfExporter().write((model, vocab, None, {"max_length": 32}), _random_params(model), 0,
                     str(tmp_path))
  tok = AutoTokenizer.from_pretrained(str(tmp_path))
  assert type(tok).__name__ == "ByT5Tokenizer" and len(tok) == 264
  prompts = ["12+34=", "héllo, wörld ."]
  ids = tok(prompts, add_special_tokens=False).input_ids
  assert ids == [vocab.encode(p) for p in prompts]
  assert tok(prompts[0]).input_ids == vocab.encode(prompts[0]) + [vocab.eos_id]
  hf_model = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  new = []
  for row in ids:
    with torch.no_grad():
      out = hf_model.generate(torch.tensor([row]), attention_mask=torch.ones(1, len(row),
                                                                             dtype=torch.long))
    new.append(out[0, len(row):].tolist())
  assert any(new), new
  assert tok.batch_decode(new, skip_special_tokens=True) == [_byte_text(r) for r in new]
  # Every id of the table decodes alone as paxlike's vocabulary decodes it.
  assert [tok.decode([i], skip_special_tokens=True) for i in range(264)] == [
      _byte_text([i]) for i in range(264)]

def _length_job(model, features, **settings):
  from paxlike.decoding import DecodeSettings
  from paxlike.export import job as job_lib

  return job_lib.ExportJob(
      experiment="x", model=model, settings=DecodeSettings(**settings), abstract_params={},
      features=tuple(job_lib.Feature(n, shape, "int32", None) for n, shape in features),
      vocabulary={"kind": "none"}, append_eos=None, examples={}, example_texts=(),
      platforms=("cpu",), job_log_dir="")


def test_hf_generation_config_decodes_as_far_as_paxlike():
  """T5 decodes MAX_TARGET_LEN new tokens; the Llama family fills its row (prompt and
  generation share MAX_SEQ_LEN); --decode_max_length wins over both."""
  import types

  from paxlike.decoding import DecodeSettings
  from paxlike.export.hf import decode_length, generation_settings

  t5 = types.SimpleNamespace(hf_config=lambda: {"is_encoder_decoder": True},
                             max_target_len=128)
  llama = types.SimpleNamespace(hf_config=lambda: {"model_type": "llama"})
  t5_features = [("encoder_input_tokens", (512,))]
  lm_features = [("ids", (64,)), ("prompt_lens", ())]
  assert decode_length(_length_job(t5, t5_features)) == {"max_new_tokens": 128}
  assert decode_length(_length_job(llama, lm_features)) == {"max_length": 64}
  for model, features in ((t5, t5_features), (llama, lm_features)):
    assert decode_length(_length_job(model, features, max_decode_length=5)) == {
        "max_new_tokens": 5}
  assert generation_settings(DecodeSettings(num_beams=4), {"max_length": 64}) == {
      "max_length": 64, "num_beams": 4}


def test_top_k_composites_become_calls():
  """JAX lowers lax.top_k to a stablehlo.composite, which TensorFlow 2.21 cannot read; the
  SavedModel's program calls its decomposition instead, with the same results."""
  import jax
  import jax.numpy as jnp

  from paxlike.export.savedmodel import without_composites

  (b,) = jax.export.symbolic_shape("b")
  exported = jax.export.export(jax.jit(lambda x: jax.lax.top_k(x, 2)), platforms=(
      "cpu", "cuda", "tpu"))(jax.ShapeDtypeStruct((b, 5), jnp.float32))
  assert "stablehlo.composite" in exported.mlir_module()
  plain = without_composites(exported)
  assert "stablehlo.composite" not in plain.mlir_module()
  x = np.random.RandomState(0).randn(3, 5).astype(np.float32)
  for got, want in zip(plain.call(x), exported.call(x), strict=True):
    np.testing.assert_array_equal(got, want)


def _top_k_job():
  """An ExportJob whose decode picks with lax.top_k (as top-k sampling and beam search do)."""
  import jax
  import jax.numpy as jnp

  from paxlike import decoding
  from paxlike.export import job as job_lib

  class TopKModel:
    def decode_features(self):
      return ("ids",)

    def decode(self, params, batch, key, settings):
      logits = batch["ids"][:, :, None] * params["w"]  # [b, 4, 6]
      scores, tokens = jax.lax.top_k(logits, 2)
      return decoding.DecodeOutput(tokens[:, None, :, 0], scores[:, None, :, 0].sum(-1),
                                   jnp.zeros((batch["ids"].shape[0], 1), jnp.int32))

  return job_lib.ExportJob(
      experiment="x", model=TopKModel(), settings=decoding.DecodeSettings(temperature=0.7,
                                                                          top_k=2),
      abstract_params={"w": jax.ShapeDtypeStruct((6,), jnp.float32)},
      features=(job_lib.Feature("ids", (4,), "int32", None),), vocabulary={"kind": "none"},
      append_eos=None, examples={"ids": np.asarray([[1, 2, 3, 4], [4, 3, 2, -1]], np.int32)},
      example_texts=(), platforms=("cpu",), job_log_dir="")


def test_savedmodel_of_a_top_k_decode_runs_or_is_refused(tmp_path):
  """The SavedModel of a top_k decode runs in TensorFlow; one TensorFlow could not run is
  refused in one UserError before anything is on disk (TF Serving's warm-up would fail)."""
  from paxlike.export import savedmodel

  problem = savedmodel.tensorflow_reads_this_jax()
  if problem:
    pytest.skip(f"this TensorFlow cannot read this JAX's StableHLO: {problem}")
  import tensorflow as tf

  from paxlike import export
  from paxlike.errors import UserError
  from paxlike.export import serving

  job = _top_k_job()
  exporter = savedmodel.SavedModelExporter()
  params = {"w": np.asarray([0.5, -1.0, 2.0, 0.0, 1.5, -2.0], np.float32)}
  out = tmp_path / "sm"
  plan = exporter.check(job)
  export.publish(str(out), lambda d: exporter.write(plan, params, 1, d))
  ids = job.examples["ids"]
  got = tf.saved_model.load(str(out)).signatures["serving_default"](
      ids=tf.constant(ids), seed=tf.constant(0))
  want = job.model.decode(params, {"ids": ids}, None, job.settings)
  np.testing.assert_array_equal(got["tokens"].numpy(), want.tokens)
  np.testing.assert_allclose(got["scores"].numpy(), want.scores)

  # The program as JAX serializes it, composites kept: TensorFlow 2.21 cannot read it.
  plan = (job, serving.lower(job))
  refused = tmp_path / "refused"
  with pytest.raises(UserError, match=r"cannot run the SavedModel .*use --export_format="
                     r"stablehlo") as e:
    export.publish(str(refused), lambda d: exporter.write(plan, params, 1, d))
  assert "\n" not in str(e.value) and "composite" in str(e.value)
  assert sorted(os.listdir(tmp_path)) == ["sm"]  # no partial export left
