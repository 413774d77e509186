"""--mode=infer: predictions on inputs without targets, from a trained job's checkpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import describe, run_cli

EXP = "FlanT5ArithmeticTiny"
# Enough steps that the model emits byte ids (an untrained one also emits the
# ids 259..263 the byte vocabulary cannot detokenise); the answers need not be right.
STEPS = 30
INPUTS = ["12+34=", "99+1=", "7+8=", "50+50=", "3+4="]


@pytest.fixture(scope="module")
def t5_job(tmp_path_factory) -> Path:
  job = tmp_path_factory.mktemp("infer") / "job"
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", "--set", f"NUM_TRAIN_STEPS={STEPS}",
                  "--set", "EVAL_INTERVAL_STEPS=0", "--peak_tflops_per_device=1",
                  "--enable_summary_writer=false"], job.parent)
  assert proc.returncode == 0, describe(proc)
  return job


def _write_inputs(path: Path, lines: list[str]) -> Path:
  path.write_text("".join(line + "\n" for line in lines))
  return path


def _rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def _listing(root: Path) -> dict[str, tuple[int, int]]:
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in root.rglob("*")}


def test_infer_input_gives_one_line_per_input_in_order_with_sorted_beams(t5_job, tmp_path):
  # No targets, and a blank line (skipped, as TextInput skips it): every input is predicted.
  lines = [json.dumps({"inputs": x}) for x in INPUTS]
  src = _write_inputs(tmp_path / "questions.jsonl", [*lines[:2], "", *lines[2:]])
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer",
                  f"--infer_input={src}", "--decode_num_beams=3"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  out = t5_job / "infer_out" / "questions" / f"infer_{STEPS:08d}_beams3_a0.6.jsonl"
  assert f"infer questions at step {STEPS}: {len(INPUTS)} predictions -> {out}" in proc.stdout
  rows = _rows(out)
  assert [r["input"] for r in rows] == INPUTS
  for r in rows:
    scores = [b["log_prob"] for b in r["beams"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True), r
    assert r["prediction"] == r["beams"][0]["prediction"] and r["log_prob"] == scores[0]
    assert "target" not in r
  assert not (t5_job / "summaries").exists()  # infer writes no summaries


def test_infer_without_an_input_file_predicts_the_decode_datasets(t5_job, tmp_path):
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer",
                  f"--restore_checkpoint_step={STEPS}"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  out = t5_job / "infer_out" / "test" / f"infer_{STEPS:08d}_greedy.jsonl"
  assert f"infer test at step {STEPS}: 500 predictions -> {out}" in proc.stdout
  rows = _rows(out)
  assert len(rows) == 500
  for r in rows:  # greedy: one prediction and its log-probability, no beams
    assert r["input"].endswith("=") and isinstance(r["prediction"], str)
    assert isinstance(r["log_prob"], float) and "beams" not in r and "score" not in r


def test_a_second_infer_with_the_same_settings_keeps_the_first(t5_job, tmp_path):
  src = _write_inputs(tmp_path / "again.jsonl", [json.dumps({"inputs": x}) for x in INPUTS])
  # A temperature this high draws nearly uniformly: two seeds' samples differ.
  args = [f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer", f"--infer_input={src}",
          "--decode_temperature=50"]
  first, second = run_cli(args, tmp_path), run_cli(args, tmp_path)
  assert first.returncode == 0 and second.returncode == 0, describe(second)
  out = t5_job / "infer_out" / "again"
  names = sorted(p.name for p in out.iterdir())
  assert names == [f"infer_{STEPS:08d}_t50_k0_p1-2.jsonl", f"infer_{STEPS:08d}_t50_k0_p1.jsonl"]
  assert str(out / names[0]) in second.stdout and str(out / names[1]) in first.stdout
  assert all(len(_rows(out / n)) == len(INPUTS) for n in names)
  # The same seed draws the same samples; --decode_seed, others, in a file of its own.
  assert _rows(out / names[0]) == _rows(out / names[1])
  proc = run_cli([*args, "--decode_seed=7"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  seeded = _rows(out / f"infer_{STEPS:08d}_t50_k0_p1_s7.jsonl")
  assert [r["input"] for r in seeded] == INPUTS
  assert [r["prediction"] for r in seeded] != [r["prediction"] for r in _rows(out / names[0])]


def test_a_malformed_input_file_fails_naming_file_and_line_and_writes_nothing(t5_job, tmp_path):
  src = _write_inputs(tmp_path / "bad.jsonl", ['{"inputs": "1+2="}', '{"inputs": "3+4="'])
  before = _listing(t5_job)
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer",
                  f"--infer_input={src}"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert f"{src} line 2" in proc.stderr and "Traceback" not in proc.stderr
  assert _listing(t5_job) == before


def test_infer_input_with_another_mode_is_a_user_error(t5_job, tmp_path):
  src = _write_inputs(tmp_path / "questions.jsonl", [json.dumps({"inputs": "1+2="})])
  before = _listing(t5_job)
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=decode",
                  f"--infer_input={src}"], tmp_path)
  assert proc.returncode == 2, describe(proc)
  assert "--mode=infer" in proc.stderr and "Traceback" not in proc.stderr
  assert _listing(t5_job) == before


def test_infer_writes_each_input_as_given_and_flags_a_cut_one(t5_job, tmp_path):
  # MAX_INPUT_LEN is 24: the long input is cut to its row, and is still written whole.
  inputs = ["3+4=", "1" * 30 + "+2="]
  src = _write_inputs(tmp_path / "long.jsonl", [json.dumps({"inputs": x}) for x in inputs])
  proc = run_cli([f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer",
                  f"--infer_input={src}", "--decode_max_length=2"], tmp_path)
  assert proc.returncode == 0, describe(proc)
  rows = _rows(t5_job / "infer_out" / "long" / f"infer_{STEPS:08d}_greedy_len2.jsonl")
  assert [r["input"] for r in rows] == inputs
  assert [r.get("input_truncated", False) for r in rows] == [False, True]


def test_a_decode_with_other_settings_has_outputs_and_curves_of_its_own(t5_job, tmp_path):
  from conftest import read_scalars

  job = tmp_path / "redecode"
  for extra in ([], ["--decode_num_beams=2"]):  # greedy, as training decodes, then 2 beams
    proc = run_cli([f"--exp={EXP}", f"--job_log_dir={job}", "--mode=decode_once",
                    f"--restore_checkpoint_dir={t5_job}", *extra], tmp_path)
    assert proc.returncode == 0, describe(proc)
  out = job / "decoder_out" / "test"
  tag = "_beams2_a0.6"
  assert sorted(p.name for p in out.iterdir()) == [
      f"decode_{STEPS:08d}.jsonl", f"decode_{STEPS:08d}{tag}.jsonl",
      f"metrics_{STEPS:08d}.json", f"metrics_{STEPS:08d}{tag}.json"]
  greedy = json.loads((out / f"metrics_{STEPS:08d}.json").read_text())["decode_settings"]
  beams = json.loads((out / f"metrics_{STEPS:08d}{tag}.json").read_text())["decode_settings"]
  assert (greedy["mode"], greedy["num_beams"]) == ("greedy", 1)
  assert (beams["mode"], beams["num_beams"], beams["alpha"]) == ("beam_search", 2, 0.6)
  assert all(len(r["beams"]) == 2 for r in _rows(out / f"decode_{STEPS:08d}{tag}.jsonl"))
  # One value a step in each curve: the 2-beam decode has a summary folder of its own.
  for folder in ("decode_test_test", f"decode_test_test{tag}"):
    curves = read_scalars(job / "summaries" / folder)
    assert curves and all([s for s, _ in v] == [STEPS] for v in curves.values()), curves


# The checks below run in this process, without a subprocess.

def _infer_here(tmp_path: Path, inp, runs: int = 1) -> list[list[dict]]:
  """Each of `runs` infers over inp of an untrained tiny LM (T5 for an enc_dec input): its
  predictions are noise; the inputs written beside them are what these tests read."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from paxlike import decoding, mesh
  from paxlike.evaluator import Evaluator
  from paxlike.models import LanguageModel, T5Model
  from paxlike.partitioning import SpmdPartitioner
  from paxlike.train_state import TrainState

  tiny = {"model_dims": 8, "num_heads": 1, "dim_per_head": 8, "hidden_dims": 8}
  model = (T5Model(inp.vocab.vocab_size, num_encoder_layers=1, num_decoder_layers=1, **tiny)
           if inp.feature_converter == "enc_dec"
           else LanguageModel(vocab_size=inp.vocab.vocab_size, num_layers=1, **tiny))
  params = nn.unbox(model.init(jax.random.key(0), model.init_batch(inp.peek_specs()),
                               method="fprop")["params"])
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=())
  part = SpmdPartitioner(mesh.build([1, 1, 1], devices=jax.devices()[:1]))
  ev = Evaluator(model, part, [], [inp], str(tmp_path), enable_summary_writer=False,
                 settings=decoding.DecodeSettings(max_decode_length=1))
  return [_rows(Path(ev.infer(state, 5)[inp.name][1])) for _ in range(runs)]


