"""Self-distillation: the target writes its own continuations of prompts, saved as shards.

    prompts = distill_prompts.corpus_prompts(["chitchat", "python"], tok, num_prompts=1024,
                                             min_tokens=32, max_tokens=64)
    self_distill(params, cfg, prompts.ids, "data/self_distill/smollm2", max_new_tokens=128,
                 max_len=256, batch_size=32, shard_size=256, temperature=1.0,
                 eos_id=tok.stop_ids, sources=prompts.sources)

The prompts (corpus windows, template requests, your own files) are made in
``distill_prompts.py``.

A drafter is scored by how often the target accepts its tokens, so it learns best from the
target's own output distribution. Generation is ``specjax.decode.generate``, batch by batch
(the last batch is filled by repeating prompts; the extra rows are dropped), with seed
``seed + batch index``, so a shard is the same whether written in one run or after a restart.

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

import functools
import hashlib
import json
import os
import tempfile
import time
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
from specjax.train import data

# The docs name these ``distill.*``: the prompts live in ``distill_prompts.py``, the
# templates in ``prompt_templates.py``.
from specjax.train.distill_prompts import all_requests, corpus_prompts, request_prompts  # noqa: F401
from specjax.train.prompt_templates import INSTRUCTIONS, REQUEST_SETS, TASKS  # noqa: F401

PLAN = "plan.json"


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
  directory with the same plan is resumed, any other existing content is refused. The
  weights' dtype is part of the plan: greedy replies in bfloat16 leave float32's at near-ties,
  so a resume in the other dtype (``dtype = auto`` on another CPU) would mix two targets' rows.
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
    "dtype": jax.tree.leaves(params)[0].dtype.name,  # the weights' (the target's rounding)
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


def check_output_dir(out_dir: str | Path) -> None:
  """``out_dir`` takes a new self-distillation: it is new, empty, or an unfinished run's (its
  plan there, compared with this run's once the prompts are known). Cheap: no model needed."""
  out_dir = Path(out_dir)
  if (out_dir / data.MANIFEST).exists():
    raise ValueError(
      f"{out_dir} already holds a finished self-distillation ({data.MANIFEST}); choose another "
      "output directory or delete it."
    )
  if not (out_dir / PLAN).is_file() and out_dir.is_dir() and any(out_dir.iterdir()):
    raise ValueError(f"{out_dir} is not empty; choose a new or empty output directory.")


def _start(out_dir: Path, plan: dict) -> list[Path]:
  """Checks ``out_dir`` and writes the plan; returns the shard paths."""
  check_output_dir(out_dir)
  n = -(-plan["num_examples"] // plan["shard_size"])
  files = [out_dir / f"shard-{i:05d}.npz" for i in range(n)]
  plan_path = out_dir / PLAN
  if plan_path.is_file():
    old = json.loads(plan_path.read_text())
    if old != plan:
      changed = sorted(
        k
        for k in (old.keys() | plan.keys()) - {"digest", "num_examples"}
        if old.get(k) != plan.get(k)
      )
      raise ValueError(
        f"{out_dir} holds an unfinished self-distillation with other "
        f"{'settings (' + ', '.join(changed) + ')' if changed else 'prompts'} than this run's "
        f"({PLAN} there); rerun it as it was, delete it or choose another output directory."
      )
    for tmp in out_dir.glob(".shard-*.tmp"):  # Left by an interrupted write.
      tmp.unlink()
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
