"""Meshes, partition rules, and the same train step on 1 device and on an 8-device CPU mesh."""

import jax
import numpy as np
import pytest
import train_worker
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.models import llama
from specjax.train import loop

# -- meshes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "fields, devices, shape",
  [
    ({}, 8, (8, 1, 1)),
    ({"fsdp": 2, "tensor": 2}, 8, (2, 2, 2)),
    ({"data": 1, "fsdp": -1}, 4, (1, 4, 1)),
  ],
)
def test_mesh_shape_fills_devices(fields, devices, shape):
  assert parallel.MeshConfig(**fields).shape(devices) == shape


@pytest.mark.parametrize(
  "fields, message",
  [
    ({"data": 2}, "larger than the devices"),
    ({"data": -1, "tensor": 3}, "is not a multiple of 3"),
    ({"data": 0}, "mesh.data must be >= 1"),
    ({"data": -1, "fsdp": -1}, "At most one"),
  ],
)
def test_mesh_config_errors(fields, message):
  with pytest.raises(ValueError, match=message):
    parallel.make_mesh(parallel.MeshConfig(**fields))  # this process has 1 device


def test_batch_must_divide_batch_axes():
  mesh = AbstractMesh((2, 2, 2), parallel.AXES)
  assert parallel.batch_size_per_shard(8, mesh) == 2
  with pytest.raises(ValueError, match=r"global_batch=6 is not divisible .* = 4\)"):
    parallel.batch_size_per_shard(6, mesh)
  with pytest.raises(ValueError, match="global_batch=6 is not divisible"):
    loop.check(loop.LoopConfig(steps=1, global_batch=6), mesh, train_ds=None)


# -- partition rules --------------------------------------------------------------------------


def test_rules_shard_params_and_optimizer_state_alike():
  objective, tparams, _ = train_worker.setup()
  params = jax.eval_shape(objective.init, jax.random.key(0), tparams)
  opt_state = jax.eval_shape(train_worker.OPTIM.optimizer().init, params)
  mesh = AbstractMesh((1, 2, 4), parallel.AXES)
  specs = parallel.partition_specs({"params": params, "opt": opt_state}, llama.RULES, mesh)
  layer = specs["params"]["layers"][0]
  assert layer["wq"] == P("tensor", "fsdp")  # column-parallel [out, in]
  assert layer["wo"] == P("fsdp", "tensor")  # row-parallel
  assert layer["attn_norm"] == P()  # no rule: replicated
  assert specs["params"]["embed"] == P("tensor", "fsdp")
  adam = specs["opt"][1][0]  # clip, then adamw's ScaleByAdamState
  assert adam.mu["layers"][0]["wq"] == layer["wq"]
  assert adam.nu["layers"][0]["w_down"] == layer["w_down"]
  assert adam.count == P()


def test_rules_replicate_dims_the_axis_does_not_divide():
  mesh = AbstractMesh((1, 3, 2), parallel.AXES)
  tree = {
    "wq": jax.ShapeDtypeStruct((4, 6), np.float32),
    "bq": jax.ShapeDtypeStruct((5,), np.float32),
  }
  specs = parallel.partition_specs(tree, llama.RULES, mesh)
  assert specs["wq"] == P("tensor", "fsdp")  # 4 % 2 == 0, 6 % 3 == 0
  assert specs["bq"] == P(None)  # 5 % 2 != 0: replicated


def test_distributed_config_errors():
  with pytest.raises(ValueError, match="coordinator_address"):
    parallel.DistributedConfig(num_processes=2, process_id=0)
  with pytest.raises(ValueError, match=r"process_id=2 must be in \[0, 2\)"):
    parallel.DistributedConfig("127.0.0.1:1234", num_processes=2, process_id=2)


# -- the same step on 8 devices ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.multiprocess
def test_eight_device_layouts_match_one_device():
  """data, fsdp, tensor and a mixed layout: same losses as one device, for 3 optimiser steps."""
  layouts = {
    "data": {"data": 8},
    "fsdp": {"data": 1, "fsdp": 8},
    "tensor": {"data": 1, "tensor": 8},
    "mixed": {"data": 2, "fsdp": 2, "tensor": 2},
  }
  got = train_worker.run_subprocess({"layouts": layouts, "steps": 3}, devices=8)
  want = train_worker.reference_losses(steps=3)
  for name in layouts:
    np.testing.assert_allclose(got[name]["losses"], want, rtol=1e-5, err_msg=name)
  # The layouts really split the weights: wq is [32, 32].
  assert got["data"]["wq_shard"] == [32, 32]
  assert got["fsdp"]["wq_shard"] == [32, 4]
  assert got["tensor"]["wq_shard"] == [4, 32]
  assert got["mixed"]["wq_shard"] == [16, 16]


def test_a_peer_that_never_joins_ends_the_process_with_one_line(monkeypatch, capsys):
  """``initialization_timeout_s`` passes with the peer absent: one error line naming it and
  exit status 1 (JAX's own, later deadline would abort natively, status 134)."""
  import threading

  exited = threading.Event()
  codes = []

  def blocked_join(**kw):  # jax.distributed.initialize with no peer: waits past the watch
    assert kw["initialization_timeout"] == 1 + parallel.JOIN_MARGIN_S
    assert exited.wait(30)

  monkeypatch.setattr(jax.distributed, "initialize", blocked_join)
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  cfg = parallel.DistributedConfig("127.0.0.1:1", 2, 1, initialization_timeout_s=1)
  parallel.initialize(cfg, on_timeout=lambda code: (codes.append(code), exited.set()))
  assert codes == [1]
  err = capsys.readouterr().err
  assert err.startswith("error: process 1 of 2 waited 1 s (config.distributed.initialization")
  assert "process 0 never joined" in err and err.count("\n") == 1
