"""Training on your own data files: conversations or text, streamed into packed rows.

``config.data.files`` (paths or globs) with ``config.data.format`` (``sharegpt``, ``messages``,
``text``; parsing and chat-template rendering in ``conversations.py``): every record of this
process's shard is checked before the model loads (``check_files``), then ``load_files``
streams them with grain (a seeded order per epoch, packing, per-process shards, a position
saved every ``STATE_EVERY`` steps for resume), holding out ``eval_examples`` records' rows
for evaluation. ``FileDataset.batch(step, ...)`` serves the train loop as ``data.Dataset``
does. ``docs/data.md`` describes the formats, masks, ``on_error`` and ``long``.
"""

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from specjax.train import conversations
from specjax.train.data import Dataset, separator_id

LONG = ("split", "truncate")
STATE_EVERY = 10  # steps between saved stream positions (``FileDataset``)
READ_THREADS = 2  # grain threads that read and tokenize records ahead of the train step
_EVAL_STREAM = 0x4556  # rng stream for the held-out records


@dataclasses.dataclass(frozen=True)
class FilesConfig:
  """``config.data`` for ``data.files``, checked (the errors name the field and the fix)."""

  files: tuple[str, ...]
  seq_len: int
  format: str = "sharegpt"
  long: str = "split"
  on_error: str = "stop"
  seed: int = 0  # which records are held out for eval
  eval_examples: int = 0

  @classmethod
  def from_config(cls, d) -> "FilesConfig":
    files = d.get("files") or ()
    files = (files,) if isinstance(files, str) else tuple(files)
    fields = {f.name for f in dataclasses.fields(cls)} - {"files"}
    return cls(files=files, **{k: d[k] for k in fields if k in d})

  def __post_init__(self):
    conversations.check_format(self.format)
    if self.long not in LONG:
      raise ValueError(
        f"config.data.long={self.long!r} is not a choice: split (a record longer than seq_len "
        "becomes several rows) or truncate (its first seq_len tokens)."
      )
    if self.on_error not in conversations.ON_ERROR:
      raise ValueError(
        f"config.data.on_error={self.on_error!r} is not a choice: stop (a bad record is an "
        "error naming its file and line) or skip (bad records are counted and reported)."
      )
    if self.seq_len < 2:
      raise ValueError(f"config.data.seq_len must be >= 2, got {self.seq_len}.")
    if self.eval_examples < 0:
      raise ValueError(f"config.data.eval_examples must be >= 0, got {self.eval_examples}.")


def check_files(
  d, tokenizer=None, *, process_index: int = 0, process_count: int = 1
) -> conversations.Index:
  """Every check of ``config.data`` with ``files``, before any model loads: the fields, the
  files, each record of this process's shard (``on_error``), and, given the tokenizer, that the
  first usable records render. Returns the index of the usable records (scanned once: a later
  ``load_files`` with the same files reuses it)."""
  cfg = FilesConfig.from_config(d)
  if d.get("sources"):
    raise ValueError(
      "config.data has both sources and files: train on one or the other (set "
      "config.data.sources=() to train on your files)."
    )
  paths = conversations.expand(cfg.files)
  stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
  index = _scan(stamp, cfg.format, cfg.on_error, process_index, process_count)
  if tokenizer is not None and cfg.format != "text":
    reader, failed = conversations.Reader(index, cfg.format), []
    for i in range(min(len(index), 8)):
      try:
        conversations.render(reader[i], tokenizer)
        return index
      except conversations.BadRecord as e:
        failed.append(f"{index.where(i)}: {e}")
    raise ValueError(
      f"config.data.files: the target's chat template renders none of the first {len(failed)} "
      f"record(s): {'; '.join(failed[:3])}. Check config.data.format and the target."
    )
  return index


@functools.lru_cache(maxsize=4)
def _scan(stamp, fmt, on_error, process_index, process_count) -> conversations.Index:
  paths = [Path(p) for p, _, _ in stamp]
  return conversations.scan(
    paths, fmt, on_error=on_error, process_index=process_index, process_count=process_count
  )


