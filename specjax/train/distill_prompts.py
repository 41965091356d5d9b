"""The prompts self-distillation generates from: corpus windows, template requests, your files.

    prompts = corpus_prompts(["chitchat", "python"], tok, num_prompts=1024, min_tokens=32,
                             max_tokens=64)   # Prompts(ids, sources, texts, skipped)

``corpus_prompts`` cuts prompts from the corpora (``corpora.py``): chitchat gives a
conversation's turns from a random point, ending on a user turn; the other corpora give a
window of ``min_tokens .. max_tokens`` tokens starting at a random line, wrapped in a short
instruction (``INSTRUCTIONS``) when ``chat`` is on. ``request_prompts`` gives assistant requests
made from templates instead (no corpus text: advice, explanations, stories, letters), for
replies of the kind a chat model is asked for; ``file_prompts`` takes the user turns of your
own conversation files. ``distill.self_distill`` generates the target's replies to them.
"""

import dataclasses
import itertools
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specjax.train import conversations, corpora, data
from specjax.train.prompt_templates import INSTRUCTIONS, REQUEST_SETS, TASKS

PROMPT_TURNS = ("first", "all")  # which user turns of your files become prompts
_MIN_QUESTION_WORDS = 4  # a chitchat question shorter than this is a greeting, not a task
_TURN_MARKUP_TOKENS = 5  # ChatML's "<|im_start|>role\n ... <|im_end|>\n" around each turn.
_WINDOW_CHARS_PER_TOKEN = 8  # Characters read per wanted token: enough for any corpus here.


@dataclasses.dataclass(frozen=True)
class Prompts:
  ids: list[list[int]]  # token ids, ready for generate
  sources: list[str]  # the corpus each prompt was cut from
  texts: list[str]  # the prompt text as the tokenizer saw it
  skipped: int = 0  # prompts left out (longer than allowed)


def corpus_prompts(
  sources: Sequence[str],
  tokenizer,
  *,
  num_prompts: int,
  min_tokens: int,
  max_tokens: int,
  seed: int = 0,
  chat: bool = True,
  tasks: bool = False,
) -> Prompts:
  """``num_prompts`` prompts, round-robin over the corpora ``sources``; deterministic in seed.

  Lengths count the corpus text (chat mode adds the template and the instruction around it).
  ``tasks``: each window is wrapped in one of its corpus's ``TASKS`` (drawn per prompt), and
  chitchat gives one user question (at least ``_MIN_QUESTION_WORDS`` words, at most
  ``max_tokens`` tokens), whole, instead of a conversation.
  """
  if not sources:
    raise ValueError(
      "sources is empty: name at least one corpus (" + ", ".join(corpora.CORPORA) + ")."
    )
  for s in sources:
    corpora.corpus_path(s)  # Unknown or missing corpora fail here, before any reading.
  if num_prompts < 1:
    raise ValueError(f"num_prompts must be >= 1, got {num_prompts}.")
  if not 1 <= min_tokens <= max_tokens:
    raise ValueError(
      f"prompt lengths need 1 <= min_tokens <= max_tokens, got {min_tokens} and {max_tokens}."
    )
  if chat and getattr(tokenizer, "apply_chat_template", None) is None:
    raise ValueError("chat=True needs a tokenizer with a chat template; set chat=False.")
  if tasks and not chat:
    raise ValueError("tasks=True writes user messages: it needs chat=True.")
  makers = {s: _PromptMaker(s, tokenizer, seed, min_tokens, max_tokens, chat, tasks)
            for s in sources}  # fmt: skip
  out = Prompts([], [], [])
  for i in range(num_prompts):
    source = sources[i % len(sources)]
    text = makers[source].next()
    out.ids.append(list(tokenizer.encode(text)))
    out.sources.append(source)
    out.texts.append(text)
  return out


