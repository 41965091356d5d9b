"""A tiny training run in its own process, for tests that need a fresh JAX (device count, peers).

    python tests/train_worker.py '{"layouts": {"fsdp": {"data": 1, "fsdp": 8}}, "steps": 3}'

Prints one line ``RESULT {json}``: per layout, the losses of every step, the step it resumed
from, and the shard shape of one attention weight (to show the layout really splits it).
``setup()`` is also imported by the tests, which compute the single-device reference in-process.
Keys: layouts (name -> MeshConfig fields), steps, global_batch, workdir (a layout's run goes in
workdir/name), checkpoint_every, distributed (DistributedConfig fields), slow_s (sleep per
batch: a slow input pipeline, so a test can kill the run mid-way).
"""

import atexit
import dataclasses
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from specjax import parallel
from specjax.models import tiny
from specjax.train import data, loop, objectives, step

OPTIM = step.OptimConfig(learning_rate=1e-2, decay_steps=20)
ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def _compilation_cache() -> str:
  """One persistent XLA cache per test session (removed at exit): reruns skip recompiling."""
  path = tempfile.mkdtemp(prefix="specjax-test-xla-cache-")
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


def env(devices: int = 1) -> dict:
  """Environment of a worker process with ``devices`` CPU devices."""
  return os.environ | {
    # The suite's compile flags (tests/conftest.py), and the device count.
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} "
    + os.environ.get("XLA_FLAGS", ""),
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": str(ROOT),
    "JAX_COMPILATION_CACHE_DIR": _compilation_cache(),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
  }


def command(args: dict | list, script: str = "train_worker.py") -> list[str]:
  return [sys.executable, str(ROOT / "tests" / script), json.dumps(args)]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def parse(stdout: str) -> dict:
  line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT ") :])


def run_subprocess(
  args: dict | list, devices: int = 1, timeout: float = 300, script: str = "train_worker.py"
) -> dict | list:
  """Runs a worker script (this one by default) to completion in a fresh process and returns
  its RESULT."""
  proc = subprocess.run(
    command(args, script), capture_output=True, text=True, env=env(devices), timeout=timeout
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return parse(proc.stdout)


@dataclasses.dataclass(frozen=True)
class SlowDataset:
  ds: data.Dataset
  delay_s: float

  def __len__(self):
    return len(self.ds)

  @property
  def seq_len(self):
    return self.ds.seq_len

  def batch(self, *args, **kw):
    time.sleep(self.delay_s)
    return self.ds.batch(*args, **kw)


def setup(slow_s: float = 0.0):
  """(objective, target params, dataset): a 2-layer target, a 1-layer draft, random text."""
  tcfg, tparams = tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=2)
  dcfg = tiny.tiny_config(vocab_size=64, dim=32, num_layers=1, name="draft")
  objective = objectives.DraftDistill(tcfg, dcfg, embed="copy")
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, (64, 16))
  mask = (rng.random((64, 16)) < 0.9).astype(np.float32)
  ds = data.Dataset(tokens, mask)
  return objective, tparams, SlowDataset(ds, slow_s) if slow_s else ds


def run(args: dict) -> dict:
  objective, tparams, ds = setup(args.get("slow_s", 0.0))
  out = {}
  for name, mesh_fields in args["layouts"].items():
    mesh = parallel.make_mesh(parallel.MeshConfig(**mesh_fields))
    cfg = loop.LoopConfig(
      steps=args.get("steps", 3),
      global_batch=args.get("global_batch", 8),
      workdir=f"{args['workdir']}/{name}" if args.get("workdir") else "",
      log_every=1,
      checkpoint_every=args.get("checkpoint_every", 0),
      progress=False,
    )
    result = loop.train(objective, tparams, ds, None, cfg, OPTIM, mesh)
    wq = result.state.params["layers"][0]["wq"]
    out[name] = {
      "losses": [r["loss"] for r in result.history],
      "start": result.start_step,
      "wq_shard": list(wq.sharding.shard_shape(wq.shape)),
    }
  return out


def reference_losses(steps: int, global_batch: int = 8) -> list[float]:
  """The single-device losses, computed in the calling (1-device) process."""
  assert jax.device_count() == 1
  out = run({"layouts": {"one": {}}, "steps": steps, "global_batch": global_batch})
  return out["one"]["losses"]


def main():
  args = json.loads(sys.argv[1])
  if args.get("distributed"):
    parallel.initialize(parallel.DistributedConfig(**args["distributed"]))
  print("RESULT " + json.dumps(run(args)), flush=True)


if __name__ == "__main__":
  main()
