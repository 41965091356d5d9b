"""Real multi-process runs on localhost: jax.distributed with a coordinator on 127.0.0.1.

Two worker processes with two CPU devices each form one 4-device mesh; gloo carries the
cross-process collectives.
"""

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import train_worker

from specjax.train import metrics_log

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

LAYOUT = {"data": 2, "fsdp": 2}  # data across the two processes, fsdp within each


def _start(args: dict, heartbeat_s: int = 10) -> list[subprocess.Popen]:
  port = train_worker.free_port()
  procs = []
  for pid in range(2):
    dist = {
      "coordinator_address": f"127.0.0.1:{port}",
      "num_processes": 2,
      "process_id": pid,
      "heartbeat_timeout_s": heartbeat_s,
      "initialization_timeout_s": 60,
    }
    procs.append(
      subprocess.Popen(
        train_worker.command(args | {"distributed": dist}),
        env=train_worker.env(devices=2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
    )
  return procs


def _stop(procs):
  for p in procs:
    if p.poll() is None:
      p.kill()
    p.communicate()


def test_two_processes_match_one_process(tmp_path):
  args = {
    "layouts": {"dp_x_fsdp": LAYOUT},
    "steps": 3,
    "workdir": str(tmp_path),  # orbax writes a checkpoint from both processes at the end
  }
  procs = _start(args)
  try:
    outs = [p.communicate(timeout=240) for p in procs]
  finally:
    _stop(procs)
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-3000:]
  results = [train_worker.parse(out)["dp_x_fsdp"] for out, _ in outs]
  want = train_worker.reference_losses(steps=3)
  np.testing.assert_allclose(results[0]["losses"], want, rtol=1e-5)
  assert results[1]["losses"] == []  # only process 0 logs
  assert results[0]["wq_shard"] == [32, 16]  # fsdp splits wq's input dim within a process
  assert (tmp_path / "dp_x_fsdp" / "checkpoints" / "3").is_dir()


@pytest.mark.parametrize("victim", [1, 0], ids=["worker_dies", "coordinator_dies"])
def test_peer_death_fails_the_survivor_within_a_bound(tmp_path, victim):
  heartbeat_s, bound_s = 4, 30
  # The layout of the test above: the worker finds its compiled step in the session's cache.
  args = {"layouts": {"run": LAYOUT}, "steps": 100_000, "slow_s": 0.05}
  procs = _start(args | {"workdir": str(tmp_path)}, heartbeat_s=heartbeat_s)
  metrics = tmp_path / "run" / "metrics.jsonl"
  try:
    deadline = time.time() + 180
    while len(metrics_log.read(metrics)) < 3 and time.time() < deadline:
      assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
      time.sleep(0.05)
    assert len(metrics_log.read(metrics)) >= 3, "the run never started training"
    os.kill(procs[victim].pid, signal.SIGKILL)
    t0 = time.time()
    survivor = procs[1 - victim]
    _, err = survivor.communicate(timeout=bound_s)
    elapsed = time.time() - t0
  finally:
    _stop(procs)
  assert survivor.returncode != 0
  assert elapsed < bound_s, elapsed
  assert "another task died" in err or "another process of this multi-process run" in err, err[
    -3000:
  ]