def _questions(tmp_path: Path, inputs: list, **kw):
  from paxlike.inputs.text import TextInput

  src = _write_inputs(tmp_path / "q.jsonl", [json.dumps({"inputs": x}) for x in inputs])
  return TextInput(name="q", file_pattern=str(src), vocabulary="byte", seq_len=12,
                   is_training=False, shuffle=False, **kw)


def test_infer_writes_each_rows_own_input_on_a_host_that_reads_every_other_batch(tmp_path):
  # One row a host: host 1 of 2 holds examples 1 and 3, so its predictions are of "bb=" and
  # "dddd=", which it writes beside them (matching rows to examples by order wrote "a=", "bb=").
  inp = _questions(tmp_path, ["a=", "bb=", "ccc=", "dddd=", "e="], batch_size=1,
                   num_infeed_hosts=2, infeed_host_index=1, repeat=False, reset_for_eval=True)
  (rows,) = _infer_here(tmp_path, inp)
  assert [r["input"] for r in rows] == ["bb=", "dddd="]


def test_infer_of_a_repeating_input_writes_its_inputs_as_given(tmp_path):
  # Each infer takes the next batch of the stream; an input is written as its file holds it
  # (the number 22, not the text its tokens spell), and a prompt cut to the row says so.
  inp = _questions(tmp_path, ["1+1=", 22, "9" * 20], batch_size=2, repeat=True,
                   reset_for_eval=False, eval_loop_num_batches=1,
                   feature_converter="enc_dec", target_len=4)
  first, second = _infer_here(tmp_path, inp, runs=2)
  assert [(r["input"], r.get("input_truncated", False)) for r in first + second] == [
      ("1+1=", False), (22, False), ("9" * 20, True), ("1+1=", False)]


