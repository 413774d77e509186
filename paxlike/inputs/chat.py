"""Chat rows ({"messages": [...]}) rendered with a checkpoint's chat template.

A Hugging Face checkpoint directory holds the template in
`chat_template.jinja` (what transformers 4.5x and later save) or in its
`tokenizer_config.json` (`chat_template`, a Jinja string, or a list of named
templates of which "default" is used); `tokenizer_config.json` also holds
the `bos_token` / `eos_token` strings it refers to. Rendering follows
transformers' `apply_chat_template`: a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the variables `messages`, `bos_token`,
`eos_token` and `add_generation_prompt`, and the helper `raise_exception`.

For training, a conversation is cut into pieces: everything up to an
assistant turn (the template's rendering of the turns before it with the
generation prompt) carries no loss, and the assistant turn (what the
rendering of one more turn adds) carries it. A conversation that ends on a
user's turn ends with the generation prompt: `--mode=infer` decodes the
assistant's reply to it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from paxlike.errors import UserError

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


def _token_text(value: Any) -> str:
  """A special token in tokenizer_config.json: a string or {"content": ...}."""
  if isinstance(value, dict):
    return str(value.get("content", ""))
  return "" if value is None else str(value)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A chat template and the special-token strings it renders."""

  source: str
  template: str
  bos_token: str = ""
  eos_token: str = ""

  @functools.cached_property
  def _compiled(self) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
      raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
      return env.from_string(self.template)
    except TemplateError as e:
      raise UserError(f"the chat template of {self.source} does not parse ({e}).") from None

  def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """The conversation as the template writes it."""
    from jinja2 import TemplateError

    try:
      return self._compiled.render(messages=messages, bos_token=self.bos_token,
                                   eos_token=self.eos_token,
                                   add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
      raise UserError(f"the chat template of {self.source} refused a conversation ({e}).") \
          from None

  def pieces(self, messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """(text, is_assistant) pieces whose concatenation is the rendered conversation.

    Raises:
      UserError: the template does not render a conversation's turns one
        after another (an assistant turn's rendering changes what came before).
    """
    out: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
      if message.get("role") != "assistant":
        continue
      before = self.render(messages[:i], add_generation_prompt=True)
      upto = self.render(messages[:i + 1])
      if not (before.startswith(done) and upto.startswith(before)):
        raise UserError(f"the chat template of {self.source} does not render turns one "
                        "after another, so the assistant turns cannot be told apart; "
                        "write prompt/completion rows instead.")
      out += [(before[len(done):], False), (upto[len(before):], True)]
      done = upto
    # A conversation that ends on another's turn asks for the assistant's reply (infer):
    # it ends with the generation prompt, as transformers users render it to generate.
    asks = bool(messages) and not ends_on_reply(messages)
    full = self.render(messages, add_generation_prompt=asks)
    if not full.startswith(done):
      raise UserError(f"the chat template of {self.source} renders a whole conversation "
                      "differently from its turns; write prompt/completion rows instead.")
    out.append((full[len(done):], False))
    return [(text, weighted) for text, weighted in out if text]


def messages_problem(messages: Any) -> str | None:
  """What keeps a row's 'messages' from being a conversation (None: nothing)."""
  if not isinstance(messages, list):
    return f"'messages' is {type(messages).__name__}, not a list"
  if not messages:
    return "'messages' is empty"
  for n, message in enumerate(messages, 1):
    if not isinstance(message, dict):
      return f"message {n} is {type(message).__name__}, not an object"
    if not isinstance(message.get("role"), str):
      return f"message {n} has no 'role' string"
    if not isinstance(message.get("content"), str):
      return f"message {n} ({message['role']}) has no 'content' string"
  return None


def ends_on_reply(messages: list[Any]) -> bool:
  """Whether a conversation's last turn is the assistant's (one to decode against), rather
  than one that asks for a reply."""
  return bool(messages) and isinstance(messages[-1], dict) \
      and messages[-1].get("role") == "assistant"


@functools.lru_cache(maxsize=8)
def has_template(directory: str) -> bool:
  """Whether directory holds a chat template's files (tokenizer_config.json or the .jinja)."""
  return bool(directory) and any(os.path.isfile(os.path.join(directory, f))
                                 for f in (CONFIG_FILE, TEMPLATE_FILE))


def load(directory: str) -> ChatTemplate:
  """The chat template of a Hugging Face checkpoint directory.

  Raises:
    UserError: no tokenizer_config.json, or one without a chat_template.
  """
  path = os.path.join(directory, CONFIG_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except FileNotFoundError:
    raise UserError(f"chat rows need a chat template, but {directory} has no {CONFIG_FILE}; "
                    "point INIT_FROM or VOCABULARY at the Hugging Face checkpoint "
                    "directory.") from None
  except (OSError, json.JSONDecodeError) as e:
    raise UserError(f"cannot read {path} ({e}).") from None
  template = config.get("chat_template")
  if isinstance(template, list):  # named templates: transformers uses "default"
    template = {t.get("name"): t.get("template") for t in template}.get("default")
  jinja = os.path.join(directory, TEMPLATE_FILE)
  if os.path.isfile(jinja):  # transformers reads it before tokenizer_config.json's
    with open(jinja, encoding="utf-8") as f:
      template, path = f.read(), jinja
  if not isinstance(template, str) or not template:
    raise UserError(f"{directory} has no chat template ({TEMPLATE_FILE}, or chat_template in "
                    f"{CONFIG_FILE}); chat rows need one (or write prompt/completion rows).")
  return ChatTemplate(path, template, _token_text(config.get("bos_token")),
                      _token_text(config.get("eos_token")))
