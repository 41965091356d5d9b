"""Target features of the training rows, computed once and kept on disk beside the data.

A feature drafter (EAGLE) learns from the frozen target's hidden states over its training
rows. They are teacher-forced, so they never change: one batched target forward per row gives
them, and a run of several epochs (or several runs: EAGLE-1 and EAGLE-3, ablations) then reads
them instead of repeating the target's forward every step (on a 2-core CPU that forward is
most of an EAGLE step).

    ds = features.attach(ds, target, ("final",), "data/features/smollm2_greedy")

Layout: ``shard-XXXXX.npz`` (``features [n, T, G]`` float16, G = F per named feature in the
order given) and ``manifest.json``, written last, naming the target's fingerprint, the feature
names and a hash of the rows' tokens and masks. A directory made for other rows, another
target or other features is recomputed, not trusted; a finished shard is kept, so an
interrupted run resumes. Every file is written to a temporary name and renamed.
"""

import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from specjax.drafters import artifact
from specjax.models import llama
from specjax.train.data import Dataset

MANIFEST = "manifest.json"
FORMAT = 1
SHARD_ROWS = 256
BATCH = 8


def _identity(ds: Dataset, target, names: tuple) -> dict:
  return {
    "format": FORMAT,
    "target": artifact.target_meta(target),
    "features": [str(n) for n in names],
    "rows": len(ds),
    "seq_len": ds.seq_len,
    "rows_hash": ds.fingerprint(),
  }


def _save_npz(path: Path, **arrays) -> None:
  tmp = path.with_name(f".{path.name}.tmp")
  with open(tmp, "wb") as f:
    np.savez(f, **arrays)
    f.flush()
    os.fsync(f.fileno())
  tmp.replace(path)


def attach(ds: Dataset, target, names: tuple, directory) -> Dataset:
  """``ds`` with ``features [N, T, G]`` (float16) for ``names`` ("final" and/or layer
  indices), read from ``directory`` if it holds them for these rows and this target, else
  computed (one batched target forward per row) and written there. Prints the disk cost."""
  llama.check_features(target.cfg, names)
  directory = Path(directory)
  want = _identity(ds, target, names)
  shards = range(0, len(ds), SHARD_ROWS)
  files = [directory / f"shard-{i // SHARD_ROWS:05d}.npz" for i in shards]
  manifest = directory / MANIFEST
  done = manifest.is_file() and json.loads(manifest.read_text()) == want
  if not done:
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / "partial.json"  # which rows the finished shards belong to
    if not (partial.is_file() and json.loads(partial.read_text()) == want):
      for f in directory.glob("shard-*.npz"):
        f.unlink()
      manifest.unlink(missing_ok=True)
      partial.write_text(json.dumps(want))
    forward = jax.jit(
      lambda p, t: jnp.concatenate(llama.logits_of(p, target.cfg, t, names)[1], axis=-1)
    )
    t0 = time.perf_counter()
    todo = [(i, f) for i, f in zip(shards, files, strict=True) if not f.is_file()]
    with tqdm(total=sum(min(SHARD_ROWS, len(ds) - i) for i, _ in todo), desc="features",
              unit="row") as bar:  # fmt: skip
      for start, path in todo:
        rows = ds.tokens[start : start + SHARD_ROWS]
        out = []
        for b in range(0, len(rows), BATCH):
          batch = rows[b : b + BATCH]
          pad = BATCH - len(batch)  # one compiled shape: the last batch is padded
          full = np.concatenate([batch, np.zeros((pad, batch.shape[1]), batch.dtype)])
          f = np.asarray(forward(target.params, jnp.asarray(full)))[: len(batch)]
          out.append(f.astype(np.float16))
          bar.update(len(batch))
        _save_npz(path, features=np.concatenate(out))
    manifest.write_text(json.dumps(want))
    partial.unlink(missing_ok=True)
    print(f"features: {len(ds)} rows in {time.perf_counter() - t0:.0f} s")
  parts = []
  for path in files:
    with np.load(path) as f:
      parts.append(f["features"])
  feats = np.concatenate(parts)
  expect = (len(ds), ds.seq_len, target.cfg.dim * len(names))
  if feats.shape != expect:
    raise ValueError(
      f"{directory}: features of shape {feats.shape}, expected {expect}: delete the directory "
      "and rerun to recompute them."
    )
  size = sum(p.stat().st_size for p in files)
  print(f"features {list(names)} of {len(ds)} rows: {size / 2**20:.0f} MiB on disk in {directory}")
  return Dataset(ds.tokens, ds.mask, feats)
