"""README.md's and docs/*.md's code blocks, run as a newcomer runs them.

`python -m pytest -q tests` (the README's own test command) collects one test
per ```bash and ```python block, named by page and line (`README.md:13`).
The markdown is read by sybil (its fenced-block and HTML-comment lexers); the
blocks run here, each in a subprocess:

- A page's blocks run in order, in a working directory of their own (a temp
  directory, so nothing is written into the repository), which later blocks
  of the page share: a python block defines an experiment, a bash block
  trains it. A page that says `<!-- ci: continues README.md -->` runs in the
  README's directory, after the README's blocks (the serving page exports the
  README's fine-tuned job). Running one block alone runs the blocks before it.
- ```bash blocks run with `bash -e -o pipefail`; `python` and `python3` are
  this interpreter, this checkout's paxlike is on PYTHONPATH, and XLA_FLAGS
  holds no fake devices (conftest's 8 are the suite's, not a user's shell's).
  A leading `python3 -m venv .venv && . .venv/bin/activate && pip install -e
  '...' &&` is dropped: this test run already is that install.
- ```python blocks run as scripts; one whose first line is `# NAME.py` is
  saved as NAME.py first (a module later commands import, as the page says).
- Directives, in HTML comments GitHub does not show, for the next block:
  `<!-- ci: append ARGS -->` appends ARGS to each of its `python -m ...`
  commands (a CPU-sized override: fewer steps, the family's tiny member);
  `<!-- ci: instead:` + lines + `-->` runs those lines in its place (a CPU
  stand-in); sybil's `<!-- skip: next "why" -->` runs nothing.
- A block that needs what CI lacks (GPUs, TPUs, a pod, the internet) says so
  on its first line, where a reader sees it: `# needs 8 GPUs`. Only such a
  block may be replaced or skipped, and it must be (its stand-in runs
  instead); the README's second block, the test command itself, is the one
  other skipped block (running it here would run this suite again).

`python tests/docs_test.py tiny-flan-t5 DIR` writes the stand-in for a
downloaded Flan-T5 checkpoint (FlanT5Tiny's shape, random weights, a trained
tokenizer.json), which `$DOCS_TEST` names to the blocks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LANGUAGES = ("bash", "python")
INSTALL = re.compile(r"^python3 -m venv \.venv && \. \.venv/bin/activate && "
                     r"pip install -e \S+ && ")
NEEDS = re.compile(r"^# needs \S")
CONTINUES = re.compile(r"<!-- ci: continues (\S+) -->")
BLOCK_TIMEOUT_S = 600


def _name(page: Path) -> str:
  return page.relative_to(REPO_ROOT).as_posix()


# ------------------------------------------------------------------ parsing


@dataclass
class Block:
  """One ```bash / ```python block and what the directives before it say."""
  page: Path
  line: int
  language: str
  source: str
  append: str = ""
  instead: str | None = None
  skip: str | None = None

  @property
  def id(self) -> str:
    return f"{_name(self.page)}:{self.line}"

  @property
  def needs(self) -> str | None:
    first = self.source.splitlines()[0] if self.source.strip() else ""
    return first[2:] if NEEDS.match(first) else None


def _parse(page: Path) -> list[Block]:
  """The page's code blocks in order, each with the directives that precede it."""
  from sybil import Sybil
  from sybil.parsers.markdown import CodeBlockParser, SkipParser
  from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

  ci = DirectiveInHTMLCommentLexer(directive="ci")

  def directives(document):
    for region in ci(document):
      region.parsed = ("ci", region.lexemes["arguments"], str(region.lexemes["source"]))
      region.evaluator = None
      yield region

  skips = SkipParser()

  def skip_regions(document):
    for region in skips(document):
      region.parsed = ("skip", *region.parsed)
      yield region

  parsers = [directives, skip_regions,
             *(CodeBlockParser(lang, evaluator=None) for lang in LANGUAGES)]
  document = Sybil(parsers=parsers).parse(page)
  blocks: list[Block] = []
  pending: dict[str, str] = {}
  for example in document:
    parsed = example.parsed
    if isinstance(parsed, tuple) and parsed[0] == "ci":
      args, body = parsed[1].strip(), parsed[2]
      if args.startswith("append "):
        pending["append"] = args[len("append "):].strip()
      elif args == "instead:":
        pending["instead"] = body
      elif not args.startswith("continues "):
        raise ValueError(f"{_name(page)}:{example.line}: unknown directive <!-- ci: {args} -->")
      continue
    if isinstance(parsed, tuple) and parsed[0] == "skip":
      action, reason = parsed[1], parsed[2]
      if action != "next" or not reason:
        raise ValueError(f"{_name(page)}:{example.line}: only `skip: next \"why\"` is used")
      pending["skip"] = reason.strip().strip("\"'")
      continue
    language = next(lang for lang in LANGUAGES if _info(document.text, example.start) == lang)
    blocks.append(Block(page, example.line, language, str(parsed), **pending))
    pending = {}
  if pending:
    raise ValueError(f"{_name(page)}: a directive at the end is followed by no block")
  return blocks


