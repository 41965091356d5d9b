"""Trained drafter weights on disk: one directory of safetensors + JSON, tied to its target.

Medusa heads and EAGLE drafters are saved the same way: the trained tensors (and the draft
vocabulary's target ids) in a safetensors file, their shapes, the target's *fingerprint* and the
tensors file's SHA-256 in a JSON file, written into a temporary directory that is renamed into
place, so an interrupted save leaves nothing half-written. Reading the JSON checks the tensors
file too (its header, its length, its SHA-256 where recorded; drafters saved before the digest
have none), before any model loads; loading checks the target before any tensor is used:
another hidden size or vocabulary, or other weights (fingerprint), is one clear error.
"""

import contextlib
import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from specjax.drafters import family
from specjax.models.config import ModelConfig


def target_head(target_params, target_cfg: ModelConfig) -> jax.Array:
  """``[V, F]`` the target's LM head (its embedding when tied)."""
  return target_params["embed"] if target_cfg.tie_embeddings else target_params["lm_head"]


# Config fields added after drafters were first saved, with their defaults: left out of the
# hash at their default, so a model that does not use them keeps the fingerprint it had.
_LATER_FIELDS = {
  f.name: f.default
  for f in dataclasses.fields(ModelConfig)
  if f.name in ("out_bias", "mlp_bias", "qk_norm", "rope_inv_freq", "rope_attention_factor",
                "rope_scaling", "sliding_window")
}  # fmt: skip


