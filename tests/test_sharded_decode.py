"""Decoding on a device mesh: the same tokens as one device, on 8 emulated CPU devices and
across two processes; the placement's sizes, errors and per-device bytes.

The 8-device runs happen in a worker process (tests/decode_worker.py); the one-device
reference runs here, in a process with one device.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import decode_worker
import jax
import numpy as np
import pytest
import train_worker
from jax.sharding import PartitionSpec as P

from specjax import build, parallel, placement
from specjax.models import llama, tiny

ROOT = Path(__file__).resolve().parents[1]


def _eight_devices(**args) -> dict:
  """A worker process of 8 devices running ``decode_worker.main(args)``. Each mesh test below
  starts its own (the layouts' and the exact-distribution runs in one process took ~55 s, near
  the one-test limit)."""
  return train_worker.run_subprocess(args, devices=8, timeout=600, script="decode_worker.py")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_eight_device_layouts_match_one_device():
  """Data, tensor and mixed layouts, in one process of 8 devices; a draft model and four tree
  drafters (all in the mixed layout, the published EAGLE-3 architecture among them): greedy
  tokens identical to one device, the weights really split, and no weight gathered whole
  (weights split over fsdp instead are seen gathered). With the tensor layout, the target saved
  as a two-shard HF checkpoint loads straight onto the mesh, each weight already placed as the
  partition rules place it (loaded without the mesh, it is not)."""
  got = _eight_devices(layouts=decode_worker.LAYOUTS, fsdp_check=True, load_onto="tensor")
  want = {name: decode_worker.run(*case) for name, case in decode_worker.cases().items()}
  for layout in decode_worker.LAYOUTS:
    names = decode_worker.LAYOUT_DRAFTERS.get(layout, tuple(want))
    assert len(names) == {"mixed": 5}.get(layout, 2)
    for name in names:
      assert got["tokens"][f"{name}/{layout}"] == want[name].tokens, (name, layout)
      assert got["tokens"][f"{name}/{layout}/tau"] == pytest.approx(want[name].metrics["tau"])
    assert got["weight_gathers"][layout] == [], layout
  # wq is [32, 32] (8 heads x 4): tensor splits its rows, data leaves it whole.
  assert got["shards"] == {"data": [32, 32], "tensor": [4, 32], "mixed": [8, 32]}
  assert got["weight_gathers"]["fsdp"], got["weight_gathers"]
  assert got["load_onto"] == {
    "same_shardings": True, "same_values": True, "without_mesh_same_shardings": False
  }  # fmt: skip


@pytest.mark.slow
@pytest.mark.multiprocess
def test_exact_distribution_on_a_mesh():
  """The exact-distribution test, multi-step form, on a 4 x 2 mesh: an EAGLE sampled tree at
  temperature 1 with top-k passes for each of three ragged prompts (Bonferroni); the verifier
  that keeps a rejected candidate fails it. 4,000 rows (1,333-1,334 per prompt): the broken
  verifier measured at min p = 4e-12 against the 1e-6 bar (3e-22 at twice the rows)."""
  got = _eight_devices(exact=True)
  assert min(got["exact"]) > 1e-3 / 3, got["exact"]
  assert min(got["exact_broken"]) < 1e-6, got["exact_broken"]


def test_tau_and_tokens_reference_is_not_trivial():
  """The reference the mesh runs are compared with accepts drafts (tau > 1) and differs per
  row, so equal tokens mean equal per-row acceptance."""
  drafter, dparams = decode_worker.cases()["draft_model"]
  out = decode_worker.run(drafter, dparams)
  assert out.metrics["tau"] > 1.5
  assert len({tuple(r) for r in out.tokens}) == len(out.tokens)


# -- two processes ---------------------------------------------------------------------------


def _cli(overrides: list[str], devices: int, **popen):
  cmd = [sys.executable, "-m", "specjax.run", "--config=configs/tiny.py", *overrides]
  return subprocess.Popen(
    cmd, cwd=ROOT, env=train_worker.env(devices), text=True, stdout=subprocess.PIPE,
    stderr=subprocess.PIPE, **popen,
  )  # fmt: skip


def _rows(stdout: str) -> dict[int, str]:
  """``{prompt index: '-> [...]'}`` from the generate task's printout."""
  lines = stdout.splitlines()
  rows = {}
  for a, b in zip(lines, lines[1:], strict=False):
    if m := re.match(r"\[(\d+)\] prompt ids", a):
      rows[int(m[1])] = b.strip()
  return rows


