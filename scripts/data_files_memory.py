"""Host memory of training on a large conversation file: the file is streamed, never held.

    python scripts/data_files_memory.py --mb 200 --steps 5     # the number in docs/data.md
    python scripts/data_files_memory.py --mb 20 --steps 0      # what tests/test_data_files.py runs

Writes a ShareGPT JSONL file of ``--mb`` MB (random-word conversations, 1-4 turns), then, in
this process: trains a tiny draft model for ``--steps`` steps on random rows in memory (JAX's
own memory: compiles, buffers), scans the file (``files.check_files``), loads the stream, reads
``--batches`` batches of 64 rows of 512 tokens, and trains the same model on the file for
``--steps`` steps through ``specjax.train.loop.train``. Prints one line ``RESULT {json}``: the
file size, seconds and resident memory (VmRSS, and the peak VmHWM) after each stage, in MB, and
``growth_mb``: the peak at the end over the memory before the file was touched.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _mem() -> dict:
  status = Path("/proc/self/status").read_text().splitlines()
  get = lambda k: int(next(x for x in status if x.startswith(k)).split()[1]) / 1024
  return {"rss_mb": round(get("VmRSS:"), 1), "peak_mb": round(get("VmHWM:"), 1)}


def write_file(path: Path, mb: float, seed: int = 0) -> int:
  rng = np.random.default_rng(seed)
  words = [f"w{i}" for i in range(2000)] + ["the", "a", "of", "and", "is", "to", "in"]
  target, n = mb * 1e6, 0
  with open(path, "w") as f:
    while f.tell() < target:
      turns = []
      for _ in range(rng.integers(1, 5)):
        for who, k in (("human", 20), ("gpt", 120)):
          text = " ".join(words[j] for j in rng.integers(0, len(words), rng.integers(k // 4, k)))
          turns.append({"from": who, "value": text})
      f.write(json.dumps({"id": n, "conversations": turns}) + "\n")
      n += 1
  return n


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--mb", type=float, default=200)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--batches", type=int, default=5)
  ap.add_argument("--dir", default="")
  args = ap.parse_args()

  from test_data_files import byte_chat_tokenizer

  from specjax.train import data, files

  tmp = Path(args.dir or tempfile.mkdtemp(prefix="specjax-data-mem-"))
  path = tmp / "big.jsonl"
  t0 = time.perf_counter()
  records = write_file(path, args.mb)
  out = {"file_mb": round(path.stat().st_size / 1e6, 1), "records": records}
  out["write_s"] = round(time.perf_counter() - t0, 1)
  tok = byte_chat_tokenizer()
  import grain.experimental  # noqa: F401  (loaded by any run; not the data's memory)
  import jax

  def train_on(ds):
    from specjax import parallel
    from specjax.models import tiny
    from specjax.train import loop, objectives, step

    tcfg, tparams = tiny.random_model(seed=0, vocab_size=259, dim=32, num_layers=2)
    dcfg = tiny.tiny_config(vocab_size=259, dim=32, num_layers=1, name="draft")
    objective = objectives.DraftDistill(tcfg, dcfg, embed="copy")
    mesh = parallel.make_mesh(parallel.MeshConfig())
    lcfg = loop.LoopConfig(steps=args.steps, global_batch=16, progress=False, log_every=1)
    t0 = time.perf_counter()
    optim = step.OptimConfig(learning_rate=1e-3)
    result = loop.train(objective, tparams, ds, None, lcfg, optim, mesh)
    jax.block_until_ready(result.state.params)
    loss = round(result.history[-1]["loss"], 4)
    return {"s": round(time.perf_counter() - t0, 1), "steps": args.steps, "loss": loss, **_mem()}

  cfg = {"files": [str(path)], "format": "sharegpt", "seq_len": 512, "on_error": "stop"}
  if args.steps:  # the same training on rows in memory first: JAX's own memory, warmed
    rng = np.random.default_rng(0)
    rows = data.Dataset(rng.integers(0, 259, (64, 512)), np.ones((64, 512), np.float32))
    out["train_in_memory"] = train_on(rows)
  base = _mem()
  out["before"] = base

  t0 = time.perf_counter()
  index = files.check_files(cfg)
  out["scan"] = {"s": round(time.perf_counter() - t0, 1), **_mem(), "records": len(index)}
  t0 = time.perf_counter()
  train, _ = files.load_files(cfg, tok, process_index=0, process_count=1)
  rows = 0
  for s in range(args.batches):
    rows += len(train.batch(s, 64)["tokens"])
  dt = time.perf_counter() - t0
  out["batches"] = {"s": round(dt, 1), "rows_per_s": round(rows / dt, 1), **_mem()}
  if args.steps:
    out["train_on_file"] = train_on(train)
  out["growth_mb"] = round(_mem()["peak_mb"] - base["rss_mb"], 1)
  print("RESULT " + json.dumps(out), flush=True)
  if not args.dir:
    path.unlink()
    tmp.rmdir()


if __name__ == "__main__":
  main()
