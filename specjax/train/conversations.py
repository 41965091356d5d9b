"""Your own data files: ShareGPT, OpenAI-style messages or plain text, read one record at a time.

    index = scan(expand(["chats/*.jsonl"]), "sharegpt", on_error="skip")  # usable records
    reader = Reader(index, "sharegpt")
    tokens, target = render(reader[0], tokenizer)        # int32 [L], bool [L]

Formats (``FORMATS``), one record per JSONL line or per element of a top-level JSON array:

    sharegpt   {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", ...}]}
    messages   {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", ...}]}
    text       {"text": "Any document."}

``scan`` reads each file once, record by record (never whole), checks every record's shape and
keeps where the usable ones start (byte offset, length, line): 20 bytes a record. A record that
is not JSON, or not of the format, is a problem: ``on_error="stop"`` raises naming the file and
line; ``"skip"`` counts it and keeps the first few for the report. Record k of all the files (in
the order given, globs sorted) belongs to process ``k % process_count``: a process checks and
reads only its own.

``render`` gives a record as the target reads it: a conversation through the tokenizer's own
chat template, with ``target`` true on the assistant's tokens only (each reply and the
template's end-of-turn after it); a text with every token after the first a target. The
template is rendered prefix by prefix (up to each assistant turn with the generation prompt,
then through the turn), and each piece is tokenized on its own, so the tokens before a reply
are exactly what the model is prompted with at inference and the mask needs no guessing.
"""

import codecs
import dataclasses
import glob
import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

FORMATS = ("sharegpt", "messages", "text")
ON_ERROR = ("stop", "skip")
SHAREGPT_ROLES = {
  "human": "user",
  "user": "user",
  "gpt": "assistant",
  "assistant": "assistant",
  "chatgpt": "assistant",
  "bard": "assistant",
  "bing": "assistant",
  "system": "system",
}
MESSAGE_ROLES = ("system", "user", "assistant")
REPORTED = 5  # problems kept (with their file and line) for the report
_CHUNK = 1 << 20  # bytes read at a time from a JSON array
_MAX_RECORD = 1 << 26  # a JSON array element longer than this is called malformed
_SPACE = re.compile(r"\s*")


class BadRecord(ValueError):
  """A record that is not usable; the message says why."""


def expand(patterns: Sequence[str], field: str = "config.data.files") -> list[Path]:
  """The files ``patterns`` (paths or globs) name, in the order given (each glob sorted)."""
  if isinstance(patterns, str):
    patterns = [patterns]
  if not patterns:
    raise ValueError(f"{field} is empty: give JSON/JSONL paths or globs.")
  out = []
  for p in patterns:
    hits = sorted(glob.glob(str(p), recursive=True)) if glob.has_magic(str(p)) else [str(p)]
    files = [Path(h) for h in hits if Path(h).is_file()]
    if not files:
      raise ValueError(
        f"{field} has {str(p)!r}, which matches no file: give existing JSON/JSONL paths or globs."
      )
    out += [f for f in files if f not in out]
  return out


def check_format(fmt: str, field: str = "config.data.format") -> None:
  if fmt not in FORMATS:
    raise ValueError(
      f"{field}={fmt!r} is not a format: choose one of {', '.join(FORMATS)} "
      "(sharegpt: 'conversations' with 'from'/'value'; messages: 'messages' with "
      "'role'/'content'; text: 'text')."
    )


# -- records --------------------------------------------------------------------------------------


def parse(obj, fmt: str):
  """A record of format ``fmt``: a list of ``{"role", "content"}`` messages, or a text."""
  if not isinstance(obj, dict):
    raise BadRecord(f"a record is a JSON object, got {type(obj).__name__}")
  if fmt == "text":
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
      raise BadRecord("no 'text' string" if not isinstance(text, str) else "'text' is empty")
    return text
  key = "conversations" if fmt == "sharegpt" else "messages"
  turns = obj.get(key)
  if not isinstance(turns, list) or not turns:
    raise BadRecord(f"no '{key}' list" if not isinstance(turns, list) else f"'{key}' is empty")
  messages = []
  for i, turn in enumerate(turns):
    if not isinstance(turn, dict):
      raise BadRecord(f"{key}[{i}] is not an object")
    if fmt == "sharegpt":
      who, content = turn.get("from"), turn.get("value")
      role = SHAREGPT_ROLES.get(who)
      if role is None:
        raise BadRecord(f"{key}[{i}] has 'from': {who!r}; known: {', '.join(SHAREGPT_ROLES)}")
    else:
      role, content = turn.get("role"), _content(turn.get("content"))
      if role not in MESSAGE_ROLES:
        raise BadRecord(f"{key}[{i}] has 'role': {role!r}; known: {', '.join(MESSAGE_ROLES)}")
    if not isinstance(content, str):
      raise BadRecord(f"{key}[{i}] has no text content")
    messages.append({"role": role, "content": content})
  first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
  if first is None or messages[first]["role"] != "user":
    raise BadRecord("the first turn after any system message is not the user's")
  last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
  if last is None:
    raise BadRecord("no assistant turn: nothing to learn")
  return messages[: last + 1]  # turns after the last reply would add tokens and no loss