def _distributed(port: int, pid: int, heartbeat_s: int = 10) -> list[str]:
  return [
    f"--config.distributed.coordinator_address=127.0.0.1:{port}",
    "--config.distributed.num_processes=2",
    f"--config.distributed.process_id={pid}",
    f"--config.distributed.heartbeat_timeout_s={heartbeat_s}",
    "--config.distributed.initialization_timeout_s=60",
  ]


COMMON = ["--config.max_new_tokens=24", "--config.batch_size=4"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one_process(tmp_path):
  """Two processes of two devices each: a 2 x 2 mesh, rows split across the processes; each
  prints and writes its own rows; together they are the one-process tokens."""
  port = train_worker.free_port()
  mesh = ["--config.mesh.data=2", "--config.mesh.tensor=2", f"--config.output_dir={tmp_path}"]
  procs = [_cli(COMMON + mesh + _distributed(port, pid), devices=2) for pid in range(2)]
  single = _cli(COMMON, devices=1)
  try:
    outs = [p.communicate(timeout=300) for p in procs]
    one_out, one_err = single.communicate(timeout=300)
  finally:
    for p in (*procs, single):
      if p.poll() is None:
        p.kill()
  for p, (_, err) in zip(procs, outs, strict=True):
    assert p.returncode == 0, err[-3000:]
  assert single.returncode == 0, one_err[-3000:]
  want = _rows(one_out)
  assert sorted(want) == [0, 1, 2, 3]
  per_process = [_rows(out) for out, _ in outs]
  assert per_process[0] == {i: want[i] for i in (0, 1)}  # data shard 0 lives on process 0
  assert per_process[1] == {i: want[i] for i in (2, 3)}
  for pid, rows in enumerate(([0, 1], [2, 3])):
    written = (tmp_path / f"rows.process{pid}.jsonl").read_text().splitlines()
    assert [eval(x)["row"] for x in written] == rows  # noqa: S307 - our own JSON lines
  assert "memory per device (4 devices)" in outs[0][0]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_dead_peer_ends_the_survivor_within_a_bound(tmp_path):
  heartbeat_s, bound_s = 4, 40
  config = tmp_path / "long.py"
  config.write_text(
    "from configs import tiny\n\n\ndef get_config():\n  c = tiny.get_config()\n"
    "  c.prompts = [[i % 500 + 1, 7, 9] for i in range(4000)]\n  return c\n"
  )
  port = train_worker.free_port()
  mesh = ["--config.mesh.data=2", "--config.max_new_tokens=100"]
  cmd = [f"--config={config}", *COMMON, *mesh]
  procs = []
  for pid in range(2):
    procs.append(
      subprocess.Popen(
        [sys.executable, "-m", "specjax.run", *cmd, *_distributed(port, pid, heartbeat_s)],
        cwd=ROOT,
        env=train_worker.env(1) | {"PYTHONPATH": str(ROOT)},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
      )  # fmt: skip
    )
  try:
    # Wait until the run decodes (process 0's progress bar), then kill process 1 mid-run.
    deadline = time.time() + 180
    seen = ""
    while "generate:" not in seen and time.time() < deadline:
      assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
      seen += os.read(procs[0].stderr.fileno(), 65536).decode(errors="replace")
    assert "generate:" in seen, seen[-3000:]
    time.sleep(2)
    os.kill(procs[1].pid, signal.SIGKILL)
    t0 = time.time()
    _, err = procs[0].communicate(timeout=bound_s)
    elapsed = time.time() - t0
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert procs[0].returncode != 0
  assert elapsed < bound_s, elapsed
  assert "another task died" in err or "Terminating process" in err, err[-3000:]


# -- sizes and errors, before anything loads ---------------------------------------------------


def _config(**overrides):
  from configs import tiny as tiny_config

  c = tiny_config.get_config()
  c.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
  return c


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"mesh__tensor": 3}, r"mesh.tensor=3 does not divide the target's num_heads=8 .* \[1, 2\]"),
    (
      {"mesh__tensor": 2, "target__vocab_size": 511},
      "mesh.tensor=2 does not divide the target's vocab_size=511",
    ),
    ({"mesh__data": 3}, "batch_size=4 is not divisible by mesh.data=3"),
    ({"mesh__data": 2}, "needs 2 devices but 1 are available"),
    ({"mesh__fsdp": 2}, "mesh.fsdp=2: decoding shards weights over mesh.tensor only"),
    (
      {"device_memory_gib": 0.01},
      r"needs per device \(1 device\): target weights .*config.device_memory_gib=0.01\)",
    ),
  ],
)
def test_bad_mesh_is_one_error_before_loading(overrides, message, monkeypatch):
  monkeypatch.setattr(build, "target", lambda *_: pytest.fail("loaded the model"))
  with pytest.raises(ValueError, match=message):
    build.check(_config(**overrides))