def _decode_cfgs():
  from paxlike import experiment, registry

  return experiment.instantiate(registry.get(EXP), []).decode_datasets()


def test_infer_input_is_read_with_the_first_decode_datasets_settings(tmp_path):
  from paxlike import evaluator

  src = _write_inputs(tmp_path / "questions.jsonl", [json.dumps({"inputs": "1+2="})])
  decode_cfgs = _decode_cfgs()
  (cfg,) = evaluator.infer_datasets(EXP, decode_cfgs, str(src))
  assert (cfg.name, cfg.generator, cfg.repeat, cfg.reset_for_eval) == ("questions", "", False,
                                                                       True)
  assert (cfg.seq_len, cfg.target_len, cfg.batch_size) == (
      decode_cfgs[0].seq_len, decode_cfgs[0].target_len, decode_cfgs[0].batch_size)
  assert decode_cfgs[0].name == "test"  # the experiment's config is copied, not changed
  assert evaluator.infer_datasets(EXP, decode_cfgs, None) == decode_cfgs


@pytest.mark.parametrize("lines, says", [
    (None, "does not exist"),
    ([], "holds no inputs"),
    (['{"inputs": "1+2="}', "", '{"question": "3+4="}'], "line 3 has no 'inputs' field"),
    (['{"inputs": "1+2="}', '["3+4="]'], "line 2 is an array, not a JSON object"),
    (["1+2="], "line 1 is not valid JSON"),
])
def test_bad_infer_input_files_are_user_errors_naming_the_file(tmp_path, lines, says):
  from paxlike import evaluator
  from paxlike.errors import UserError

  src = tmp_path / "in.jsonl"
  if lines is not None:
    _write_inputs(src, lines)
  with pytest.raises(UserError, match=f"{re.escape(str(src))}.*{says}"):
    evaluator.infer_datasets(EXP, _decode_cfgs(), str(src))


def test_infer_input_without_decode_datasets_is_a_user_error(tmp_path):
  from paxlike import evaluator
  from paxlike.errors import UserError

  src = _write_inputs(tmp_path / "q.jsonl", [json.dumps({"inputs": "1+2="})])
  with pytest.raises(UserError, match="no decode datasets"):
    evaluator.infer_datasets(EXP, [], str(src))
  with pytest.raises(UserError, match=r"is none of \.jsonl, \.json, \.csv, \.tsv"):
    evaluator.infer_datasets(EXP, _decode_cfgs(), str(tmp_path / "q.txt"))


def test_each_hosts_rows_name_the_examples_they_hold_and_packed_rows_none(tmp_path):
  # What infer finds each row's input by: on every host, the index of the example the row
  # holds in the data (-1 for the padding rows that end the input), gathered with the rows.
  inputs = ["a=", "bb=", "ccc=", "dddd=", "e="]
  held = {}
  for host in (0, 1):
    inp = _questions(tmp_path, inputs, batch_size=2, num_infeed_hosts=2,
                     infeed_host_index=host, repeat=False, reset_for_eval=True)
    while True:
      try:
        batch = inp.get_next()
      except StopIteration:
        break
      for r, k in enumerate(inp.last_examples):
        if k >= 0:
          prompt = batch["ids"][r, :batch["prompt_lens"][r]]
          held[int(k)] = (host, inp.vocab.decode(prompt), inp.original_input(int(k)))
        else:
          assert not batch["weights"][r].any()
  assert held == {0: (0, "a=", ("a=", False)), 1: (0, "bb=", ("bb=", False)),
                  2: (1, "ccc=", ("ccc=", False)), 3: (1, "dddd=", ("dddd=", False)),
                  4: (0, "e=", ("e=", False))}
  # A packed LM row holds several lines: no one example, so infer writes its prompt.
  from paxlike.inputs.text import TextInput

  src = tmp_path / "lines.txt"
  src.write_text("ab\ncd\n")
  packed = TextInput(name="p", file_pattern=str(src), vocabulary="byte", seq_len=12,
                     pack=True, is_training=False, repeat=False, reset_for_eval=True,
                     num_infeed_hosts=1, infeed_host_index=0)
  packed.get_next()
  assert packed.last_examples.tolist() == [-1] and packed.original_input(0) is None