def _content(content):
  """OpenAI content: a string, or a list of parts whose text parts are joined."""
  if isinstance(content, list) and all(isinstance(p, dict) for p in content):
    texts = [p.get("text") for p in content if p.get("type") == "text"]
    if texts and all(isinstance(t, str) for t in texts):
      return "".join(texts)
  return content


def user_prompts(record, turns: str = "first") -> list[list[dict]]:
  """The prompts a conversation holds: the messages up to its first user turn (``"first"``), or
  up to each user turn, with the file's own earlier replies as context (``"all"``). A text is
  one user turn."""
  if isinstance(record, str):
    return [[{"role": "user", "content": record}]]
  ends = [i + 1 for i, m in enumerate(record) if m["role"] == "user"]
  return [record[:e] for e in (ends[:1] if turns == "first" else ends)]


# -- scanning -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Index:
  """Where one process's usable records are, and what was wrong with the others."""

  paths: tuple[str, ...]
  file: np.ndarray  # [n] int32: index into paths
  start: np.ndarray  # [n] int64: byte offset
  length: np.ndarray  # [n] int64: bytes
  line: np.ndarray  # [n] int64: 1-based line of the record's start
  records: int  # records of this process, usable or not
  problems: int  # of them, not usable
  first_problems: tuple[str, ...]  # "path:line: reason" of the first few

  def __len__(self) -> int:
    return len(self.start)

  def where(self, i: int) -> str:
    return f"{self.paths[self.file[i]]}:{self.line[i]}"

  def report(self) -> str:
    """One line: usable records, and the problems skipped with the first few places."""
    s = f"{len(self)} usable record(s) of {self.records}"
    if self.problems:
      s += f"; skipped {self.problems} bad record(s), first: " + "; ".join(self.first_problems)
    return s

  def take(self, keep: np.ndarray) -> "Index":
    """The records ``keep`` (indices), in that order."""
    return dataclasses.replace(
      self, file=self.file[keep], start=self.start[keep], length=self.length[keep],
      line=self.line[keep],
    )  # fmt: skip


def scan(
  paths: Sequence[Path],
  fmt: str,
  *,
  on_error: str = "stop",
  process_index: int = 0,
  process_count: int = 1,
  field: str = "config.data",
  files_field: str = "",
) -> Index:
  """Reads ``paths`` record by record and indexes this process's usable ones (module doc)."""
  check_format(fmt, f"{field}.format")
  if on_error not in ON_ERROR:
    raise ValueError(
      f"{field}.on_error={on_error!r} is not a choice: stop (the first bad record is an error "
      "naming its file and line) or skip (bad records are counted and reported)."
    )
  file, start, length, line = [], [], [], []
  records, problems, first = 0, 0, []
  k = 0
  for f, path in enumerate(paths):
    for offset, size, lineno, raw in _records(Path(path)):
      mine = k % process_count == process_index
      k += 1
      if not mine:
        continue
      records += 1
      try:
        if isinstance(raw, BadRecord):
          raise raw
        parse(raw, fmt)
      except BadRecord as e:
        if on_error == "stop":
          raise ValueError(
            f"{path}:{lineno}: {e} (format {fmt!r}). Fix the record, or set "
            f"{field}.on_error='skip' to count and skip bad records."
          ) from None
        problems += 1
        if len(first) < REPORTED:
          first.append(f"{path}:{lineno}: {e}")
        continue
      file.append(f)
      start.append(offset)
      length.append(size)
      line.append(lineno)
  index = Index(
    tuple(str(p) for p in paths),
    np.asarray(file, np.int32),
    np.asarray(start, np.int64),
    np.asarray(length, np.int64),
    np.asarray(line, np.int64),
    records,
    problems,
    tuple(first),
  )
  if not len(index):
    where = f" (process {process_index} of {process_count})" if process_count > 1 else ""
    names = ", ".join(str(p) for p in paths)
    why = ("; first problems: " + "; ".join(first)) if first else ""
    raise ValueError(
      f"{files_field or field + '.files'}: nothing usable in {names}{where}: {records} "
      f"record(s), none a {fmt!r} record{why}. Check {field}.format "
      f"({', '.join(FORMATS)}) and the files."
    )
  return index


def _records(path: Path) -> Iterator[tuple[int, int, int, object]]:
  """(byte offset, bytes, line, parsed JSON or a BadRecord) of each record of a JSONL file or a
  top-level JSON array, read in pieces."""
  with open(path, "rb") as f:
    head = f.read(4096).lstrip(codecs.BOM_UTF8).lstrip()
    f.seek(0)
    if head.startswith(b"["):
      yield from _array_records(f, path)
      return
    offset = 0
    for lineno, raw in enumerate(f, 1):
      size = len(raw)
      if raw.strip():
        yield offset, size, lineno, _loads(raw)
      offset += size


def _loads(raw: bytes):
  try:
    return json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    return BadRecord(f"not JSON ({e})")