def test_bytes_per_device_follow_the_partition_rules():
  cfg = tiny.tiny_config(vocab_size=64, dim=32, num_heads=4, num_kv_heads=2, ffn_dim=64)
  params = jax.eval_shape(lambda: llama.init_params(cfg, jax.random.key(0)))
  whole = sum(x.size * 4 for x in jax.tree.leaves(params))
  norms = sum(
    x.size * 4
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
    if "norm" in parallel.path_str(path)
  )
  one = {"data": 1, "fsdp": 1, "tensor": 1}
  assert placement.bytes_per_device(params, llama.RULES, one) == whole
  # tensor splits every matrix (and bias) in two; norms stay whole; data splits no weight.
  two = {"data": 4, "fsdp": 1, "tensor": 2}
  assert placement.bytes_per_device(params, llama.RULES, two) == (whole - norms) // 2 + norms
  # the cache: rows over data, kv heads over tensor
  full = placement.cache_bytes(cfg, 8, 100, one)
  assert full == 2 * cfg.num_layers * 8 * cfg.num_kv_heads * 100 * cfg.head_dim * 4
  assert placement.cache_bytes(cfg, 8, 100, two) == full // 8


def test_place_keeps_placed_leaves_and_splits_by_rules():
  cfg, params = tiny.random_model(num_heads=2, num_kv_heads=2)
  mesh = jax.make_mesh((1, 1, 1), parallel.AXES)
  placed = placement.place(params, llama.RULES, mesh)
  again = placement.place(placed, llama.RULES, mesh)
  assert all(a is b for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(again), strict=True))
  assert placed["layers"][0]["wq"].sharding.spec == P("tensor", "fsdp")
  np.testing.assert_array_equal(placed["embed"], params["embed"])


def test_memory_line_names_every_part():
  fp = placement.footprint({"target weights": 3 * 2**20, "target KV cache": 2**20}, {"data": 2})
  assert fp.describe() == (
    "per device (2 devices): target weights 3.0 MiB, target KV cache 1.0 MiB; total 4.0 MiB"
  )
  with pytest.raises(ValueError, match=r"more than 0.00195 GiB \(config.device_memory_gib=0.00195"):
    placement.check_fits(fp, 0.001953125)


def test_generate_refuses_a_mesh_the_batch_does_not_divide():
  from specjax.decode import generate

  cfg, params = tiny.random_model()
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), parallel.AXES)
  fake = type("M", (), {"shape": {"data": 3, "fsdp": 1, "tensor": 1}})()
  with pytest.raises(ValueError, match="batch_size=2 is not divisible by mesh.data=3"):
    generate(params, cfg, [[1], [2]], mesh=fake)
  assert generate(params, cfg, [[1], [2]], mesh=mesh, max_new_tokens=3).local_rows == [0, 1]