def load_files(
  d,
  tokenizer,
  *,
  state_dir=None,
  process_index: int | None = None,
  process_count: int | None = None,
) -> tuple["FileDataset", Dataset | None]:
  """``(train, eval)`` from ``config.data.files``: train streams rows from this process's
  records; eval is ``eval_examples`` rows packed in memory from held-out records (None if 0).
  ``state_dir`` (the run's workdir) keeps the stream's position every ``STATE_EVERY`` steps so a
  resumed run finds its row at once (without it, a resume re-reads the stream from the start)."""
  if process_index is None or process_count is None:
    import jax

    process_index, process_count = jax.process_index(), jax.process_count()
  pi, pc = process_index, process_count
  cfg = FilesConfig.from_config(d)
  index = check_files(d, tokenizer, process_index=pi, process_count=pc)
  sep = separator_id(tokenizer)
  eval_ds, used = None, 0
  if cfg.eval_examples:
    perm = np.random.default_rng([cfg.seed, _EVAL_STREAM]).permutation(len(index))
    reader = conversations.Reader(index.take(perm), cfg.format)
    docs = (_element(reader, i, tokenizer, sep, cfg) for i in range(len(reader)))
    tokens, target, used = _next_fit(docs, cfg.seq_len, cfg.eval_examples)
    if len(tokens) < cfg.eval_examples or used == len(index):
      raise ValueError(
        f"config.data.eval_examples={cfg.eval_examples}: the {len(index)} usable record(s) of "
        f"{'this process' if pc > 1 else 'config.data.files'} make {len(tokens)} eval row(s) "
        "and leave none to train on: lower eval_examples (to no fewer than train.global_batch) or "
        "add records."
      )
    eval_ds = Dataset(tokens, _mask(target))
    index = index.take(np.sort(perm[used:]))
  train = FileDataset(
    index,
    tokenizer,
    cfg,
    process_index=pi,
    process_count=pc,
    state_dir=state_dir,
    sep_id=sep,
    held_out=used,
  )
  return train, eval_ds


def _element(reader, i: int, tokenizer, sep: int, cfg: FilesConfig):
  """Record i as {'tokens', 'target'}, or None when it fails to render (``on_error='skip'``)."""
  try:
    tokens, target = conversations.render(reader[int(i)], tokenizer, sep)
  except conversations.BadRecord as e:
    if cfg.on_error == "stop":
      raise ValueError(
        f"{reader.index.where(int(i))}: {e}. Fix the record, or set config.data.on_error="
        "'skip' to count and skip bad records."
      ) from None
    return None
  if cfg.long == "truncate":
    tokens, target = tokens[: cfg.seq_len], target[: cfg.seq_len]
  return {"tokens": tokens, "target": target}


def _pieces(element, seq_len: int) -> list[dict]:
  """An element cut into pieces of at most ``seq_len``; pieces with nothing to learn dropped."""
  if element is None:
    return []
  n = len(element["tokens"])
  out = []
  for lo in range(0, n, seq_len):
    piece = {k: v[lo : lo + seq_len] for k, v in element.items()}
    if piece["target"][1:].any():
      out.append(piece)
  return out


def _next_fit(docs, seq_len: int, rows: int):
  """The first ``rows`` rows of next-fit packing (what the stream's one-bin packer does), and
  how many docs they took."""
  tokens = np.zeros((rows, seq_len), np.int32)
  target = np.zeros((rows, seq_len), bool)
  r, fill, used = 0, 0, 0
  for doc in docs:
    for k, piece in enumerate(_pieces(doc, seq_len)):
      n = len(piece["tokens"])
      if fill + n > seq_len:
        r, fill = r + 1, 0
        if r == rows:  # a doc cut here is held out whole
          return tokens, target, used + (k > 0)
      tokens[r, fill : fill + n] = piece["tokens"]
      target[r, fill : fill + n] = piece["target"]
      fill += n
    used += 1
  return tokens[:r], target[:r], used  # the last, unfinished row is not used


def _mask(target_NxT: np.ndarray) -> np.ndarray:
  """mask[n, t] = 1 where the next token, in the same row, is learned."""
  mask = np.zeros(target_NxT.shape, np.float32)
  mask[:, :-1] = target_NxT[:, 1:]
  return mask


class _Split:
  """grain's flat-map transform: an element -> its pieces of at most seq_len."""

  max_fan_out = 1 << 20

  def __init__(self, seq_len: int):
    self.seq_len = seq_len

  def flat_map(self, element):
    return _pieces(element, self.seq_len)