def _info(text: str, start: int) -> str:
  """The info string of the fence that opens at start."""
  return text[start:text.index("\n", start)].lstrip(" `~").strip()


BLOCKS = {page: _parse(page) for page in PAGES}


def _continues(page: Path) -> Path | None:
  match = CONTINUES.search(page.read_text())
  return (REPO_ROOT / match.group(1)) if match else None


# ------------------------------------------------------------------ running


def with_append(source: str, args: str) -> str:
  """source with args appended to each (backslash-continued) `python -m ...` command,
  before a trailing comment or `&`."""
  lines, out, command = source.splitlines(), [], []
  for line in lines:
    command.append(line)
    if line.rstrip().endswith("\\"):
      continue
    if re.search(r"\bpython3? -m ", " ".join(command)):
      last = command[-1]
      match = re.search(r"(\s+&)?(\s+#[^'\"]*)?$", last)
      cut = match.start() if match else len(last)
      command[-1] = f"{last[:cut]} {args}{last[cut:]}"
    out.extend(command)
    command = []
  out.extend(command)
  return "\n".join(out) + "\n"


def script_for(block: Block) -> str:
  """The bash script CI runs for a block."""
  if block.instead is not None:
    return block.instead
  source = block.source
  if block.language == "bash":
    source = INSTALL.sub("", source)
  if block.append:
    source = with_append(source, block.append)
  return source


def _env() -> dict[str, str]:
  env = dict(os.environ)
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO_ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  if flags:
    env["XLA_FLAGS"] = " ".join(flags)
  else:
    env.pop("XLA_FLAGS", None)
  env["DOCS_TEST"] = str(Path(__file__).resolve())
  return env


def _python_command(block: Block, cwd: Path) -> list[str]:
  first = block.source.splitlines()[0]
  named = re.fullmatch(r"# (\w+\.py)", first.strip())
  if named:
    (cwd / named.group(1)).write_text(block.source)
    return [sys.executable, named.group(1)]
  return [sys.executable, "-c", block.source]


def run_block(block: Block, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
  """Runs what CI runs for the block in cwd; (process, seconds)."""
  start = time.perf_counter()
  if block.language == "python" and block.instead is None and not block.append:
    cmd = _python_command(block, cwd)
  else:
    cmd = ["bash", "-e", "-o", "pipefail", "-c", script_for(block)]
  proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                        timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
  return proc, time.perf_counter() - start


@dataclass
class PageState:
  """Where a page's blocks run, how far they got and what went wrong."""
  cwd: Path
  done: int = 0
  failed: str | None = None  # the first failure (later blocks are not run)
  results: dict[int, str | None] = field(default_factory=dict)
  seconds: dict[str, float] = field(default_factory=dict)


_STATES: dict[Path, PageState] = {}


def _state(page: Path, tmp_path_factory) -> PageState:
  if page not in _STATES:
    base = _continues(page)
    if base is not None:
      base_state = _run_until(base, len(BLOCKS[base]), tmp_path_factory)
      _STATES[page] = PageState(base_state.cwd, failed=base_state.failed)
    else:
      _STATES[page] = PageState(tmp_path_factory.mktemp(page.stem.lower()))
  return _STATES[page]


def _run_until(page: Path, index: int, tmp_path_factory) -> PageState:
  """Runs the page's blocks before index that have not run (none after a failure)."""
  state = _state(page, tmp_path_factory)
  while state.done < index:
    i, block = state.done, BLOCKS[page][state.done]
    state.done += 1
    if state.failed is not None or block.skip is not None:
      continue
    proc, seconds = run_block(block, state.cwd)
    state.seconds[block.id] = seconds
    if proc.returncode != 0:
      state.failed = state.results[i] = (
          f"{block.id} failed (exit {proc.returncode}, {seconds:.0f}s); CI ran:\n"
          f"{script_for(block)}\n--- stdout\n{proc.stdout[-3000:]}\n"
          f"--- stderr\n{proc.stderr[-6000:]}")
  return state


CASES = [(page, i) for page in PAGES for i in range(len(BLOCKS[page]))]


# The blocks run under the README's Python (3.11, JAX 0.10): CI runs the suite
# under 3.11 and 3.12 side by side, and the 3.12 suite's other tests cover the same
# code paths under JAX 0.12; running every block twice cost CI ~5 minutes.
# PAXLIKE_DOCS_EVERY_PYTHON=1 runs them under any Python.
DOCS_PYTHON = (3, 11)


@pytest.mark.skipif(sys.version_info[:2] != DOCS_PYTHON
                    and not os.environ.get("PAXLIKE_DOCS_EVERY_PYTHON"),
                    reason="the docs' blocks run under the README's Python 3.11 "
                           "(PAXLIKE_DOCS_EVERY_PYTHON=1 runs them here)")
@pytest.mark.parametrize("case", CASES, ids=[BLOCKS[p][i].id for p, i in CASES])
def test_block_runs_as_written(case, tmp_path_factory):
  page, index = case
  block = BLOCKS[page][index]
  state = _run_until(page, index + 1, tmp_path_factory)
  if index in state.results:
    pytest.fail(state.results[index], pytrace=False)
  if state.failed is not None:
    pytest.skip(f"not run: {state.failed.splitlines()[0]}")
  if block.skip is not None:
    pytest.skip(block.skip)


def test_every_fenced_block_is_bash_python_or_plain_text():
  fence = re.compile(r"^ *(```+|~~~+)(.*)$", re.M)
  for page in PAGES:
    opened = None
    for match in fence.finditer(page.read_text()):
      info = match.group(2).strip()
      if opened is None:
        opened = match.group(1)
        assert info in ("", "text", *LANGUAGES), (
            f"{_name(page)}: a ```{info} block would not run; write ```bash, ```python, or "
            "``` / ```text for output and listings")
      elif match.group(1).startswith(opened) and not info:
        opened = None


def test_only_blocks_marked_as_needing_hardware_are_replaced_or_skipped():
  readme = BLOCKS[REPO_ROOT / "README.md"]
  test_command = [b for b in readme if b.language == "bash"][1]
  for blocks in BLOCKS.values():
    for block in blocks:
      replaced = block.instead is not None or block.skip is not None
      if block is test_command:
        assert block.skip and "python -m pytest" in block.source, block.id
      elif block.needs:
        assert replaced or block.append, (
            f"{block.id} needs {block.needs}: say what CI runs instead (<!-- ci: instead: ... "
            "-->, <!-- ci: append ... -->) or <!-- skip: next \"why\" -->")
      else:
        assert not replaced, (f"{block.id} is not run by CI but does not say what it needs "
                              "(first line `# needs ...`)")


def test_readme_starts_with_the_install_and_run_command_then_the_test_command():
  # .ci/run reads the second ```bash block exactly this way.
  text = (REPO_ROOT / "README.md").read_text()
  blocks = re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S)
  assert INSTALL.match(blocks[0]) and "python -m paxlike.main --exp=" in blocks[0], blocks[0]
  assert INSTALL.match(blocks[1]) and "python -m pytest -q tests" in blocks[1], blocks[1]
  assert text.index(blocks[0]) < text.index("## ")  # before the first section


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def test_links_between_pages_resolve():
  link = re.compile(r"\]\(([^)\s]+)\)")
  for page in PAGES:
    text = page.read_text()
    for target in link.findall(text):
      if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
        continue
      path, _, anchor = target.partition("#")
      dest = (page.parent / path).resolve() if path else page
      assert dest.exists(), f"{_name(page)} links to {target}, which does not exist"
      if anchor and dest.suffix == ".md":
        headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
        assert anchor in {_slug(h) for h in headings}, (
            f"{_name(page)} links to {target}: {_name(dest)} has no heading #{anchor}")


