"""Self-distillation: the target writes its own continuations of corpus prompts, saved as shards.

    prompts = corpus_prompts(["chitchat", "python"], tok, num_prompts=1024, min_tokens=32,
                             max_tokens=64)
    self_distill(params, cfg, prompts.ids, "data/self_distill/smollm2", max_new_tokens=128,
                 max_len=256, batch_size=32, shard_size=256, temperature=1.0,
                 eos_id=tok.stop_ids, sources=prompts.sources)

``request_prompts`` gives assistant requests made from templates instead (no corpus text:
advice, explanations, stories, letters), for replies of the kind a chat model is asked for.

A drafter is scored by how often the target accepts its tokens, so it learns best from the
target's own output distribution. Prompts are cut from the corpora (``data.py``): chitchat gives
a conversation's turns from a random point, ending on a user turn; the other corpora give a
window of ``min_tokens .. max_tokens`` tokens starting at a random line, wrapped in a short
instruction (``INSTRUCTIONS``) when ``chat`` is on. Generation is ``specjax.decode.generate``,
batch by batch (the last batch is filled by repeating prompts; the extra rows are dropped),
with seed ``seed + batch index``, so a shard is the same whether written in one run or after a
restart.

Directory layout (read back by ``data.read_shards`` / ``data.load_dataset``):

    plan.json          what is being generated (written first; a rerun with the same plan
                       resumes, skipping finished shards)
    shard-00000.npz    tokens [n, max_len] int32: prompt then continuation, 0-padded
                       mask [n, max_len] float32: 1 at positions whose next token was generated
                       lengths [n], prompt_lengths [n] int32; source [n] int32 (index into the
                       manifest's "sources")
                       optional hidden_final [n, max_len, D] and hidden_layers [n, C, max_len, D]
                       (float16): the target's states on the finished sequence, 0 past the length
    manifest.json      written last: a directory without it is never read as complete

Every file is written to a temp name and renamed.
"""

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from specjax import results, sampling
from specjax.decode import check_prompts, generate
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.train import conversations, data
from specjax.train.prompt_templates import INSTRUCTIONS, REQUEST_SETS, TASKS

PLAN = "plan.json"
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
      "sources is empty: name at least one corpus (" + ", ".join(data.CORPORA) + ")."
    )
  for s in sources:
    data.corpus_path(s)  # Unknown or missing corpora fail here, before any reading.
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
      self.docs = _questions(data.chat_conversations())
    elif name == "chitchat" and chat:
      self.docs = list(data.chat_conversations())
    else:
      template = getattr(tokenizer, "apply_chat_template", None)
      render = (lambda m: template(m, add_generation_prompt=False)) if template else None
      self.docs = list(data.corpus_documents(name, chat_template=render))
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


# -- generation -----------------------------------------------------------------------------------