class _PromptMaker:
  """Cuts prompts from one corpus: documents in a seeded order, cycled."""

  def __init__(self, name, tokenizer, seed, lo, hi, chat, tasks=False):
    self.name, self.tok, self.lo, self.hi, self.chat = name, tokenizer, lo, hi, chat
    self.tasks = tasks
    self.rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name == "chitchat" and tasks:
      self.docs = _questions(corpora.chat_conversations())
    elif name == "chitchat" and chat:
      self.docs = list(corpora.chat_conversations())
    else:
      template = getattr(tokenizer, "apply_chat_template", None)
      render = (lambda m: template(m, add_generation_prompt=False)) if template else None
      self.docs = list(corpora.corpus_documents(name, chat_template=render))
    self.order = self.rng.permutation(len(self.docs))
    self.i = 0

  def next(self) -> str:
    for _ in range(len(self.docs)):
      doc = self.docs[self.order[self.i % len(self.docs)]]
      self.i += 1
      if self.name == "chitchat" and self.tasks:  # a question of at most hi tokens, whole
        if len(data.encode_batch(self.tok, [doc])[0]) <= self.hi:
          return self.tok.apply_chat_template([{"role": "user", "content": doc}])
        continue
      n = int(self.rng.integers(self.lo, self.hi + 1))
      text = self._conversation(doc, n) if isinstance(doc, list) else self._window(doc, n)
      if text is not None:
        return text
    raise ValueError(
      f"corpus {self.name!r} has no document of >= {self.lo} tokens: lower min_tokens."
    )

  def _window(self, doc: str, n: int) -> str | None:
    start = int(self.rng.integers(0, len(doc)))
    start = doc.find("\n", start) + 1  # From a line start; 0 if no newline follows.
    window = doc[start : start + _WINDOW_CHARS_PER_TOKEN * n].lstrip("\n")
    ids = data.encode_batch(self.tok, [window])[0]
    if len(ids) < self.lo:
      ids = data.encode_batch(self.tok, [doc[: _WINDOW_CHARS_PER_TOKEN * n]])[0]
      if len(ids) < self.lo:
        return None
    text = self.tok.decode(ids[:n])
    if not self.chat:
      return text
    if self.tasks:  # drawn only here, so plain prompts keep their seeded stream
      wrapper = TASKS[self.name][int(self.rng.integers(len(TASKS[self.name])))]
    else:
      wrapper = INSTRUCTIONS[self.name]
    user = wrapper.format(text=text)
    return self.tok.apply_chat_template([{"role": "user", "content": user}])

  def _conversation(self, turns: list[dict], n: int) -> str:
    """Turns from a random start (relabelled to begin with the user) within ``n`` tokens,
    counting each turn's ChatML markup; a first turn longer than that is cut."""
    start = int(self.rng.integers(0, len(turns)))
    messages, used = [], 0
    for j, turn in enumerate(turns[start:]):
      ids = data.encode_batch(self.tok, [turn["content"]])[0]
      cost = len(ids) + _TURN_MARKUP_TOKENS
      if messages and used + cost > n:
        break
      content = turn["content"] if len(ids) <= n else self.tok.decode(ids[:n])
      messages.append({"role": ("user", "assistant")[j % 2], "content": content})
      used += cost
    if messages[-1]["role"] == "assistant":
      messages.pop()  # The target answers a user turn.
    return self.tok.apply_chat_template(messages)


def _questions(conversations) -> list[str]:
  """Every distinct turn of the conversations that ends in a question mark and has at least
  ``_MIN_QUESTION_WORDS`` words, in first-seen order."""
  seen = {}
  for turns in conversations:
    for turn in turns:
      text = turn["content"].strip()
      if text.endswith("?") and len(text.split()) >= _MIN_QUESTION_WORDS:
        seen.setdefault(text, None)
  return list(seen)


def _slots(template: str) -> list[str]:
  """The slot names of a request template, in order."""
  return re.findall(r"{(\w+)}", template)


def request_set(name: str) -> tuple[tuple[str, ...], dict]:
  """The templates and slots of the request set ``name`` (a key of ``REQUEST_SETS``)."""
  if name not in REQUEST_SETS:
    raise ValueError(f"request set {name!r} is not one of {', '.join(REQUEST_SETS)}.")
  return REQUEST_SETS[name]


def all_requests(name: str = "basic") -> set[str]:
  """Every request the set's templates make: each template with every combination of its
  slots."""
  templates, slots = request_set(name)
  out = set()
  for template in templates:
    keys = _slots(template)
    for values in itertools.product(*(slots[k] for k in keys)):
      out.add(template.format(**dict(zip(keys, values, strict=True))))
  return out


