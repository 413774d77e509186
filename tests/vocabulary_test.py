"""Vocabularies from a checkpoint directory (paxlike.inputs.vocabulary) against transformers.

Tokenizers are trained here, in tmp directories: a SentencePiece model (T5's
layout: pad 0, EOS 1, unknown 2, 100 <extra_id_N> sentinels after the pieces)
and a byte-level BPE tokenizer.json with a Llama-like template (the
post-processor starts every sequence with <|begin_of_text|>, <|end_of_text|>
ends one). Each lies in a Hugging Face-style directory with the config files
transformers writes. paxlike's encode / decode must equal AutoTokenizer's on a
few hundred strings; a tokenizer larger than VOCAB_SIZE is refused by the CLI
before anything is written; and a fine-tuning job carries its tokenizer into
later infer and export runs, a Hugging Face export (AutoTokenizer loads it) and
a StableHLO export (run.py tokenizes as paxlike does). A Llama fine-tuned with
VOCABULARY and a T5 from --init_from=hf:DIR, both on TRAIN_FILES, then infer, resume and
export with none of those settings: the same predictions, the tokenizer in both exports,
and another tokenizer refused.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import string
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT, describe, parse_trained_line, run_cli

NUM_STRINGS = 300
T5_EXTRA_IDS = 100
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
WORD_CHARS = "abcdefghijklmnoprstuvwyz"  # no q or x: unseen letters become unknown pieces


def _words(rng: random.Random, n: int) -> list[str]:
  return ["".join(rng.choice(WORD_CHARS) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def _corpus() -> list[str]:
  rng = random.Random(0)
  lexicon = _words(rng, 600)
  out = []
  for _ in range(600):
    words = [rng.choice(lexicon) for _ in range(rng.randint(3, 12))]
    out.append(" ".join(words) + rng.choice([".", ",", "!", "?", ""]) +
               f" {rng.randint(0, 99)}+{rng.randint(0, 99)}={rng.randint(0, 198)}")
  return out


def _strings(extra_ids: int = 0) -> list[str]:
  """Strings to compare on: words seen and unseen, digits, punctuation, unicode, and
  (with extra_ids) T5 sentinels between words."""
  rng = random.Random(1)
  lexicon = _words(rng, 300) + ["qux", "xylo", "café", "naïve", "日本", "🙂", "don't", "it's"]
  out = []
  for i in range(NUM_STRINGS):
    words = [rng.choice(lexicon) for _ in range(rng.randint(1, 10))]
    if extra_ids and i % 3 == 0:
      words.insert(rng.randrange(len(words) + 1), f"<extra_id_{rng.randrange(extra_ids)}>")
    text = " ".join(words)
    if i % 4 == 1:
      text += rng.choice([" .", "!", " ?", ", ok", " 12+34=46"])
    if i % 7 == 2:
      text = text + " " + "".join(rng.choice(string.punctuation) for _ in range(3))
    out.append(text)
  return out


# ------------------------------------------------------------- tokenizer directories

# A short one: the test model's rows hold 16 tokens. "u:7+8=" asks, "a:" starts the reply.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'][0] + ':' + m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'a:' }}{% endif %}")


def _write_json(path: Path, obj: dict) -> None:
  path.write_text(json.dumps(obj, indent=2))


@pytest.fixture(scope="module")
def t5_sp_dir(tmp_path_factory) -> Path:
  """spiece.model with the tokenizer_config.json / special_tokens_map.json transformers
  4 wrote for T5Tokenizer (the layout of released T5 checkpoints), and a T5 config.json."""
  import sentencepiece as spm

  out = tmp_path_factory.mktemp("t5_sp")
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(_corpus()), model_writer=model, vocab_size=300,
      hard_vocab_limit=False, model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      minloglevel=2)
  (out / "spiece.model").write_bytes(model.getvalue())
  extras = [f"<extra_id_{i}>" for i in range(T5_EXTRA_IDS)]
  special = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
             "additional_special_tokens": extras}
  _write_json(out / "special_tokens_map.json", special)
  _write_json(out / "tokenizer_config.json", {**special, "extra_ids": T5_EXTRA_IDS,
                                              "model_max_length": 512,
                                              "tokenizer_class": "T5Tokenizer"})
  _write_json(out / "config.json", {"model_type": "t5", "vocab_size": 416,
                                    "decoder_start_token_id": 0, "eos_token_id": 1,
                                    "pad_token_id": 0})
  return out


def _bpe_tokenizer():
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[PAD, EOS, BOS],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(_corpus(), trainer)
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 2)])
  return tok


@pytest.fixture(scope="module")
def llama_tok_dir(tmp_path_factory) -> Path:
  """A BPE tokenizer.json with a Llama-like template (pad 0, EOS 1, BOS 2 added in front),
  saved by transformers' PreTrainedTokenizerFast where transformers is installed."""
  out = tmp_path_factory.mktemp("llama_tok")
  tok = _bpe_tokenizer()
  try:
    from transformers import PreTrainedTokenizerFast
  except ImportError:
    tok.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", {
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False})
  else:
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                            chat_template=CHAT_TEMPLATE).save_pretrained(str(out))
  return out