def self_distill(
  params,
  cfg: ModelConfig,
  prompts: Sequence[Sequence[int]],
  out_dir,
  *,
  max_new_tokens: int,
  max_len: int,
  batch_size: int,
  shard_size: int,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int = 0,
  eos_id=None,
  sources: Sequence[str] | None = None,
  capture_layers: Sequence[int] = (),
  capture_final: bool = False,
  tokenizer_fingerprint: str | None = None,
  metadata: dict | None = None,
  progress: bool = True,
) -> dict:
  """Generates the target's continuations of ``prompts`` into shards under ``out_dir``.

  Returns the manifest. Everything is checked before anything is compiled; an unfinished
  directory with the same plan is resumed, any other existing content is refused.
  """
  out_dir = Path(out_dir)
  prompts = [list(map(int, p)) for p in prompts]
  capture_layers = tuple(int(i) for i in capture_layers)
  sources = list(sources) if sources is not None else ["prompts"] * len(prompts)
  _check(cfg, prompts, sources, max_new_tokens, max_len, batch_size, shard_size, capture_layers)
  sampling.validate(temperature, top_k, top_p)
  names = sorted(set(sources))
  eos_id = None if eos_id is None else int(eos_id) if isinstance(eos_id, int) else sorted(eos_id)
  settings = {
    "model": cfg.name,
    "tokenizer_fingerprint": tokenizer_fingerprint,
    "max_new_tokens": max_new_tokens,
    "max_len": max_len,
    "batch_size": batch_size,
    "shard_size": shard_size,
    "temperature": float(temperature),
    "top_k": top_k,
    "top_p": float(top_p),
    "seed": seed,
    "eos_id": eos_id,
    "capture_layers": list(capture_layers),
    "capture_final": capture_final,
  }
  digest = hashlib.sha256(json.dumps([prompts, sources, settings]).encode()).hexdigest()
  shard_files = _start(out_dir, {"digest": digest, "num_examples": len(prompts), **settings})

  keys = ("max_new_tokens", "max_len", "temperature", "top_k", "top_p", "eos_id")
  gen_kwargs = {k: settings[k] for k in keys}
  shards, new_tokens, seconds, resumed, batch_seconds = [], 0, 0.0, 0, []
  bar = tqdm(total=len(prompts), unit="ex", desc=f"self-distill -> {out_dir}", disable=not progress)
  for s, path in enumerate(shard_files):
    lo = s * shard_size
    rows = prompts[lo : lo + shard_size]
    shards.append({"file": path.name, "examples": len(rows)})
    if path.is_file():  # Finished by an earlier run with the same plan, unless damaged.
      damage = shard_damage(path, len(rows))
      if damage is None:
        resumed += 1
        bar.update(len(rows))
        continue
      tqdm.write(f"{path} is damaged ({damage}): generating it again")
      path.unlink()
    t0 = time.perf_counter()
    continuations = []
    for j in range(0, len(rows), batch_size):
      batch = rows[j : j + batch_size]
      padded = batch + [batch[i % len(batch)] for i in range(batch_size - len(batch))]
      tb = time.perf_counter()
      out = generate(params, cfg, padded, seed=seed + (lo + j) // batch_size, **gen_kwargs)
      batch_seconds.append(time.perf_counter() - tb)
      continuations += out.tokens[: len(batch)]
      new_tokens += sum(len(c) for c in out.tokens[: len(batch)])
      bar.update(len(batch))
      bar.set_postfix(tok_s=f"{new_tokens / (seconds + time.perf_counter() - t0):.0f}")
    arrays = _examples(rows, continuations, max_len)
    arrays["source"] = np.array([names.index(x) for x in sources[lo : lo + len(rows)]], np.int32)
    if capture_final or capture_layers:
      arrays |= _hidden_states(params, cfg, arrays, capture_layers, capture_final, batch_size)
    _save_npz(path, arrays)
    seconds += time.perf_counter() - t0
  bar.close()

  manifest = {
    "format": data.SHARD_FORMAT,
    **settings,
    "num_examples": len(prompts),
    "sources": names,
    "shards": shards,
    # The target's fingerprint: training checks it (another vocabulary or tokenizer is refused).
    "target": {
      "name": cfg.name,
      "vocab_size": cfg.vocab_size,
      "tokenizer_fingerprint": tokenizer_fingerprint,
    },
    "hidden": {
      "final": capture_final,
      "layers": list(capture_layers),
      "dim": cfg.dim,
      "dtype": "float16",
    },
    "stats": {
      "new_tokens_this_run": new_tokens,
      "seconds_this_run": seconds,
      "tokens_per_s": new_tokens / seconds if seconds else None,
      "shards_resumed": resumed,
      "batch_seconds": batch_seconds,  # the first includes compilation
    },
    "metadata": metadata or {},
  }
  results.write_json(out_dir / data.MANIFEST, manifest)
  return manifest


def _check(cfg, prompts, sources, max_new_tokens, max_len, batch_size, shard_size, capture_layers):
  if not prompts:
    raise ValueError("prompts is empty: give at least one prompt (a list of token ids).")
  if len(sources) != len(prompts):
    raise ValueError(f"sources has {len(sources)} labels for {len(prompts)} prompts.")
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if shard_size < 1 or shard_size % batch_size:
    raise ValueError(
      f"shard_size={shard_size} must be a positive multiple of batch_size={batch_size}."
    )
  check_prompts(prompts, [max_new_tokens] * len(prompts), max_len, cfg.vocab_size)
  bad = [i for i in capture_layers if not 0 <= i < cfg.num_layers]
  if bad:
    raise ValueError(f"capture_layers {bad} are outside [0, {cfg.num_layers}) for {cfg.name!r}.")


def _start(out_dir: Path, plan: dict) -> list[Path]:
  """Checks ``out_dir`` and writes the plan; returns the shard paths."""
  if (out_dir / data.MANIFEST).exists():
    raise ValueError(
      f"{out_dir} already holds a finished self-distillation ({data.MANIFEST}); choose another "
      "output directory or delete it."
    )
  n = -(-plan["num_examples"] // plan["shard_size"])
  files = [out_dir / f"shard-{i:05d}.npz" for i in range(n)]
  plan_path = out_dir / PLAN
  if plan_path.is_file():
    if json.loads(plan_path.read_text()) != plan:
      raise ValueError(
        f"{out_dir} holds an unfinished self-distillation with other prompts or settings; "
        "delete it or choose another output directory."
      )
    for tmp in out_dir.glob(".shard-*.tmp"):  # Left by an interrupted write.
      tmp.unlink()
  elif out_dir.exists() and any(out_dir.iterdir()):
    raise ValueError(f"{out_dir} is not empty; choose a new or empty output directory.")
  else:
    results.write_json(plan_path, plan)
  return files


def _examples(prompts, continuations, max_len) -> dict[str, np.ndarray]:
  n = len(prompts)
  tokens = np.zeros((n, max_len), np.int32)
  mask = np.zeros((n, max_len), np.float32)
  lengths = np.zeros(n, np.int32)
  prompt_lengths = np.zeros(n, np.int32)
  for r, (p, c) in enumerate(zip(prompts, continuations, strict=True)):
    seq = p + c
    tokens[r, : len(seq)] = seq
    mask[r, len(p) - 1 : len(seq) - 1] = 1.0  # Positions whose next token was generated.
    lengths[r], prompt_lengths[r] = len(seq), len(p)
  return {"tokens": tokens, "mask": mask, "lengths": lengths, "prompt_lengths": prompt_lengths}


@functools.partial(jax.jit, static_argnames=("cfg", "capture_layers"))
def _forward_hidden(params, tokens_BxS, *, cfg, capture_layers):
  # The logits are unused, so XLA drops the LM head.
  _, (final, *layers) = llama.logits_of(params, cfg, tokens_BxS, (llama.FINAL, *capture_layers))
  return final.astype(jnp.float16), tuple(h.astype(jnp.float16) for h in layers)


def _hidden_states(params, cfg, arrays, capture_layers, capture_final, batch_size):
  """Teacher-forced target states over each finished sequence, 0 past its length."""
  tokens = arrays["tokens"]
  n, s = tokens.shape
  finals, layers = [], []
  for i in range(0, n, batch_size):
    chunk = tokens[i : i + batch_size]
    padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk), s), np.int32)])
    final, per_layer = _forward_hidden(params, padded, cfg=cfg, capture_layers=capture_layers)
    finals.append(np.asarray(final)[: len(chunk)])
    if capture_layers:
      layers.append(np.stack([np.asarray(h)[: len(chunk)] for h in per_layer], axis=1))
  valid_NxS = np.arange(s)[None, :] < arrays["lengths"][:, None]
  out = {}
  if capture_final:
    out["hidden_final"] = np.where(valid_NxS[..., None], np.concatenate(finals), 0)
  if capture_layers:
    out["hidden_layers"] = np.where(valid_NxS[:, None, :, None], np.concatenate(layers), 0)
  return {k: v.astype(np.float16) for k, v in out.items()}


def shard_damage(path: Path, examples: int) -> str | None:
  """Why a finished shard cannot be trusted (unreadable, or not ``examples`` rows), or None.
  Reads every array, so a zip member whose data was damaged fails its CRC here."""
  try:
    with np.load(path) as f:
      arrays = {k: f[k] for k in f.files}
  except Exception as e:  # BadZipFile, EOFError, zlib/CRC errors, ...
    return f"{type(e).__name__}: {e}"
  if "tokens" not in arrays or len(arrays["tokens"]) != examples:
    return f"it holds {len(arrays.get('tokens', ()))} examples, not {examples}"
  return None


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
  """``np.savez`` to a temp file in the same directory, synced to disk, then an atomic rename
  (a crash never leaves a renamed shard whose data is still in the page cache only)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