def test_device_bench_checks_its_variants_and_dtypes_before_any_model_loads():
  """The full set's drafters, named variants and dtypes pass their checks; a bad dtype or
  variant is one error naming the field, before anything loads."""
  from configs import device_bench as bench_config
  from specjax.tasks import device_bench

  c = bench_config.get_config()
  runs = device_bench._runs(c)
  labels = [label for label, _ in runs]
  assert len(runs) == 2 * 10 and {"dspark_tree_14_l4", "peagle_tree_16_l4"} <= set(labels)
  assert [rc.dtype for _, rc in runs] == ["float32"] * 10 + ["bfloat16"] * 10
  dspark = next(rc for label, rc in runs if label == "dspark_tree_14_l4")
  assert dspark.drafter.name == "dflash" and dspark.drafter.dflash.lookup == 4
  c.device_bench.dtypes = ("float16",)
  with pytest.raises(ValueError, match=r"device_bench.dtypes has \['float16'\]"):
    device_bench.run(c)
  c.device_bench.dtypes = ("float32", "auto")  # the suite pins auto to float32 on a CPU
  with pytest.raises(ValueError, match="runs a drafter twice in one dtype here"):
    device_bench.run(c)
  c.device_bench.dtypes = ("float32",)
  c.device_bench.drafters = ("eagle", "eagle_tree")
  with pytest.raises(ValueError, match="'eagle_tree', which is neither a config.drafter section"):
    device_bench.run(c)
  c.device_bench.variants["eagle_tree"] = {"name": "eagle", "eagle": {"path": "no/such/dir"}}
  with pytest.raises(ValueError, match="no/such/dir"):
    device_bench.run(c)
  c.device_bench.drafters = ("eagle",)  # what the H200 run named: that drafter alone
  assert [label for label, _ in device_bench._runs(c)] == ["eagle"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_device_bench_script_runs_end_to_end_on_cpu(tmp_path):
  """scripts/device_bench.sh on random tiny models: every drafter and named variant benchmarked
  at a batch of two rows (the full set's batch sizes run through the same loop) in float32 and
  in bfloat16, the verify-cost curve measured in each, one JSON written."""
  proc = subprocess.run(
    ["bash", "scripts/device_bench.sh", "tiny", f"--config.output_dir={tmp_path}"],
    cwd=ROOT, env=train_worker.env(1), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "device: cpu" in proc.stdout
  record = json.loads((tmp_path / "device_bench.json").read_text())
  runs = {(r["drafter"], r["dtype"], r["batch"]): r for r in record["runs"]}
  assert sorted(runs) == [(d, t, 2) for d in ("draft_model", "lookup_tree")
                          for t in ("bfloat16", "float32")]  # fmt: skip
  for r in runs.values():  # bfloat16 greedy on a CPU: at the drafter's rows, equal to AR's there
    assert r["greedy_identical"] is True
    assert r["tau"] >= 1 and r["calls_per_token"] == pytest.approx(1 / r["tau"], rel=0.2)
    assert r["tokens_per_s"] > 0 and r["speedup"] > 0
  assert (tmp_path / "lookup_tree_b2_bfloat16" / "benchmark.json").is_file()
  assert record["dtypes"] == ["float32", "bfloat16"]
  for curve in record["verify_cost_by_dtype"].values():
    assert [row["tokens"] for row in curve] == [1, 4]
  assert record["machine"]["platform"] == "cpu" and record["dtype"] == "float32"


# -- bfloat16 (the accelerator default) ---------------------------------------------------------


def test_bfloat16_weights_and_cache_keep_greedy_equal_to_autoregression():
  """bfloat16 weights, bfloat16 caches (half the bytes per device), float32 activations: the
  verify forward rounds new K/V as the cache stores them, so greedy speculative decoding is
  still token for token the bfloat16 target's AR output."""
  from specjax.decode import AUTOREGRESSIVE, footprint, generate
  from specjax.drafters import DraftModel

  cfg, params = tiny.random_model(
    seed=0, vocab_size=64, dim=32, num_layers=3, residual_scale=0.2, logit_std=3.0
  )
  bf16 = llama.cast(params, jax.numpy.bfloat16)
  dcfg, dparams = tiny.truncated(cfg, bf16, 1)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
  kw = dict(max_new_tokens=30, max_len=48)
  ar = generate(bf16, cfg, prompts, **kw)
  spec = generate(bf16, cfg, prompts, drafter=DraftModel(dcfg, 3), drafter_params=dparams, **kw)
  assert spec.tokens == ar.tokens and spec.metrics["tau"] > 1.5
  one = {"data": 1, "fsdp": 1, "tensor": 1}
  half = footprint(cfg, bf16, AUTOREGRESSIVE, None, 4, 64, one).parts
  full = footprint(cfg, params, AUTOREGRESSIVE, None, 4, 64, one).parts
  assert half == {k: v // 2 for k, v in full.items()}
  cache = llama.init_cache(dcfg, 1, 8, llama.param_dtype(dparams))
  assert cache.k[0].dtype == jax.numpy.bfloat16


def test_dtype_auto_is_float32_on_cpu_and_bfloat16_is_applied():
  c = _config()
  assert build.dtype(c) == "float32"
  c.dtype = "bfloat16"
  model = build.target(c)
  assert model.params["layers"][0]["wq"].dtype == jax.numpy.bfloat16
  _, dparams = build.drafter(c, model)
  assert {x.dtype for x in jax.tree.leaves(dparams)} == {jax.numpy.dtype("bfloat16")}
  c.dtype = "fp8"
  with pytest.raises(ValueError, match="config.dtype='fp8' is unknown"):
    build.check(c)