@pytest.fixture(scope="module")
def t5_fast_dir(t5_sp_dir, tmp_path_factory) -> Path:
  """A random tiny T5 saved by transformers, with the spiece model's tokenizer saved by
  T5Tokenizer (transformers 5 writes tokenizer.json, no spiece.model)."""
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  out = tmp_path_factory.mktemp("t5_fast")
  config = transformers.T5Config(vocab_size=416, d_model=16, d_kv=8, num_heads=2, d_ff=32,
                                 num_layers=1, decoder_start_token_id=0, pad_token_id=0,
                                 eos_token_id=1)
  transformers.T5ForConditionalGeneration(config).save_pretrained(str(out))
  transformers.T5Tokenizer.from_pretrained(str(t5_sp_dir)).save_pretrained(str(out))
  assert (out / "tokenizer.json").exists()
  return out


# ------------------------------------------------------------------ parity


def _parity(directory: Path, extra_ids: int = 0) -> dict[str, int]:
  """paxlike's vocabulary against AutoTokenizer on _strings; counts of equal results."""
  from transformers import AutoTokenizer

  from paxlike.inputs import vocabulary

  ours = vocabulary.get(str(directory))
  theirs = AutoTokenizer.from_pretrained(str(directory))
  strings = _strings(extra_ids)
  rng = np.random.default_rng(0)
  counts = {"strings": len(strings), "encode": 0, "with_specials": 0, "decode": 0,
            "decode_random_ids": 0}
  mismatches = []
  for text in strings:
    ids = ours.encode(text)
    want = theirs.encode(text, add_special_tokens=False)
    counts["encode"] += ids == want
    # What TextInput builds (BOS where the tokenizer adds one, the text, EOS) against
    # transformers' sequence with its special tokens: a T5 sequence ends with EOS, a
    # Llama one starts with BOS (and adds no EOS).
    full = ([ours.bos_id] if ours.add_bos else []) + ids + [ours.eos_id]
    hf_full = theirs.encode(text)
    counts["with_specials"] += full[:len(hf_full)] == hf_full
    # Decoding stops at EOS: what follows (padding, junk) shows nothing.
    junk = rng.integers(0, ours.vocab_size, 5).tolist()
    got = ours.decode([*full, ours.pad_id, *junk])
    counts["decode"] += got == theirs.decode(full, skip_special_tokens=True)
    # Any ids but EOS (special ones in the middle are skipped, as transformers skips them).
    rand = [i for i in rng.integers(0, ours.vocab_size, 12).tolist() if i != ours.eos_id]
    counts["decode_random_ids"] += ours.decode(rand) == theirs.decode(
        rand, skip_special_tokens=True)
    if ids != want and len(mismatches) < 3:
      mismatches.append((text, ids, want))
  print(f"parity {directory.name}: {counts}")
  counts["mismatches"] = mismatches
  return counts


def _assert_all_equal(counts: dict) -> None:
  n = counts["strings"]
  assert all(counts[k] == n for k in ("encode", "with_specials", "decode",
                                      "decode_random_ids")), counts


def test_spiece_model_encodes_and_decodes_like_autotokenizer(t5_sp_dir):
  pytest.importorskip("transformers")
  _assert_all_equal(_parity(t5_sp_dir, extra_ids=T5_EXTRA_IDS))


def test_t5_tokenizer_json_encodes_and_decodes_like_autotokenizer(t5_fast_dir):
  _assert_all_equal(_parity(t5_fast_dir, extra_ids=T5_EXTRA_IDS))


def test_llama_tokenizer_json_encodes_and_decodes_like_autotokenizer(llama_tok_dir):
  pytest.importorskip("transformers")
  _assert_all_equal(_parity(llama_tok_dir))


# ------------------------------------------------------------ special ids