def test_every_docs_page_is_in_the_readmes_contents():
  readme = (REPO_ROOT / "README.md").read_text()
  for page in PAGES[1:]:
    assert f"({_name(page)})" in readme or f"({_name(page)}#" in readme, (
        f"README.md does not link {_name(page)}")


# ------------------------------------------------------------ stand-ins


def write_tiny_flan_t5(directory: str) -> None:
  """What `hf download google/flan-t5-small` gives, at FlanT5Tiny's size: config.json,
  model.safetensors (random weights), tokenizer.json (a unigram model trained here, with
  T5's <pad> 0, </s> 1, <unk> 2) and its special_tokens_map.json / tokenizer_config.json."""
  import json

  import jax
  import numpy as np
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  from paxlike import config, experiment, mesh, registry, trainer
  from paxlike.interop import hf
  from paxlike.partitioning import SpmdPartitioner

  exp = experiment.instantiate(registry.get("FlanT5Tiny"), [])
  task = config.build(exp.task())
  inp = config.build(exp.datasets()[0])
  inp.bind_host(1, 0)
  program = trainer.build_train_program(
      task, inp, SpmdPartitioner(mesh.build(exp.ICI_MESH_SHAPE, None)))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: (rng.standard_normal(a.shape) * 0.05).astype(np.float32),
                        program.abstract.params)
  hf.export_params(params, task.model, directory)
  tok = Tokenizer(models.Unigram())
  tok.pre_tokenizer = pre_tokenizers.Metaspace()
  tok.decoder = decoders.Metaspace()
  # The README's made-up task, so that its prompts tokenize without unknown pieces.
  corpus = [f"What is {a} plus {b}? {a + b}" for a in range(100) for b in range(0, 100, 3)]
  tok.train_from_iterator(corpus, trainers.UnigramTrainer(
      vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
  tok.save(os.path.join(directory, "tokenizer.json"))
  special = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
  for name, content in (("special_tokens_map.json", special),
                        ("tokenizer_config.json", {**special, "model_max_length": 512})):
    with open(os.path.join(directory, name), "w") as f:
      json.dump(content, f, indent=2)


if __name__ == "__main__":
  if sys.argv[1:2] == ["tiny-flan-t5"] and len(sys.argv) == 3:
    write_tiny_flan_t5(sys.argv[2])
  else:
    sys.exit("usage: python tests/docs_test.py tiny-flan-t5 DIR")