class FileDataset:
  """Rows packed from data files as they are read (grain): ``batch`` as ``Dataset``'s.

  The process's records are put in a seeded order per epoch (grain's index shuffle, nothing
  materialised), read one at a time, rendered, cut to ``seq_len`` (``long``), and packed whole
  and in order into rows (next fit; the rest of a row is padding, never learned). Row r of the
  stream depends on (files, seed, seq_len, process): ``batch(step)`` takes rows
  ``[step * B / P, (step + 1) * B / P)`` of this process's stream, so a resumed run sees the
  rows it would have seen. ``len`` is the process's records (a row count needs a full read).
  """

  def __init__(self, index, tokenizer, cfg: FilesConfig, *, process_index, process_count,
               state_dir=None, sep_id=None, held_out=0):  # fmt: skip
    self.index, self.tokenizer, self.cfg = index, tokenizer, cfg
    self.process = (process_index, process_count)
    self.sep_id = separator_id(tokenizer) if sep_id is None else sep_id
    self.state_path = (
      None if not state_dir else Path(state_dir) / f"data_state.{process_index}.jsonl"
    )
    self._seed, self._it, self._row, self._states = None, None, 0, {}
    self.skipped_rows = 0  # rows read only to reach a resumed position
    self.held_out = held_out  # records held out for the eval rows

  def __len__(self) -> int:
    return len(self.index)

  @property
  def seq_len(self) -> int:
    return self.cfg.seq_len

  def describe(self) -> str:
    ix = self.index
    s = f"{self.cfg.format} files: {len(ix)} record(s) to train on"
    s += f", {self.held_out} held out for eval" if self.held_out else ""
    if ix.problems:
      s += f"; skipped {ix.problems} bad record(s), first: " + "; ".join(ix.first_problems)
    return s

  def head(self, rows: int, seed: int = 0) -> Dataset:
    """The stream's first ``rows`` rows for ``seed``, in memory (for statistics such as a
    reduced vocabulary's frequent tokens); this stream's position is left alone."""
    other = FileDataset(
      self.index, self.tokenizer, self.cfg, process_index=self.process[0],
      process_count=self.process[1], sep_id=self.sep_id,
    )  # fmt: skip
    b = other.batch(0, rows * self.process[1], seed=seed, process_index=self.process[0],
                    process_count=self.process[1])  # fmt: skip
    return Dataset(b["tokens"], b["mask"])

  def batch(self, step, global_batch, *, seed=0, process_index=0, process_count=1):
    if global_batch < 1 or step < 0 or seed < 0:
      raise ValueError(f"need global_batch >= 1, step >= 0, seed >= 0 (got {global_batch}, "
                       f"{step}, {seed}).")  # fmt: skip
    if (process_index, process_count) != self.process:
      raise ValueError(
        f"this FileDataset holds the records of process {self.process[0]} of "
        f"{self.process[1]}, asked for process {process_index} of {process_count}: load it "
        "with the process's index and count."
      )
    if global_batch % process_count:
      raise ValueError(
        f"global_batch={global_batch} is not divisible by process_count={process_count}: "
        "make it a multiple so every process gets the same number of rows."
      )
    local = global_batch // process_count
    if seed != self._seed:
      self._open(seed)
    want = step * local
    if want != self._row:
      self._seek(want)
    if step % STATE_EVERY == 0:
      self._save(want)
    rows = [next(self._it) for _ in range(local)]
    self._row += local
    target = np.stack([r["target"] for r in rows]).astype(bool)
    return {"tokens": np.stack([r["tokens"] for r in rows]).astype(np.int32), "mask": _mask(target)}

  # -- the stream and its position ------------------------------------------------------------

  def _open(self, seed: int) -> None:
    import grain
    import grain.experimental as gx

    reader = conversations.Reader(self.index, self.cfg.format)
    tok, sep, cfg = self.tokenizer, self.sep_id, self.cfg
    ds = (
      grain.MapDataset.range(len(self.index))
      .shuffle(seed=seed)
      .repeat(None)  # each epoch its own order
      .map(lambda i: _element(reader, i, tok, sep, cfg))
      .to_iter_dataset(grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=64))
    )
    ds = gx.FlatMapIterDataset(ds, _Split(cfg.seq_len))
    self._ds = gx.FirstFitPackIterDataset(
      ds,
      length_struct={"tokens": cfg.seq_len, "target": cfg.seq_len},
      num_packing_bins=1,
      shuffle_bins=False,
    )
    self._seed, self._it, self._row = seed, iter(self._ds), 0
    self._states = {0: self._it.get_state()}
    self._key = self._fingerprint(seed)
    if self.state_path is not None:
      self._states.update(self._read_states())

  def _seek(self, row: int) -> None:
    """Moves the stream to ``row``: from the nearest saved position at or before it."""
    start = max(r for r in self._states if r <= row)
    self._it = iter(self._ds)
    self._it.set_state(self._states[start])
    for _ in range(row - start):
      next(self._it)
    self.skipped_rows += row - start
    self._row = row

  def _save(self, row: int) -> None:
    if row in self._states and row:
      return
    state = self._it.get_state()
    self._states[row] = state
    if self.state_path is not None:
      with open(self.state_path, "a") as f:
        f.write(json.dumps({"row": row, "state": state}) + "\n")

  def _fingerprint(self, seed: int) -> str:
    cfg, ix = self.cfg, self.index
    fp = getattr(self.tokenizer, "fingerprint", None)
    h = hashlib.sha256(
      json.dumps([dataclasses.asdict(cfg), seed, self.process, fp() if fp else None]).encode()
    )
    for p in ix.paths:
      st = Path(p).stat()
      h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    h.update(ix.start.tobytes())
    return h.hexdigest()

  def _read_states(self) -> dict[int, dict]:
    """The saved positions of this stream; a file of another stream is started afresh."""
    path, states = self.state_path, {}
    lines = path.read_text().splitlines() if path.is_file() else []
    try:
      same = bool(lines) and json.loads(lines[0]).get("key") == self._key
    except json.JSONDecodeError:
      same = False
    if same:
      for line in lines[1:]:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
          continue
        states[int(rec["row"])] = rec["state"]
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.with_suffix(".tmp")
      tmp.write_text(json.dumps({"key": self._key}) + "\n")
      os.replace(tmp, path)
    return states