def fingerprint(target) -> str:
  """A short id of a target's weights: its config, its tokenizer and a hash of its head.

  The head is hashed rounded to bfloat16, the narrowest dtype specjax computes in, so one
  target loaded as float32 or as bfloat16 has one fingerprint: a drafter trained in one dtype
  decodes in the other (float32 on a CPU, bfloat16 on an accelerator).
  """
  head = np.asarray(jax.device_get(target_head(target.params, target.cfg)))
  head = head.astype(jnp.bfloat16).astype(np.float32)
  h = hashlib.sha256()
  cfg = {
    k: v
    for k, v in (dataclasses.asdict(target.cfg) | {"name": None}).items()
    if k not in _LATER_FIELDS or v != _LATER_FIELDS[k]
  }
  h.update(json.dumps(cfg, sort_keys=True).encode())
  h.update(head[:: max(1, head.shape[0] // 256)].tobytes())
  if target.tokenizer is not None:
    h.update(target.tokenizer.fingerprint().encode())
  return h.hexdigest()[:16]


def target_meta(target) -> dict:
  return {"name": target.cfg.name, "fingerprint": fingerprint(target)}


def check_replaceable(directory, replaces, field: str = "") -> None:
  """A ValueError naming ``directory`` and the fix unless it is absent, empty, or holds only
  files named in ``replaces`` (what the writer about to replace it writes): nothing else the
  user keeps there is ever deleted. ``field``: the config field that named it."""
  directory = Path(directory)
  if not directory.exists() and not directory.is_symlink():
    return
  where = f"{field}={str(directory)!r}" if field else str(directory)
  if not directory.is_dir() or directory.is_symlink():
    raise ValueError(f"{where} is a file, not a directory: name a new directory to write.")
  other = sorted(
    p.name + ("/" if p.is_dir() else "")
    for p in directory.iterdir()
    if p.name not in replaces or not p.is_file() or p.is_symlink()
  )
  if other:
    raise ValueError(
      f"{where} exists and holds {other[:8]}{' ...' if len(other) > 8 else ''}, which this "
      "write would delete: name a new or empty directory, or move those away."
    )


@contextlib.contextmanager
def atomic_directory(directory, replaces=(), field: str = ""):
  """Yields a temporary sibling of ``directory`` that replaces it once the block has written
  everything; if the block fails, the temporary directory goes and ``directory`` is untouched.
  An existing ``directory`` is replaced only if it holds nothing but files named in
  ``replaces`` (``check_replaceable``, checked before anything is written)."""
  directory = Path(directory)
  check_replaceable(directory, replaces, field)
  directory.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.", suffix=".tmp"))
  try:
    yield tmp
    tmp.chmod(0o755)  # mkdtemp makes it owner-only, as do some writers their files
    for f in tmp.iterdir():
      if f.is_file():
        f.chmod(0o644)
    if directory.exists():
      check_replaceable(directory, replaces, field)  # nothing was added there meanwhile
      shutil.rmtree(directory)
    tmp.rename(directory)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def save(directory, tensors: dict, tensors_file: str, meta: dict, meta_file: str) -> Path:
  """Writes ``tensors`` and ``meta`` into ``directory`` atomically (replacing a drafter saved
  there before, and nothing else)."""
  host = {k: np.ascontiguousarray(v) for k, v in jax.device_get(tensors).items()}
  with atomic_directory(directory, {tensors_file, meta_file}) as tmp:
    save_file(host, str(tmp / tensors_file))
    meta = meta | {"sha256": {tensors_file: sha256(tmp / tensors_file)}}
    (tmp / meta_file).write_text(json.dumps(meta, indent=1))
  return Path(directory)


def read_json(path: Path, field: str, fix: str = "copy or download it again") -> dict:
  """A JSON object from ``path``; not JSON, or not an object, is one error naming the file."""
  try:
    obj = json.loads(Path(path).read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{field}: {path} is not valid JSON ({e}): {fix}.") from None
  if not isinstance(obj, dict):
    raise ValueError(f"{field}: {path} is not a JSON object: {fix}.")
  return obj


def sha256(path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
      h.update(chunk)
  return h.hexdigest()


def kinds() -> dict[str, str]:
  """``{JSON file: drafter name}`` of each kind of saved drafter (the family records' ``saved``
  groups): the file marks a directory as that drafter's, decoded with ``drafter.name``."""
  return family.saved_kinds()


def read_meta(
  directory, meta_file: str, fmt: int, field: str, hint: str, tensors_file: str | None = None
) -> dict:
  """The JSON beside saved weights; ``field`` and ``hint`` name the config field and the fix.
  With ``tensors_file``, that file is checked against it (``check_tensors``)."""
  path = Path(directory) / meta_file
  if not path.is_file():
    known = kinds()
    other = [f for f in known if f != meta_file and (Path(directory) / f).is_file()]
    if other:
      kind = known[other[0]]
      raise ValueError(
        f"{field}={str(directory)!r} holds {other[0]}, not {meta_file}: it is a drafter "
        f"for drafter.name={kind}; decode with drafter.name={kind} and "
        f"drafter.{kind}.path={str(directory)!r}."
      )
    raise ValueError(f"{field}={str(directory)!r} holds no {meta_file}: {hint}.")
  try:
    meta = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{field}: {path} is not valid JSON ({e}): save the drafter again.") from None
  if not isinstance(meta, dict) or meta.get("format") != fmt:
    got = meta.get("format") if isinstance(meta, dict) else None
    raise ValueError(f"{path}: saved drafter format {got}, expected {fmt}.")
  if tensors_file is not None:
    digest = (meta.get("sha256") or {}).get(tensors_file)
    check_tensors(Path(directory) / tensors_file, digest, field)
  return meta


def check_tensors(path: Path, digest: str | None, field: str) -> None:
  """A missing, truncated or damaged tensors file, or one whose bytes differ from those saved
  (``digest``, the SHA-256 recorded at save time), is one error naming the file."""
  if not path.is_file():
    raise ValueError(f"{field}: {path} is missing: copy the whole drafter directory.")
  try:
    with safe_open(str(path), "np"):  # reads the header, checks it covers the file exactly
      pass
  except (SafetensorError, OSError) as e:
    raise ValueError(
      f"{field}: {path} is damaged or truncated ({e}): copy or save the drafter again."
    ) from None
  if digest is not None and sha256(path) != digest:
    raise ValueError(
      f"{field}: {path} does not match the SHA-256 recorded when it was saved "
      f"({digest[:16]}...): the file was changed or damaged; copy or save the drafter again."
    )


def read_tensors(directory, tensors_file: str) -> dict[str, np.ndarray]:
  """The saved tensors; floating ones stored narrower (a drafter promoted in bfloat16) come
  back as float32, which ``build.drafter`` casts to the run's dtype."""
  out = load_file(str(Path(directory) / tensors_file))
  wide = lambda x: x.astype(np.float32) if _narrow_float(x) else x  # noqa: E731
  return {k: wide(v) for k, v in out.items()}


def _narrow_float(x: np.ndarray) -> bool:
  return x.dtype in (np.float16, jnp.bfloat16)


def narrowed(directory, tensors_file: str, dtype=jnp.bfloat16) -> str:
  """Rewrites ``tensors_file`` with its float32 tensors as ``dtype`` (others unchanged); returns
  its new SHA-256."""
  path = Path(directory) / tensors_file
  tensors = load_file(str(path))
  cast = {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in tensors.items()}
  save_file({k: np.ascontiguousarray(v) for k, v in cast.items()}, str(path))
  return sha256(path)


def check_target(meta: dict, dim: int, vocab_size: int, target, field: str, what: str) -> None:
  """Weights saved for ``dim`` x ``vocab_size`` and ``meta['target']`` must fit ``target``."""
  cfg = target.cfg
  check_sizes(meta, dim, vocab_size, cfg, field, what)
  if meta["target"]["fingerprint"] != fingerprint(target):
    raise ValueError(
      f"{field}: these {what} were trained on target {meta['target']['name']!r} (fingerprint "
      f"{meta['target']['fingerprint']}), not on this target {cfg.name!r} (fingerprint "
      f"{fingerprint(target)}): train them for it."
    )


def check_sizes(meta: dict, dim: int, vocab_size: int, cfg: ModelConfig, field: str, what: str):
  """Weights saved for ``dim`` x ``vocab_size`` must fit the target's sizes (its header's, so
  this runs before its weights load)."""
  if (dim, vocab_size) != (cfg.dim, cfg.vocab_size):
    raise ValueError(
      f"{field}: these {what} were trained on target {meta['target']['name']!r} (hidden size "
      f"{dim}, vocabulary {vocab_size}) and cannot read this target {cfg.name!r} (hidden size "
      f"{cfg.dim}, vocabulary {cfg.vocab_size}): point {field} at {what} trained on this "
      f"target, or train them for it (task=train)."
    )


def check_random_only(c, defaults, saved: dict, field: str) -> None:
  """A drafter loaded from ``c.path`` has its own shapes (``saved``: field -> the value its
  files give); a shape field of ``c`` set to another value than its default (``defaults``, the
  subsection's own config) and the saved one would be ignored, so it is one error naming each."""
  plain = lambda v: list(v) if isinstance(v, tuple | list) else v  # noqa: E731
  wrong = {k: c[k] for k, v in saved.items() if plain(c[k]) not in (plain(defaults[k]), plain(v))}
  if wrong:
    given = ", ".join(f"{field}.{k}={plain(v)!r}" for k, v in wrong.items())
    own = ", ".join(f"{k}={plain(saved[k])!r}" for k in wrong)
    raise ValueError(
      f"{given} {'is' if len(wrong) == 1 else 'are'} for random weights (path = ''), but the "
      f"drafter at {field}.path={c.path!r} has its own ({own}, from its files): remove the "
      "setting, or set path = '' for random weights of that shape."
    )


def check_vocab(vocab_ids, target, field: str) -> None:
  """The draft vocabulary must be distinct target ids and hold every stop token."""
  ids = np.asarray(vocab_ids)
  if ids.min() < 0 or ids.max() >= target.cfg.vocab_size or len(np.unique(ids)) != len(ids):
    raise ValueError(f"{field}: vocab_ids must be distinct ids in [0, {target.cfg.vocab_size}).")
  stops = sorted(target.tokenizer.stop_ids) if target.tokenizer is not None else []
  missing = [s for s in stops if s not in set(ids.tolist())]
  if missing:
    raise ValueError(
      f"{field}: the reduced draft vocabulary lacks the stop token(s) {missing}: the drafter "
      "could never propose the end of a reply. Rebuild it with the stop tokens included."
    )


def frequent_ids(dataset, vocab_size: int, size: int, tokenizer) -> tuple[int, ...]:
  """A reduced draft vocabulary: the ``size`` most frequent next tokens of the counted
  positions of ``dataset`` (``tokens``, ``mask`` rows), stop tokens always in, sorted."""
  counts = np.bincount(dataset.tokens[:, 1:][dataset.mask[:, :-1] > 0], minlength=vocab_size)
  stops = sorted(tokenizer.stop_ids) if tokenizer is not None else []
  counts[stops] = counts.max() + 1
  return tuple(int(i) for i in np.sort(np.argsort(-counts, kind="stable")[:size]))