def test_special_ids_come_from_the_directory_config_files(t5_sp_dir, llama_tok_dir):
  import sentencepiece as spm

  from paxlike.inputs import vocabulary

  t5 = vocabulary.get(str(t5_sp_dir))
  pieces = spm.SentencePieceProcessor(model_file=str(t5_sp_dir / "spiece.model")).get_piece_size()
  assert (t5.pad_id, t5.eos_id, t5.unk_id, t5.bos_id, t5.add_bos) == (0, 1, 2, None, False)
  assert t5.vocab_size == pieces + T5_EXTRA_IDS
  # T5's sentinels count down from the last id: <extra_id_0> is the largest.
  assert t5.encode("<extra_id_0>") == [pieces + T5_EXTRA_IDS - 1]
  assert t5.encode("<extra_id_99>") == [pieces]
  assert t5.decode(t5.encode("abc <extra_id_3> de") + [1, 5, 6]) == "abc de"
  # The file itself, or the directory: the same vocabulary.
  assert vocabulary.get(str(t5_sp_dir / "spiece.model")).vocab_size == t5.vocab_size

  llama = vocabulary.get(str(llama_tok_dir))
  assert (llama.pad_id, llama.eos_id, llama.bos_id, llama.add_bos) == (0, 1, 2, True)
  assert llama.decode([2, *llama.encode("hello world"), 1, 7, 8]) == "hello world"


def test_text_input_starts_examples_with_bos_where_the_tokenizer_does(llama_tok_dir):
  from paxlike.inputs.text import TextInput

  inp = TextInput(name="t", generator="tasks.arithmetic:examples", split="test",
                  vocabulary=str(llama_tok_dir), seq_len=16, batch_size=2, is_training=False,
                  repeat=False, reset_for_eval=True, shuffle=False)
  batch = inp.get_next()
  assert (batch["ids"][:, 0] == 2).all()  # <|begin_of_text|>
  from tasks import arithmetic

  first = next(iter(arithmetic.examples("test")))
  assert inp.ids_to_strings(batch["ids"][:1, :batch["prompt_lens"][0]]) == [first["inputs"]]


def test_resolve_prefers_the_job_record_then_the_init_from_directory(t5_sp_dir, tmp_path):
  from paxlike.errors import UserError
  from paxlike.inputs import vocabulary

  assert vocabulary.resolve(None, None, str(tmp_path)) == "byte"
  assert vocabulary.resolve(None, str(t5_sp_dir), str(tmp_path)) == str(t5_sp_dir)
  assert vocabulary.resolve("byte", str(t5_sp_dir), str(tmp_path)) == "byte"
  recorded = vocabulary.record(vocabulary.get(str(t5_sp_dir)), str(tmp_path))
  assert sorted(os.listdir(recorded)) == sorted(
      ["spiece.model", "tokenizer_config.json", "special_tokens_map.json", "config.json"])
  assert vocabulary.resolve("hf", str(t5_sp_dir), str(tmp_path)) == recorded
  with pytest.raises(UserError, match="VOCABULARY='hf'"):
    vocabulary.get(vocabulary.resolve("hf", None, str(tmp_path / "elsewhere")))
  with pytest.raises(UserError, match="does not exist"):
    vocabulary.get(str(tmp_path / "nothing.model"))


def test_a_tokenizer_ending_sequences_with_another_id_than_the_model_is_refused(llama_tok_dir):
  from paxlike.errors import UserError
  from paxlike.inputs import vocabulary
  from paxlike.models.llama import LlamaModel

  vocab = vocabulary.get(str(llama_tok_dir))
  model = LlamaModel(vocab_size=512, model_dims=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=16, hidden_dims=64, eos_id=7)
  with pytest.raises(UserError, match="ends sequences with id 1 but the model stops decoding "
                                      "at 7; set EOS_ID=1"):
    vocabulary.check_fits(vocab, model)
  vocabulary.check_fits(vocab, model.clone(eos_id=1))


# ------------------------------------------------------------------------ CLI


def test_a_tokenizer_larger_than_vocab_size_is_refused_before_anything_is_written(
    t5_sp_dir, tmp_path):
  from paxlike.inputs import vocabulary

  size = vocabulary.get(str(t5_sp_dir)).vocab_size
  job = tmp_path / "job"
  proc = run_cli(["--exp=FlanT5ArithmeticTiny", f"--job_log_dir={job}",
                  f"--init_from=hf:{t5_sp_dir}", "--set", "VOCAB_SIZE=264"], tmp_path,
                 pythonpath=[REPO_ROOT])
  assert proc.returncode == 2, describe(proc)
  assert "Traceback" not in proc.stderr
  message = proc.stderr.strip().splitlines()[-1]
  assert f"has {size} tokens" in message and "VOCAB_SIZE is 264" in message, message
  assert not job.exists()