def request_prompts(tokenizer, *, num_prompts: int, seed: int = 0, name: str = "basic") -> Prompts:
  """``num_prompts`` distinct assistant requests (the templates of request set ``name`` with
  their slots filled at random), chat-templated; deterministic in seed. Their source is
  ``"requests"``."""
  templates, slot_values = request_set(name)
  distinct = len(all_requests(name))
  if not 1 <= num_prompts <= distinct:
    raise ValueError(
      f"num_prompts={num_prompts}: the {name!r} templates make {distinct} distinct requests; "
      f"ask for 1 to {distinct}, or use a larger set of REQUEST_SETS."
    )
  if getattr(tokenizer, "apply_chat_template", None) is None:
    raise ValueError(
      "request prompts are user messages: they need a tokenizer with a chat template."
    )
  rng = np.random.default_rng([seed, zlib.crc32(b"requests")])
  slots = [_slots(t) for t in templates]
  out, seen = Prompts([], [], []), set()
  while len(out.ids) < num_prompts:  # Templates drawn uniformly, then their slots.
    i = int(rng.integers(len(templates)))
    fill = {k: slot_values[k][int(rng.integers(len(slot_values[k])))] for k in slots[i]}
    request = templates[i].format(**fill)
    if request in seen:
      continue
    seen.add(request)
    text = tokenizer.apply_chat_template([{"role": "user", "content": request}])
    out.ids.append(list(tokenizer.encode(text)))
    out.sources.append("requests")
    out.texts.append(text)
  return out


def file_prompts(
  files: Sequence[str],
  tokenizer,
  *,
  fmt: str,
  num_prompts: int = 0,
  turns: str = "first",
  max_tokens: int = 0,
  seed: int = 0,
  chat: bool = True,
  on_error: str = "stop",
) -> Prompts:
  """Prompts from your own files (``conversations.FORMATS``): each record's user turns
  (``turns="first"``: the conversation up to its first user turn; ``"all"``: up to each user
  turn, the file's own earlier replies as context; a text is one user turn), rendered with the
  chat template and its generation prompt (``chat=False``: the user turn's text alone).

  Records are taken in a seeded order until ``num_prompts`` prompts (0: every record, in file
  order). Prompts longer than ``max_tokens`` (0: no limit) are left out and counted in
  ``Prompts.sources`` as nothing: the caller reports ``skipped``. Deterministic in its
  arguments, so a rerun resumes the same plan."""
  if turns not in PROMPT_TURNS:
    raise ValueError(
      f"config.distill.turns={turns!r} is not a choice: first (the first user turn of each "
      "conversation) or all (every user turn, with the conversation before it)."
    )
  if num_prompts < 0:
    raise ValueError(f"config.distill.num_prompts must be >= 0 (0 = all), got {num_prompts}.")
  field = "config.distill.prompts_from"
  paths = conversations.expand(files, field=field)
  index = conversations.scan(
    paths, fmt, on_error=on_error, field="config.distill", files_field=field
  )
  reader = conversations.Reader(index, fmt)
  order = np.arange(len(index))
  if num_prompts:
    order = np.random.default_rng([seed, zlib.crc32(b"prompts_from")]).permutation(len(index))
  out, skipped = Prompts([], [], []), 0
  for i in order:
    record = reader[int(i)]
    for messages in conversations.user_prompts(record, turns):
      text = tokenizer.apply_chat_template(messages) if chat else messages[-1]["content"]
      ids = list(tokenizer.encode(text))
      if max_tokens and len(ids) > max_tokens:
        skipped += 1
        continue
      out.ids.append(ids)
      out.texts.append(text)
      out.sources.append(Path(index.paths[index.file[i]]).name)
      if len(out.ids) == num_prompts:
        return dataclasses.replace(out, skipped=skipped)
  if not out.ids:
    raise ValueError(
      f"{field}: none of the {len(index)} usable record(s) gives a prompt of at most "
      f"{max_tokens} tokens: raise config.max_len or lower config.max_new_tokens."
    )
  return dataclasses.replace(out, skipped=skipped)
