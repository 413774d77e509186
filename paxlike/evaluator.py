"""Eval and decode runs over the experiment's non-training inputs.

Eval (Pax semantics): with reset_for_eval=True each run is one full epoch of
a finite input; hosts with fewer batches pad with weight-0 copies so every
host stops on the same step, and metrics are sums, so num_examples is exact.
With reset_for_eval=False each run takes the next eval_loop_num_batches
batches of a repeating input.

Decode: greedy, sampled or beam-search generation through the model
contract (prefill, then one-position extends over the KV cache); process 0
writes decoder_out/<name>/decode_<step>.jsonl (prompt, generation, target,
score, and the beams with their scores under beam search), metrics_<step>.json (with
the settings it decoded with, decode_settings) and the metric summary
(summaries/decode_test_<name>). Other settings than plain greedy decoding name their
outputs as infer does: decode_<step>_<settings>.jsonl, metrics_<step>_<settings>.json
and summaries/decode_test_<name>_<settings> (settings: beams4_a0.6, greedy_len6, ...),
so that a curve holds one value a step. A decode never replaces an earlier one: a
re-decode at the same step with the same settings writes decode_<step>-2.jsonl (and
metrics_<step>-2.json), -3, ..., as infer does.

Infer (T5X's infer.py, Pax's decode-only run): the same generation over
inputs that need no targets, either the decode datasets or a .jsonl file of
inputs read with the first decode dataset's settings (or, for an experiment
that decodes nothing, its own text settings: FilesDataset.infer_input);
process 0 writes infer_out/<name>/infer_<step>_<settings>.jsonl (settings:
greedy, beams4, t0.7_k40_p0.9, ...), one line per input example in input
order with its input as the user wrote it (`input_truncated`: true where the
prompt was cut to the row; TextInput keeps each example's and says which example
each row holds, on every host; another input's, or a packed row's, is the prompt
as the model saw it), its prediction and `log_prob`, and nothing else (no
metrics, no summaries). An infer never replaces an earlier one: a file name that is
taken gets the next free `-2`, `-3`, ... suffix.
"""

from __future__ import annotations

import copy
import glob
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from paxlike import decoding, files, log, summaries
from paxlike.errors import UserError, counted
from paxlike.inputs.base_input import BaseInput
from paxlike.inputs.text import TextInput, read_rows
from paxlike.models.base import split_weighted, weighted_means, weighted_sums

# Counts a model's fprop may add, reported per example under praxis's metric names: rows
# predicted whole (eval_task 'lambada', report_strict_acc) and BoolQ's answers.
PER_EXAMPLE = {"strict_correct": "acc_strict", "yes_no_correct": "boolq_acc"}
# The metrics eval_step_sums sums under their own names; any other metric a model's fprop
# gives (a Pax user's model's) is summed as EXTRA + its name and reported as its mean.
_OWN = ("loss", "log_pplx", "accuracy")
EXTRA = "mean_of/"
# A metric with its own weight (paxlike.models.base.WEIGHT) is summed as WEIGHTED + its name.
WEIGHTED = "weighted/"


def _global_min_max(n: int) -> tuple[int, int]:
  """The fewest and the most of every host's n."""
  if jax.process_count() == 1:
    return n, n
  every = multihost_utils.process_allgather(np.asarray(n, np.int32))
  return int(np.min(every)), int(np.max(every))


def eval_batches(inp: BaseInput, model: Any) -> Iterator[dict[str, np.ndarray]]:
  """The host batches of one eval run, equally many on every host."""
  for batch, _ in marked_eval_batches(inp, model):
    yield batch


def marked_eval_batches(inp: BaseInput, model: Any
                        ) -> Iterator[tuple[dict[str, np.ndarray], bool]]:
  """eval_batches, each with whether it is a filler (model.padding_batch: what a host out of
  batches runs while the others finish theirs). In a step where some host runs a filler,
  the others' batches take its form (model.beside_filler), so that every host feeds the
  step the same features."""
  for batch, filler, _ in _eval_run(inp, model):
    yield batch, filler