def _array_records(f, path: Path) -> Iterator[tuple[int, int, int, object]]:
  """The elements of a top-level JSON array: decoded one at a time from a sliding buffer."""
  decoder, utf8 = json.JSONDecoder(), codecs.getincrementaldecoder("utf-8-sig")()
  text, pos, at, line, eof = "", 0, 0, 1, False  # at: the byte offset of text[pos]

  def fill():
    nonlocal text, pos, eof
    chunk = f.read(_CHUNK)
    eof = not chunk
    text, pos = text[pos:] + utf8.decode(chunk, final=eof), 0

  def advance(to):
    nonlocal pos, at, line
    piece = text[pos:to]
    at += len(piece.encode())
    line += piece.count("\n")
    pos = to

  def skip_space():
    while True:
      advance(_SPACE.match(text, pos).end())
      if pos < len(text) or eof:
        return
      fill()

  fill()
  skip_space()
  if text[pos : pos + 1] != "[":
    yield at, 0, line, BadRecord("not a JSON array")
    return
  advance(pos + 1)
  while True:
    skip_space()
    if text[pos : pos + 1] == "]":
      return
    if text[pos : pos + 1] == ",":
      advance(pos + 1)
      skip_space()
    while True:
      try:
        obj, end = decoder.raw_decode(text, pos)
        break
      except json.JSONDecodeError as e:
        if eof or len(text) - pos > _MAX_RECORD:
          # A broken array has no next element to find: the rest of the file is lost.
          yield at, 0, line, BadRecord(f"not JSON ({e})")
          return
        fill()
    start, lineno = at, line
    advance(end)
    yield start, at - start, lineno, obj


# -- reading back ---------------------------------------------------------------------------------


class Reader:
  """Record i of an Index, read from its file on demand (``len``, ``[i]``): what grain maps."""

  def __init__(self, index: Index, fmt: str):
    self.index, self.fmt = index, fmt
    self._files, self._lock = {}, threading.Lock()

  def __len__(self) -> int:
    return len(self.index)

  def __getitem__(self, i: int):
    ix = self.index
    f = int(ix.file[i])
    if f not in self._files:  # kept open for the run; pread: grain reads from several threads
      with self._lock:
        if f not in self._files:
          self._files[f] = os.open(ix.paths[f], os.O_RDONLY)
    raw = os.pread(self._files[f], int(ix.length[i]), int(ix.start[i]))
    try:
      return parse(json.loads(raw.decode("utf-8-sig")), self.fmt)
    except (ValueError, UnicodeDecodeError) as e:  # the file changed since it was scanned
      raise ValueError(
        f"{ix.where(i)} no longer holds the record scanned there ({e}): the file changed "
        "during the run. Restore it, or start the run again."
      ) from None

  def __del__(self):
    for fd in getattr(self, "_files", {}).values():
      os.close(fd)

  def __getstate__(self):
    return {"index": self.index, "fmt": self.fmt}

  def __setstate__(self, state):
    self.__init__(state["index"], state["fmt"])


# -- rendering ------------------------------------------------------------------------------------


def encode_piece(tokenizer, text: str, first: bool) -> list[int]:
  """Ids of ``text``; a bos (when the tokenizer adds one) only at the start of a record."""
  backend = getattr(tokenizer, "backend", None)
  if backend is None:
    return list(tokenizer.encode(text)) if text else []
  ids = backend.encode(text, add_special_tokens=False).ids if text else []
  if first and getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None:
    ids = [tokenizer.bos_id, *ids]
  return ids


def pieces(messages: list[dict], tokenizer) -> list[tuple[str, bool]]:
  """The rendered conversation as (text, is the assistant's) pieces, in order."""
  template = getattr(tokenizer, "apply_chat_template", None)
  if template is None:
    raise ValueError(
      "conversations are rendered with the tokenizer's chat template; this tokenizer has none "
      "(use format 'text', or a target with a tokenizer)."
    )
  full = template(messages, add_generation_prompt=False)
  out, pos = [], 0
  for k, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    head = template(messages[:k], add_generation_prompt=True)
    upto = template(messages[: k + 1], add_generation_prompt=False)
    if not (full.startswith(upto) and upto.startswith(head) and len(head) >= pos):
      raise BadRecord(
        f"the chat template does not render this conversation prefix by prefix at turn {k} "
        "(the text before the reply differs from the prompt the model would get)"
      )
    out += [(full[pos : len(head)], False), (full[len(head) : len(upto)], True)]
    pos = len(upto)
  if pos < len(full):
    out.append((full[pos:], False))
  return out


def render(record, tokenizer, sep_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32 [L], target bool [L]): the record's tokens and which of them are learned,
  followed by ``sep_id`` if given (a target after a text, not after a conversation)."""
  if isinstance(record, str):
    ids = encode_piece(tokenizer, record, True)
    target = [False] + [True] * (len(ids) - 1)
  else:
    ids, target = [], []
    for text, learned in pieces(record, tokenizer):
      new = encode_piece(tokenizer, text, not ids)
      ids += new
      target += [learned] * len(new)
  if sep_id is not None:
    ids.append(sep_id)
    target.append(isinstance(record, str))
  return np.asarray(ids, np.int32), np.asarray(target, bool)