LLAMA = {"NUM_LAYERS": 1, "MODEL_DIMS": 32, "NUM_HEADS": 2, "NUM_KV_HEADS": 1,
         "DIMS_PER_HEAD": 16, "HIDDEN_DIMS": 64, "MAX_SEQ_LEN": 16}


def _llama_sets(vocab_size: int) -> list[str]:
  sets = {**LLAMA, "VOCAB_SIZE": vocab_size, "NUM_TRAIN_STEPS": 2,
          "CHECKPOINT_EVERY_N_STEPS": 2, "EVAL_INTERVAL_STEPS": 0, "PERCORE_BATCH_SIZE": 4}
  return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def llama_job(llama_tok_dir, tmp_path_factory):
  """Random Llama weights + the BPE tokenizer as a Hugging Face directory, fine-tuned for two
  steps with --init_from=hf:DIR (VOCABULARY left unset: the directory's tokenizer)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from paxlike.inputs import vocabulary
  from paxlike.interop import hf
  from paxlike.models.llama import LlamaModel

  root = tmp_path_factory.mktemp("llama_job")
  size = vocabulary.get(str(llama_tok_dir)).vocab_size
  table = -(-size // 8) * 8
  model = LlamaModel(vocab_size=table, model_dims=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=16, hidden_dims=64, tie_embeddings=False, rope_theta=10000.0,
                     rope_scaling=None, norm_epsilon=1e-5, qkv_bias=False, max_seq_len=16)
  params = nn.meta.unbox(jax.jit(lambda k: model.init(k, jnp.zeros((1, 4), jnp.int32))["params"])(
      jax.random.key(0)))
  hf_dir = root / "hf"
  hf.export_params(jax.device_get(params), model, str(hf_dir))
  for name in os.listdir(llama_tok_dir):
    (hf_dir / name).write_bytes((llama_tok_dir / name).read_bytes())
  job = root / "job"
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", f"--init_from=hf:{hf_dir}",
                  *_llama_sets(table), "--enable_summary_writer=false",
                  "--peak_tflops_per_device=1"], root, timeout=600, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  return root, job, table


def test_the_job_records_its_tokenizer_and_infer_reads_it_later(llama_job, llama_tok_dir):
  root, job, table = llama_job
  assert set(os.listdir(llama_tok_dir)) <= set(os.listdir(job / "vocabulary"))
  assert json.loads((job / "run_env.json").read_text())["vocabulary"].endswith("tokenizer.json")
  # No --init_from now: the job's own record says which tokenizer its checkpoints learned.
  inputs = root / "prompts.jsonl"
  inputs.write_text('{"inputs": "12+34="}\n{"inputs": "hello world"}\n'
                    '{"messages": [{"role": "user", "content": "7+8="}]}\n')
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", "--mode=infer",
                  f"--infer_input={inputs}", *_llama_sets(table)], root, timeout=600,
                 pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  run_env = json.loads((job / "infer_run_env.json").read_text())  # Pax's <mode>_ prefix
  assert run_env["vocabulary"] == str(job / "vocabulary" / "tokenizer.json"), run_env
  out = Path(proc.stdout.split(" -> ")[-1].strip())
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  # Each input as the file gives it (a chat row's messages), each with a generation.
  assert [r["input"] for r in rows] == ["12+34=", "hello world",
                                        [{"role": "user", "content": "7+8="}]], rows
  assert all(isinstance(r["prediction"], str) for r in rows)


def test_hf_export_carries_a_tokenizer_autotokenizer_loads(llama_job, llama_tok_dir):
  root, job, table = llama_job
  out = root / "export_hf"
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", "--mode=export",
                  "--export_format=hf", f"--export_dir={out}", "--decode_num_beams=4",
                  "--decode_max_length=5", *_llama_sets(table)], root,
                 pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(
      os.listdir(out))
  generation = json.loads((out / "generation_config.json").read_text())
  assert (generation["bos_token_id"], generation["eos_token_id"],
          generation["pad_token_id"]) == (2, 1, 0)
  # The --decode_* flags travel: beams and the length (T5X's brevity penalty has no field).
  assert (generation["num_beams"], generation["max_new_tokens"]) == (4, 5)
  transformers = pytest.importorskip("transformers")
  assert transformers.GenerationConfig.from_pretrained(str(out)).num_beams == 4
  exported = transformers.AutoTokenizer.from_pretrained(str(out))
  source = transformers.AutoTokenizer.from_pretrained(str(llama_tok_dir))
  strings = _strings()
  same = sum(exported(t).input_ids == source(t).input_ids for t in strings)
  assert same == len(strings)


def test_stablehlo_export_tokenizes_with_the_tokenizer_json(llama_job, llama_tok_dir):
  root, job, table = llama_job
  out = root / "export_shlo"
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", "--mode=export",
                  "--export_format=stablehlo", "--export_platforms=cpu", f"--export_dir={out}",
                  *_llama_sets(table)], root, timeout=600, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["vocabulary"]["kind"] == "hf_tokenizer"
  assert manifest["vocabulary"]["model_file"] == "tokenizer.json"
  assert (out / "tokenizer.json").read_bytes() == (llama_tok_dir / "tokenizer.json").read_bytes()
  import importlib.util

  spec = importlib.util.spec_from_file_location("export_run", out / "run.py")
  runner = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(runner)
  decoder = runner.load(str(out))

  from paxlike.inputs import vocabulary

  ours = vocabulary.get(str(llama_tok_dir))
  for text in _strings()[:50]:
    ids = decoder.tokenize(text)
    assert ids == [ours.bos_id, *ours.encode(text)]
    assert decoder.detokenize([*ids, ours.eos_id, 5, 6]) == ours.decode(ids)
  rows = decoder.generate(["12+34="])
  assert isinstance(rows[0]["generation"], str)


def test_the_runner_names_the_package_a_vocabulary_needs(monkeypatch, tmp_path):
  import importlib

  from paxlike.export import runner

  real_import = importlib.import_module

  def no_tokenizers(name, *args, **kwargs):
    if name == "tokenizers":
      raise ImportError(name)
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(importlib, "import_module", no_tokenizers)
  decoder = runner.Decoder.__new__(runner.Decoder)
  decoder.export_dir, decoder._tok = str(tmp_path), None
  decoder.manifest = {"vocabulary": {"kind": "hf_tokenizer", "model_file": "tokenizer.json",
                                     "eos_id": 1, "pad_id": 0, "bos_id": 2, "add_bos": True}}
  with pytest.raises(runner.ExportError, match="needs the tokenizers package; pip install "
                                               "tokenizers"):
    decoder.tokenize("hello")


def test_a_spiece_vocabulary_exports_to_a_directory_autotokenizer_reads(t5_sp_dir, tmp_path):
  from paxlike.inputs import vocabulary

  vocab = vocabulary.get(str(t5_sp_dir))
  out = tmp_path / "export"
  out.mkdir()
  _write_json(out / "config.json", {"model_type": "t5", "vocab_size": 416})  # the export's own
  vocabulary.write_hf_files(vocab, str(out), {"decoder_start_token_id": 0, "eos_token_id": 1,
                                              "pad_token_id": 0, "bos_token_id": None})
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                     "special_tokens_map.json", "spiece.model",
                                     "tokenizer_config.json"]
  assert json.loads((out / "generation_config.json").read_text()) == {
      "decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
  transformers = pytest.importorskip("transformers")
  exported = transformers.AutoTokenizer.from_pretrained(str(out))
  strings = _strings(T5_EXTRA_IDS)
  assert all(exported(t).input_ids == vocab.encode(t) + [vocab.eos_id] for t in strings)


def test_the_runner_tokenizes_a_spiece_export_as_paxlike_does(t5_sp_dir, tmp_path):
  import shutil
  import types

  from paxlike.export import job, runner, stablehlo
  from paxlike.inputs import vocabulary

  vocab = vocabulary.get(str(t5_sp_dir))
  entry = job.vocabulary_of(types.SimpleNamespace(vocab=vocab))
  assert entry["kind"] == "sentencepiece" and entry["added_tokens"]["<extra_id_0>"] == \
      vocab.vocab_size - 1
  shutil.copyfile(entry["model_file"], tmp_path / stablehlo.SP_MODEL_FILE)
  decoder = runner.Decoder.__new__(runner.Decoder)
  decoder.export_dir, decoder._tok = str(tmp_path), None
  decoder.manifest = {"vocabulary": {**entry, "model_file": stablehlo.SP_MODEL_FILE}}
  rng = np.random.default_rng(0)
  for text in _strings(T5_EXTRA_IDS):
    ids = decoder.tokenize(text)
    assert ids == vocab.encode(text), text
    rand = rng.integers(0, vocab.vocab_size, 12).tolist()
    assert decoder.detokenize(rand) == vocab.decode(rand)


def test_llama_experiments_take_eos_and_pad_from_the_checkpoint_tokenizer(llama_tok_dir, tmp_path):
  """EOS_ID / PAD_ID left None: the ids of INIT_FROM's tokenizer (here EOS moved to id 2 and
  no pad token, so padding is EOS), not 1 and 0; set, they win."""
  from paxlike import config, experiment, registry
  from paxlike.inputs import vocabulary

  moved = tmp_path / "moved"
  moved.mkdir()
  for name in os.listdir(llama_tok_dir):
    (moved / name).write_bytes((llama_tok_dir / name).read_bytes())
  for name in ("tokenizer_config.json", "special_tokens_map.json"):
    if (moved / name).exists():
      settings = json.loads((moved / name).read_text())
      settings["eos_token"] = BOS
      settings.pop("pad_token", None)
      _write_json(moved / name, settings)
  vocab = vocabulary.get(str(moved))
  assert (vocab.eos_id, vocab.pad_id) == (2, 2)
  cls = registry.get("LlamaTiny")
  model = config.build(experiment.instantiate(cls, [f"INIT_FROM=hf:{moved}"]).model())
  assert (model.eos_id, model.pad_id) == (2, 2)
  plain = config.build(experiment.instantiate(cls, []).model())
  assert (plain.eos_id, plain.pad_id) == (1, 0)
  pinned = config.build(experiment.instantiate(
      cls, [f"INIT_FROM=hf:{moved}", "EOS_ID=5", "PAD_ID=0"]).model())
  assert (pinned.eos_id, pinned.pad_id) == (5, 0)


def test_fine_tune_on_files_from_the_hf_directory_then_transformers_generates_like_infer(
    llama_job, tmp_path):
  """The whole path on the directory's own tokenizer: TRAIN_FILES fine-tune (the eval loss
  falls), greedy --mode=infer, an HF export that transformers' generate continues the same."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  root, _, table = llama_job
  words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
  rows = [{"inputs": f"say {w}", "targets": w} for w in words]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
  job = tmp_path / "job"
  sets = [*_llama_sets(table), "--set", "NUM_TRAIN_STEPS=40", "--set",
          "CHECKPOINT_EVERY_N_STEPS=40", "--set", "EVAL_INTERVAL_STEPS=10", "--set",
          "LEARNING_RATE=1e-2", "--set", f"TRAIN_FILES=[{tmp_path / 'train.jsonl'}]", "--set",
          f"EVAL_FILES=[{tmp_path / 'test.jsonl'}]"]
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}",
                  f"--init_from=hf:{root / 'hf'}", *sets, "--peak_tflops_per_device=1"],
                 tmp_path, timeout=600, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  losses = [float(x) for x in re.findall(r"eval test at step \d+: loss ([\d.]+)", proc.stderr)]
  assert len(losses) >= 2 and losses[-1] < losses[0], losses
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"inputs": r["inputs"]}) + "\n" for r in rows[:4]))
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", "--mode=infer",
                  f"--infer_input={prompts}", "--decode_max_length=6", *sets], tmp_path,
                 timeout=600, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  out = Path(proc.stdout.split(" -> ")[-1].strip())
  predictions = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
  export = tmp_path / "hf_out"
  proc = run_cli(["--exp=LlamaArithmeticTiny", f"--job_log_dir={job}", "--mode=export",
                  "--export_format=hf", f"--export_dir={export}", *sets], tmp_path,
                 timeout=600, pythonpath=[REPO_ROOT])
  assert proc.returncode == 0, describe(proc)
  tok = transformers.AutoTokenizer.from_pretrained(str(export))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(export)).eval()
  want = []
  for r in rows[:4]:
    ids = torch.tensor([tok(r["inputs"]).input_ids])
    with torch.no_grad():
      gen = model.generate(ids, do_sample=False, max_new_tokens=6,
                           attention_mask=torch.ones_like(ids))
    want.append(tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
  assert predictions == want, (predictions, want)
  assert any(predictions), predictions  # text was generated, not EOS at once


# ------------------------------------------- later runs of a job read the tokenizer it recorded

SAY = [{"inputs": f"say {w}", "targets": w} for w in
       ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")]
T5 = {"NUM_ENCODER_LAYERS": 1, "NUM_DECODER_LAYERS": 1, "MODEL_DIMS": 32, "NUM_HEADS": 2,
      "DIMS_PER_HEAD": 16, "HIDDEN_DIMS": 64, "MAX_INPUT_LEN": 12, "MAX_TARGET_LEN": 6,
      "VOCAB_SIZE": 416}


def _sets(values: dict) -> list[str]:
  return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def _t5_hf_dir(t5_sp_dir: Path, out: Path) -> Path:
  """Random FlanT5Tiny weights (the test's dims) + the spiece tokenizer, a Hugging Face dir."""
  import jax

  from paxlike import config, experiment, registry, resume
  from paxlike.interop import hf

  exp = experiment.instantiate(registry.get("FlanT5Tiny"), [f"{k}={v}" for k, v in T5.items()])
  task = config.build(exp.task())
  inp = config.build(exp.datasets()[0])
  inp.bind_host(1, 0)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: (rng.standard_normal(a.shape) * 0.05).astype(np.float32),
                        resume.abstract_train_state(task, inp).params)
  hf.export_params(params, task.model, str(out))
  for name in os.listdir(t5_sp_dir):
    if name != "config.json":  # the export's own
      (out / name).write_bytes((t5_sp_dir / name).read_bytes())
  return out


def _predictions(proc) -> list[str]:
  assert proc.returncode == 0, describe(proc)
  out = Path(proc.stdout.split(" -> ")[-1].strip())
  return [json.loads(line)["prediction"] for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def own_tokenizer_jobs(llama_tok_dir, t5_sp_dir, tmp_path_factory):
  """A LlamaTiny fine-tuned on TRAIN_FILES with VOCABULARY=its tokenizer.json, and a
  FlanT5Tiny on TRAIN_FILES from --init_from=hf:DIR (a spiece.model); each then predicts
  (--mode=infer) with those settings given, as its training run had them."""
  from paxlike.inputs import vocabulary

  root = tmp_path_factory.mktemp("own_tokenizer")
  train = root / "train.jsonl"
  train.write_text("".join(json.dumps(r) + "\n" for r in SAY))
  prompts = root / "prompts.jsonl"
  prompts.write_text("".join(json.dumps({"inputs": r["inputs"]}) + "\n" for r in SAY[:3]))
  table = -(-vocabulary.get(str(llama_tok_dir)).vocab_size // 8) * 8
  model_sets = {
      "llama": ["--exp=LlamaTiny", *_sets({**LLAMA, "VOCAB_SIZE": table})],
      "t5": ["--exp=FlanT5Tiny", *_sets(T5)],
  }
  file_sets = {
      "llama": _sets({"TRAIN_FILES": f"[{train}]",
                      "VOCABULARY": llama_tok_dir / "tokenizer.json"}),
      "t5": [*_sets({"TRAIN_FILES": f"[{train}]"}),
             f"--init_from=hf:{_t5_hf_dir(t5_sp_dir, root / 't5_hf')}"],
  }
  train_sets = _sets({"NUM_TRAIN_STEPS": 2, "CHECKPOINT_EVERY_N_STEPS": 1,
                      "PERCORE_BATCH_SIZE": 4, "LEARNING_RATE": 1e-2})
  jobs = {}
  for family in ("llama", "t5"):
    job = root / family
    proc = run_cli([*model_sets[family], f"--job_log_dir={job}", *file_sets[family],
                    *train_sets, "--enable_summary_writer=false",
                    "--peak_tflops_per_device=1"], root, timeout=600)
    assert proc.returncode == 0, describe(proc)
    infer = [*model_sets[family], f"--job_log_dir={job}", "--mode=infer",
             f"--infer_input={prompts}"]
    given = _predictions(run_cli([*infer, *file_sets[family]], root, timeout=600))
    jobs[family] = {"job": job, "model_sets": model_sets[family], "infer": infer,
                    "given": given, "file_sets": file_sets[family]}
  return root, jobs


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_infer_with_no_file_settings_predicts_as_with_them(own_tokenizer_jobs, family):
  root, jobs = own_tokenizer_jobs
  j = jobs[family]
  bare = _predictions(run_cli(j["infer"], root, timeout=600))
  assert bare == j["given"]
  run_env = json.loads((j["job"] / "infer_run_env.json").read_text())
  assert os.path.dirname(run_env["vocabulary"]) == str(j["job"] / "vocabulary"), run_env


def test_a_resumed_run_keeps_the_recorded_tokenizer(own_tokenizer_jobs):
  """The rerun (of a copy of the job) names its files but not VOCABULARY: it reads the
  job's tokenizer, not bytes."""
  import shutil

  root, jobs = own_tokenizer_jobs
  j = jobs["llama"]
  job = root / "resumed"
  shutil.copytree(j["job"], job)
  more = _sets({"NUM_TRAIN_STEPS": 3, "CHECKPOINT_EVERY_N_STEPS": 1, "PERCORE_BATCH_SIZE": 4,
                "LEARNING_RATE": 1e-2})
  proc = run_cli([*j["model_sets"], f"--job_log_dir={job}", *j["file_sets"][:2], *more,
                  "--enable_summary_writer=false", "--peak_tflops_per_device=1"], root,
                 timeout=600)
  assert proc.returncode == 0, describe(proc)
  assert parse_trained_line(proc.stdout)["start_step"] == 2
  run_env = json.loads((job / "run_env.json").read_text())
  assert run_env["vocabulary"] == str(job / "vocabulary" / "tokenizer.json"), run_env


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_the_stablehlo_export_with_no_file_settings_reads_text_with_the_tokenizer(
    own_tokenizer_jobs, family, llama_tok_dir, t5_sp_dir):
  """Its runner tokenizes with the job's tokenizer and generates what infer predicted."""
  import importlib.util

  from paxlike.inputs import vocabulary

  root, jobs = own_tokenizer_jobs
  j = jobs[family]
  source = llama_tok_dir if family == "llama" else t5_sp_dir
  shlo = root / f"{family}_export_stablehlo"
  proc = run_cli([*j["model_sets"], f"--job_log_dir={j['job']}", "--mode=export",
                  "--export_format=stablehlo", "--export_platforms=cpu",
                  f"--export_dir={shlo}"], root, timeout=600)
  assert proc.returncode == 0, describe(proc)
  manifest = json.loads((shlo / "manifest.json").read_text())
  kind = "hf_tokenizer" if family == "llama" else "sentencepiece"
  assert manifest["vocabulary"]["kind"] == kind, manifest["vocabulary"]
  spec = importlib.util.spec_from_file_location(f"run_{family}", shlo / "run.py")
  runner = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(runner)
  decoder = runner.load(str(shlo))
  ours = vocabulary.get(str(source))
  for text in _strings()[:20]:
    assert decoder.tokenize(text) == [*([ours.bos_id] if ours.add_bos else []),
                                      *ours.encode(text)]
  rows = decoder.generate([r["inputs"] for r in SAY[:3]])
  assert [r["generation"] for r in rows] == j["given"]


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_the_hf_export_with_no_file_settings_carries_the_tokenizer(
    own_tokenizer_jobs, family, llama_tok_dir, t5_sp_dir):
  """AutoTokenizer loads it from the export directory and gives the source's ids."""
  root, jobs = own_tokenizer_jobs
  j = jobs[family]
  source = llama_tok_dir if family == "llama" else t5_sp_dir
  hf_out = root / f"{family}_export_hf"
  proc = run_cli([*j["model_sets"], f"--job_log_dir={j['job']}", "--mode=export",
                  "--export_format=hf", f"--export_dir={hf_out}"], root, timeout=600)
  assert proc.returncode == 0, describe(proc)
  tokenizer = "tokenizer.json" if family == "llama" else "spiece.model"
  assert (hf_out / tokenizer).read_bytes() == (source / tokenizer).read_bytes()
  transformers = pytest.importorskip("transformers")
  exported = transformers.AutoTokenizer.from_pretrained(str(hf_out))
  original = transformers.AutoTokenizer.from_pretrained(str(source))
  strings = _strings(T5_EXTRA_IDS if family == "t5" else 0)
  assert sum(exported(t).input_ids == original(t).input_ids for t in strings) == len(strings)


def test_a_tokenizer_other_than_the_recorded_one_is_refused(own_tokenizer_jobs, llama_tok_dir,
                                                             t5_sp_dir):
  root, jobs = own_tokenizer_jobs
  cases = [(jobs["llama"], ["--set", f"VOCABULARY={t5_sp_dir}"],
            f"VOCABULARY={t5_sp_dir} is not the tokenizer this job trained with"),
           (jobs["llama"], ["--set", "VOCABULARY=byte"], "it is the byte vocabulary"),
           (jobs["t5"], [f"--init_from=hf:{llama_tok_dir}"],
            f"the tokenizer of INIT_FROM ({llama_tok_dir}) is not the tokenizer this job")]
  for j, extra, says in cases:
    before = sorted(p.name for p in (j["job"] / "infer_out").rglob("*"))
    proc = run_cli([*j["infer"], *extra], root)
    assert proc.returncode == 2, describe(proc)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
        proc.stderr
    assert says in proc.stderr, proc.stderr
    assert sorted(p.name for p in (j["job"] / "infer_out").rglob("*")) == before