def _eval_run(inp: BaseInput, model: Any
              ) -> Iterator[tuple[dict[str, np.ndarray], bool, np.ndarray | None]]:
  """marked_eval_batches, each batch with the example each of its rows holds where the
  input says (TextInput.last_examples: an index into its data, -1 for none, as in a
  filler), else None."""
  def examples() -> np.ndarray | None:  # of the batch get_next just returned
    return inp.last_examples if isinstance(inp, TextInput) else None

  if not inp.reset_for_eval:
    for _ in range(inp.eval_loop_num_batches):
      batch = inp.get_next()
      yield batch, False, examples()
    return
  inp.reset()
  local = []
  while True:
    try:
      local.append((inp.get_next(), examples()))
    except StopIteration:
      break
  fewest, total = _global_min_max(len(local))
  filler = model.padding_batch(local[-1][0] if local else inp.peek_specs())
  for i, (batch, ids) in enumerate(local):
    yield (batch if i < fewest else model.beside_filler(batch)), False, ids
  none = np.full(inp.batch_size, -1, np.int32) if isinstance(inp, TextInput) else None
  for _ in range(total - len(local)):
    yield filler, True, none


def eval_step_sums(model: Any, reduce_sum: Callable[[Any], Any]) -> Callable:
  """(state, batch, key) -> sums over the batch: loss, correct, tokens, examples, and the
  per-example counts (PER_EXAMPLE) the model's fprop adds."""

  def step(state, batch, key):
    del key
    _, m = model.apply({"params": state.params}, batch, method="fprop")
    # A metric with its own weight (a Pax model's WeightedScalars) adds up value x weight
    # and the weight, and is reported as Pax does, sum(value x weight) / sum(weight).
    m, weighted = weighted_sums(m)
    n = m["num_tokens"]
    # log_pplx is the cross-entropy alone; loss may add more (an MoE model's aux loss).
    sums = {"loss_sum": m["loss"] * n, "xent_sum": m.get("log_pplx", m["loss"]) * n,
            "num_tokens": n, "num_examples": m["num_examples"]}
    if "accuracy" in m:
      sums["correct_sum"] = m["accuracy"] * n
    sums.update({k: m[k] for k in PER_EXAMPLE if k in m})
    # A Pax user's model names its own metrics (paxlike.pax.base_model): each is a weighted
    # mean too, summed here like the loss.
    sums.update({f"{EXTRA}{k}": v * n for k, v in m.items() if k not in _OWN and k not in
                 PER_EXAMPLE and not k.startswith("num_")})
    sums.update({f"{WEIGHTED}{k}": v for k, v in weighted.items()})
    return reduce_sum(sums)

  return step


