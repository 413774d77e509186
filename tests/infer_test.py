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
  args = [f"--exp={EXP}", f"--job_log_dir={t5_job}", "--mode=infer", f"--infer_input={src}",
          "--decode_temperature=1.0"]
  first, second = run_cli(args, tmp_path), run_cli(args, tmp_path)
  assert first.returncode == 0 and second.returncode == 0, describe(second)
  out = t5_job / "infer_out" / "again"
  names = sorted(p.name for p in out.iterdir())
  assert names == [f"infer_{STEPS:08d}_t1_k0_p1-2.jsonl", f"infer_{STEPS:08d}_t1_k0_p1.jsonl"]
  assert str(out / names[0]) in second.stdout and str(out / names[1]) in first.stdout
  assert all(len(_rows(out / n)) == len(INPUTS) for n in names)


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


# The checks below run in this process: no JAX program, no subprocess.

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