class Evaluator:
  """Runs eval and decode for a task; the trainer calls it at its intervals.

  Args:
    model: the task's model.
    partitioner: the run's partitioner (spmd or pmap).
    eval_inputs / decode_inputs: built BaseInputs (is_training=False).
    job_log_dir: where summaries and decoder_out go.
    enable_summary_writer: write TensorBoard files (process 0 only).
    settings: how to decode (greedy by default).
  """

  def __init__(self, model: Any, partitioner: Any, eval_inputs: list[BaseInput],
               decode_inputs: list[BaseInput], job_log_dir: str,
               enable_summary_writer: bool = True,
               settings: decoding.DecodeSettings | None = None) -> None:
    self.model = model
    self.partitioner = partitioner
    self.eval_inputs = eval_inputs
    self.decode_inputs = decode_inputs
    self.job_log_dir = job_log_dir
    self.is_chief = jax.process_index() == 0
    self.enable_summary_writer = enable_summary_writer and self.is_chief
    self.settings = settings or decoding.DecodeSettings()
    # Eval runs the model's own fprop (a pipelined LM's through its pipeline); decode and
    # infer run the model decoding.decoding_model names, on restacked parameters.
    self.decode_model = decoding.decoding_model(model)[0]
    self._eval_step = None
    self._decode_fn = None

  def _writer(self, name: str) -> summaries.SummaryWriter:
    return summaries.SummaryWriter(self.job_log_dir, name, enabled=self.enable_summary_writer)

  def evaluate(self, state: Any, step: int) -> dict[str, dict[str, float]]:
    """One eval run on every eval input; returns {name: metrics}."""
    results = {}
    for inp in self.eval_inputs:
      metrics = self._evaluate(state, step, f"eval_test_{inp.name}", inp.name, (
          self.partitioner.shard_batch(b) for b in eval_batches(inp, self.model)))
      if metrics is not None:
        results[inp.name] = metrics
    return results

  def eval_train(self, state: Any, step: int, batch: Any) -> dict[str, float] | None:
    """Pax's eval on the training input (task.train.eval_skip_train = False): the model's
    eval of the next training batch (already on the devices), as summaries/eval_train."""
    return self._evaluate(state, step, "eval_train", "train", [batch])

  def _evaluate(self, state: Any, step: int, summary: str, name: str,
                batches: Any) -> dict[str, float] | None:
    """The metrics of the sharded batches, written to summaries/<summary>; None if none."""
    if self._eval_step is None:
      self._eval_step = self.partitioner.compile(
          eval_step_sums(self.model, self.partitioner.reduce_sum), donate_state=False,
          returns_state=False)
    key = jax.random.key(0)
    total = None
    for batch in batches:
      sums = self._eval_step(state, batch, key)
      total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    if total is None:
      return None
    t = {k: float(v) for k, v in self.partitioner.unshard(total).items()}
    tokens = max(t["num_tokens"], 1e-8)
    metrics = {"loss": t["loss_sum"] / tokens, "log_pplx": t["xent_sum"] / tokens,
               "num_examples": t["num_examples"], "num_tokens": t["num_tokens"]}
    if "correct_sum" in t:
      metrics["accuracy"] = t["correct_sum"] / tokens
    metrics.update({metric: t[k] / max(t["num_examples"], 1.0)
                    for k, metric in PER_EXAMPLE.items() if k in t})
    metrics.update({k[len(EXTRA):]: v / tokens for k, v in t.items() if k.startswith(EXTRA)})
    _, sums = split_weighted({k[len(WEIGHTED):]: v for k, v in t.items()
                              if k.startswith(WEIGHTED)})
    metrics.update({k: float(v) for k, v in weighted_means(sums).items()})
    writer = self._writer(summary)
    writer.scalars(step, metrics)
    writer.close()
    log.info("eval %s at step %d: loss %.4f accuracy %.4f num_examples %d", name, step,
             metrics["loss"], metrics.get("accuracy", 0.0), int(metrics["num_examples"]))
    return metrics

  def _decoder(self) -> Callable:
    if self._decode_fn is None:
      model, settings = self.decode_model, self.settings
      self._decode_fn = jax.jit(
          lambda params, batch, key: model.decode(params, batch, key, settings))
    return self._decode_fn

  def _decode_params(self, state: Any) -> Any:
    """The state's parameters in the decoding model's layout."""
    return decoding.decoding_model(self.model, self.partitioner.decode_params(state))[1]

  def _decoded_batches(self, inp: BaseInput, params: Any
                       ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray | None,
                                           decoding.DecodeOutput]]:
    """One decode run over an input, read as eval reads it (marked_eval_batches): each
    batch's rows from every host, the example each row holds (TextInput.last_examples,
    or None for another input) and their decode.

    Every host decodes its shard of the global batch; the rows, examples and
    outputs come back whole on every host, in global order (process order).
    The examples stay on the host: the decode reads the model's features only.
    """
    features = self.decode_model.decode_features()
    # As eval reads it: a host out of batches decodes a filler (its rows weigh 0, so
    # prompt_and_target counts none) while the others finish theirs.
    for n, (hb, _, examples) in enumerate(_eval_run(inp, self.decode_model)):
      names = [k for k in features if k in hb]
      arrays = self.partitioner.decode_inputs(*(hb[k] for k in names))
      with self.partitioner.context():
        key = jax.random.fold_in(jax.random.key(self.settings.seed), n)
        out = self._decoder()(params, dict(zip(names, arrays, strict=True)), key)
      yield ({k: _gather_host(v) for k, v in hb.items()},
             None if examples is None else _gather_host(examples),
             jax.tree.map(_gather_device, out))

  def decode(self, state: Any, step: int) -> dict[str, dict[str, float]]:
    """Decodes every decode input once; writes decoder_out/<name>/."""
    if getattr(self.model, "pax_decodes", lambda: False)():
      return self._pax_decode(state, step)
    results = {}
    params = self._decode_params(state)
    for inp in self.decode_inputs:
      rows, short = [], 0
      for hb, _, out in self._decoded_batches(inp, params):
        prompts, targets, real = self.decode_model.prompt_and_target(hb)
        short += self._short_rows(hb, real)
        for r in np.flatnonzero(real):
          row = {"prompt": inp.ids_to_strings(prompts[r][None])[0],
                 "generation": inp.ids_to_strings(out.tokens[r, :1])[0],
                 "target": inp.ids_to_strings(targets[r][None])[0]}
          if out.tokens.shape[1] > 1:  # the example's score is its metric; a beam's, log p
            row["beams"] = [{"generation": g, "log_prob": float(s)} for g, s in zip(
                inp.ids_to_strings(out.tokens[r]), out.scores[r], strict=True)]
          rows.append(row)
      metrics = inp.score([r["target"] for r in rows], [r["generation"] for r in rows])
      for r in rows:
        r["score"] = float(r["target"].strip() == r["generation"].strip())
      metrics = {k: float(v) for k, v in metrics.items()}
      metrics["num_examples"] = float(len(rows))
      self._warn_short("decode", inp.name, short, len(rows))
      results[inp.name] = self._write_decode(inp.name, step, rows, metrics, self.settings)
    return results

  def _short_rows(self, hb: dict[str, np.ndarray], real: np.ndarray) -> int:
    """How many of a batch's real rows leave less room after their prompt than the
    max_decode_length tokens asked for (a decoder-only model's rows: prompt and
    generation share MAX_SEQ_LEN positions); rows with no room at all are not counted."""
    asked = self.settings.max_decode_length
    if asked is None or "prompt_lens" not in hb or "ids" not in hb:
      return 0
    room = hb["ids"].shape[1] - np.maximum(hb["prompt_lens"], 1)
    return int(np.sum(real & (room > 0) & (room < asked)))

  def _warn_short(self, what: str, name: str, short: int, total: int) -> None:
    if short:
      log.warning("%s %s: %d of %d inputs have room for fewer than the %d tokens "
                  "--decode_max_length asks in their row and predict fewer; raise the "
                  "sequence length (--set MAX_SEQ_LEN=...) to give them room", what, name,
                  short, total, self.settings.max_decode_length)

  def _write_decode(self, name: str, step: int, rows: list[Any], metrics: dict[str, float],
                    settings: decoding.DecodeSettings | None = None) -> dict[str, float]:
    """Writes one decode's rows and metrics under decoder_out/<name>/ and its summaries;
    returns the metrics.

    settings: what the rows were decoded with (None: the model's own decode, a Pax
    user's). Plain greedy decoding's outputs are decode_<step>.jsonl, metrics_<step>.json
    and summaries/decode_test_<name>; other settings add their settings_tag to each.
    """
    tag = settings_tag(settings) if settings is not None else "greedy"
    own = "" if tag == "greedy" else f"_{tag}"
    out_dir = os.path.join(self.job_log_dir, "decoder_out", name)
    stem = os.path.join(out_dir, f"decode_{step:08d}{own}")
    path = _free_path(stem)  # a re-decode at the same step keeps the earlier file
    suffix = path[len(stem):-len(".jsonl")]  # "", or "-2", "-3", ...
    if self.is_chief:
      _write_jsonl(path, rows)
      recorded = dict(metrics)
      if settings is not None:
        recorded["decode_settings"] = settings.record()
        if settings.samples:
          recorded["decode_settings"]["seed"] = settings.seed
      with open(os.path.join(out_dir, f"metrics_{step:08d}{own}{suffix}.json"), "w") as f:
        json.dump(recorded, f, indent=2)
    writer = self._writer(f"decode_test_{name}{own}")
    writer.scalars(step, metrics)
    writer.close()
    log.info("decode %s at step %d: %s -> %s", name, step,
             " ".join(f"{k} {v:.4f}" for k, v in metrics.items()), path)
    return metrics

  def _pax_decode(self, state: Any, step: int) -> dict[str, dict[str, float]]:
    """Pax's decode protocol, for a Pax user's model (paxlike.pax.base_model): each batch's
    decode(input_batch) on the devices, then process_decode_out(input, per_example_out) on
    the host. The weighted scalars of both, sum(value x weight) / sum(weight) over the
    batches, are the metrics (process_decode_out's win a name both give); the (key, value)
    pairs process_decode_out returns are written one value per line, as Pax writes them.
    Each input is read as eval reads it (eval_batches)."""
    model = self.model
    if self._decode_fn is None:
      self._decode_fn = jax.jit(lambda params, batch: model.apply(
          {"params": params}, batch, method="pax_decode_step"))
    params = self.partitioner.decode_params(state)
    results = {}
    for inp in self.decode_inputs:
      sums: dict[str, list[float]] = {}
      processed_sums: dict[str, list[float]] = {}
      lines = []
      # As eval reads it: one epoch (reset_for_eval), or eval_loop_num_batches batches.
      # A host out of batches decodes a filler along with the others; its rows are dropped.
      for hb, _ in marked_eval_batches(inp, model):
        names = sorted(hb)
        arrays = self.partitioner.decode_inputs(*(hb[k] for k in names))
        with self.partitioner.context():
          weighted, per_example, real = self._decode_fn(
              params, dict(zip(names, arrays, strict=True)))
        _add_weighted(sums, self._every_host(weighted))
        keep = _gather_device(real) > 0
        if not keep.any():
          continue
        per_example = jax.tree.map(
            lambda x, keep=keep: x[keep] if np.ndim(x) and len(x) == len(keep) else x,
            jax.tree.map(_gather_device, per_example))
        processed_weighted, values = model.pax_process_decode(inp, per_example)
        _add_weighted(processed_sums, processed_weighted)
        lines.extend(_jsonable(value) for value in values)
      metrics = {k: total / max(weight, 1e-8) for k, (total, weight) in sums.items()}
      metrics.update({k: total / max(weight, 1e-8)
                      for k, (total, weight) in processed_sums.items()})
      metrics["num_examples"] = float(len(lines))
      results[inp.name] = self._write_decode(inp.name, step, lines, metrics)
    return results

  def _every_host(self, weighted: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """WeightedScalars of the whole batch: under SPMD the step's own (its batch is every
    host's); under pmap, where each host decodes its own rows, every host's combined."""
    if self.partitioner.kind != "pmap" or jax.process_count() == 1:
      return weighted
    keys = sorted(weighted)  # the same order on every host: one gather of every pair
    every = multihost_utils.process_allgather(np.asarray(
        [[float(weighted[k][0]) * float(weighted[k][1]), float(weighted[k][1])] for k in keys],
        np.float64).reshape(len(keys), 2))
    return {k: (every[:, i, 0].sum() / max(every[:, i, 1].sum(), 1e-30), every[:, i, 1].sum())
            for i, k in enumerate(keys)}

  def infer(self, state: Any, step: int) -> dict[str, tuple[int, str]]:
    """Predicts for every example of every decode input; writes infer_out/<name>/.

    A row counts as an example when the model says it is one (loss weight on
    it): an input with no target still has its EOS weighted, so it is
    predicted; the weight-0 rows that pad a finite input's last batch are not.

    Returns:
      {input name: (predictions written, path of the jsonl file)}.
    """
    results = {}
    params = self._decode_params(state)
    for inp in self.decode_inputs:
      rows, short, seen = [], 0, set()
      for hb, examples, out in self._decoded_batches(inp, params):
        prompts, _, real = self.decode_model.prompt_and_target(hb)
        short += self._short_rows(hb, real)
        for r in np.flatnonzero(real):
          if examples is not None:
            seen.add(int(examples[r]))
          predictions = inp.ids_to_strings(out.tokens[r])
          # The row's example as its data holds it (TextInput keeps it), found by index.
          source = None if examples is None else inp.original_input(int(examples[r]))
          if source is None:  # another input, a packed row: the prompt as the model saw it
            row = {"input": inp.ids_to_strings(prompts[r][None])[0]}
          else:
            row = {"input": source[0]}
            if source[1]:
              row["input_truncated"] = True
          row.update(prediction=predictions[0], log_prob=float(out.scores[r, 0]))
          if len(predictions) > 1:  # beam search: every beam, best first
            row["beams"] = [{"prediction": p, "log_prob": float(s)}
                            for p, s in zip(predictions, out.scores[r], strict=True)]
          rows.append(row)
      self._warn_short("infer", inp.name, short, len(rows))
      expected = getattr(inp, "num_examples", None)
      # An empty input, with no BOS token to start from, leaves the model nothing to continue.
      original = getattr(inp, "original_input", None)
      empty = 0 if expected is None or original is None else sum(
          1 for k in range(expected) if k not in seen
          and (source := original(k)) is not None and source[0] == "")
      if expected and not rows:
        if empty == expected:
          raise UserError(f"infer {inp.name}: every one of its {expected} inputs is empty, and "
                          "this model's vocabulary has no BOS token to start a prediction "
                          "from; give each input some text.")
        raise UserError(f"infer {inp.name}: every one of its {expected} inputs fills its row "
                        "and leaves no room to predict; raise the sequence length (--set "
                        "MAX_SEQ_LEN=...) or shorten the inputs.")
      if empty:
        log.warning("infer %s: %d of %d inputs are empty, with no BOS token to start from, "
                    "and are left out", inp.name, empty, expected)
      if expected is not None and expected - empty != len(rows):
        # An LM prompt that fills its whole row leaves no position to predict, so no weight.
        log.warning("infer %s: %d of %d inputs have no room left to predict in their row and "
                    "are left out; raise the sequence length to predict them", inp.name,
                    expected - empty - len(rows), expected)
      path = _free_path(os.path.join(self.job_log_dir, "infer_out", inp.name,
                                     f"infer_{step:08d}_{settings_tag(self.settings)}"))
      if self.is_chief:
        _write_jsonl(path, rows)
      log.info("infer %s at step %d: %s -> %s", inp.name, step, counted(len(rows), "prediction"),
               path)
      results[inp.name] = (len(rows), path)
    return results


def settings_tag(settings: decoding.DecodeSettings) -> str:
  """How an infer decoded, for its file name: greedy, beams4_a0.6, t0.7_k40_p0.9,
  t0.7_k40_p0.9_s3 (--decode_seed=3), ..."""
  if settings.num_beams > 1:
    tag = f"beams{settings.num_beams}_a{settings.alpha:g}"
  elif settings.temperature > 0:
    tag = f"t{settings.temperature:g}_k{settings.top_k}_p{settings.top_p:g}"
    if settings.seed:
      tag += f"_s{settings.seed}"
  else:
    tag = "greedy"
  if settings.max_decode_length is not None:
    tag += f"_len{settings.max_decode_length}"
  return tag


def _free_path(stem: str) -> str:
  """stem.jsonl, or stem-2.jsonl, stem-3.jsonl, ...: the first that does not exist."""
  path, n = f"{stem}.jsonl", 1
  while os.path.exists(path):
    n += 1
    path = f"{stem}-{n}.jsonl"
  return path


def _add_weighted(sums: dict[str, list[float]], weighted: Any) -> None:
  """Adds praxis's WeightedScalars {name: (value, weight)} into sums {name: [sum of value x
  weight, sum of weight]}."""
  def host(x: Any) -> float:  # a replicated scalar: any one copy
    return float(np.asarray(x.addressable_data(0) if isinstance(x, jax.Array) else x))

  for key, (value, weight) in (weighted or {}).items():
    value, weight = host(value), host(weight)
    total = sums.setdefault(key, [0.0, 0.0])
    total[0] += value * weight
    total[1] += weight


def _jsonable(value: Any) -> Any:
  """A decode output value as JSON can hold it: arrays as lists, bytes as text."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return [_jsonable(v) for v in value]
  if isinstance(value, np.ndarray | np.generic | jax.Array):
    return _jsonable(np.asarray(value).tolist())
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  return value


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
  """Writes rows as JSON lines; a reader sees the old file or the whole new one."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  files.write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def infer_datasets(exp_name: str, decode_cfgs: list[fdl.Config[BaseInput]],
                   infer_input: str | None,
                   own_input: Callable[[], fdl.Config[BaseInput]] | None = None
                   ) -> list[fdl.Config[BaseInput]]:
  """The inputs --mode=infer decodes: the decode datasets, or a file read like the first.

  With infer_input, the first decode dataset's config is copied and pointed
  at the file (same vocabulary, lengths, feature converter, batch size and
  input_key), as one finite pass in file order. The file is checked here, so
  a bad one fails before the run writes anything.

  Args:
    exp_name: the experiment's name, for messages.
    decode_cfgs: the experiment's decode_datasets().
    infer_input: --infer_input, a .jsonl file of {input_key: ...} objects, or None.
    own_input: the experiment's text input settings when it has no decode
      datasets (FilesDataset.infer_input), or None.

  Raises:
    UserError: no decode datasets, a decode dataset that cannot read files,
      or a missing or malformed file.
  """
  if not decode_cfgs and infer_input and own_input is not None:
    decode_cfgs = [own_input()]
  if not decode_cfgs:
    raise UserError(
        f"{exp_name} has no decode datasets, so --mode=infer has " +
        ("no input settings (vocabulary, lengths) to read --infer_input with" if infer_input
         else "nothing to predict") + "; use an experiment whose decode_datasets() returns "
        "an input.")
  if not infer_input:
    return decode_cfgs
  cfg = copy.deepcopy(decode_cfgs[0])
  if not (isinstance(fdl.get_callable(cfg), type)
          and issubclass(fdl.get_callable(cfg), TextInput)):
    raise UserError(f"--infer_input needs a TextInput decode dataset, but {exp_name}'s first "
                    f"is {getattr(fdl.get_callable(cfg), '__name__', cfg)}; predict on its "
                    "decode datasets (drop --infer_input) instead.")
  path = os.path.abspath(os.path.expanduser(infer_input))
  check_infer_file(path, cfg.input_key)
  # TextInput reads comma-separated globs: escape the path so it names this one file.
  cfg.file_pattern = glob.escape(path)
  cfg.generator = ""
  cfg.name = os.path.splitext(os.path.basename(path))[0]
  cfg.repeat = False
  cfg.reset_for_eval = True
  cfg.is_training = False
  return [cfg]


INFER_FILES = (".jsonl", ".json", ".csv", ".tsv")  # what --infer_input reads (rows with fields)


def check_infer_file(path: str, input_key: str) -> int:
  """Checks an --infer_input file: rows as TRAIN_FILES reads them (text.read_rows: JSON
  Lines, a JSON array, a CSV / TSV table), each with input_key (or a chat's messages).

  Returns:
    How many inputs it holds (blank lines are skipped, as TextInput does).

  Raises:
    UserError: naming the file, and the line for a bad line.
  """
  if not path.lower().endswith(INFER_FILES):
    raise UserError(f"--infer_input {path} is none of {', '.join(INFER_FILES)}; write one JSON "
                    f"object per line, {{\"{input_key}\": ...}}, to a file ending in .jsonl.")
  if "," in path:  # TextInput splits file patterns at commas
    raise UserError(f"--infer_input {path} has a comma in its path; rename or move it.")
  if not os.path.isfile(path):
    raise UserError(f"--infer_input {path} does not exist; pass a file of inputs "
                    f"({', '.join(INFER_FILES)}).")
  rows = read_rows(path)
  for where, n, example in rows:
    if not isinstance(example, dict) or not (input_key in example or "messages" in example):
      raise UserError(f"--infer_input {where} {n} has no {input_key!r} field; each row "
                      f"needs one, e.g. {{\"{input_key}\": \"...\"}} (or \"messages\", a "
                      "conversation, for a decoder with a chat template).")
  if not rows:
    raise UserError(f"--infer_input {path} holds no inputs; write one JSON object per line.")
  return len(rows)


def _gather_device(x: jax.Array) -> np.ndarray:
  """A decode output sharded over processes, whole on every host."""
  if jax.process_count() > 1:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def _gather_host(x: np.ndarray) -> np.ndarray:
  """Every process's rows of a host batch, in process order."""
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(np.asarray(x)))\
      .reshape(-1, *np.asarray(x).shape[1:])



def restore_for_eval(task: Any, train_input: BaseInput, partitioner: Any, job_log_dir: str,
                     step: int | None = None, restore_dir: str | None = None,
                     init_from: Any = None, program: Any = None) -> tuple[Any, int]:
  """The state of a finished or running job, for --mode=eval / decode / infer / export.

  Nothing is written. With no checkpoint to read (and no step asked for),
  init_from's weights stand in as step 0: a user can score the imported
  model before fine-tuning it. program: the task's train program, when the
  caller restores several steps with one (else built here).

  Raises:
    UserError: there is no checkpoint to read, or not the requested step.
  """
  from paxlike import checkpoints as ckpt_lib
  from paxlike import initial, resume, trainer

  program = program or trainer.build_train_program(task, train_input, partitioner)
  directory = ckpt_lib.read_dir(job_log_dir, restore_dir)
  has_dir = os.path.isdir(directory)
  ckpt = ckpt_lib.Checkpointer(directory, read_only=True) if has_dir else None
  latest = ckpt.latest_step() if ckpt else None
  if init_from and step is None and latest is None:
    state, _ = initial.start_state(init_from, task.model, program.abstract, partitioner,
                                   program.init_state(task.train.seed))
    log.info("no checkpoint in %s: using the weights of %s", directory, init_from.spec)
    return state, 0
  if not has_dir:
    raise UserError(f"no checkpoints in {directory} to restore; train first or pass "
                    "--restore_checkpoint_dir.")
  step = step if step is not None else latest
  if step is None:
    raise UserError(f"no complete checkpoint in {directory}; train first.")
  if step not in ckpt.all_steps():
    raise UserError(f"no checkpoint for step {step} in {directory}; "
                    f"available: {ckpt.all_steps() or 'none'}.")
  # In this layout, or restacked from another (NUM_STAGES, CIRCULAR_REPEAT, ...).
  state, _ = resume.read_step(resume.Source(ckpt, step, restore_dir is None), step,
                              partitioner.abstract_state(program.abstract), program.abstract,
                              task.model)
  ckpt.close()
  log.info("restored step %d from %s", step, ckpt.step_path(step))
  return partitioner.shard_state(state), int(step)
