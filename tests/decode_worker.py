"""Decoding on an emulated device mesh in its own process (the device count is fixed at start).

    python tests/decode_worker.py '{"layouts": {"tensor": {"data": 1, "tensor": 8}}}'

Prints one line ``RESULT {json}``: per drafter and layout the greedy tokens, the shard shape of
one attention weight and of the KV cache (to show the layout really splits them), and the
all-gathers in the compiled program whose result has a weight's full shape; with ``"exact"``
also the exact-distribution p-values of an EAGLE sampled tree on the mesh, correct and broken;
with ``"load_onto": layout`` whether the target, saved as a two-shard HF checkpoint and loaded
onto that layout's mesh, arrives with ``placement.place``'s shardings and the same values.
``cases()`` is imported by the tests, which run the one-device reference in their own process.
"""

import json
import re
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from specjax import parallel, placement, testing
from specjax.decode import compiled, generate
from specjax.drafters import DraftModel, PromptLookup
from specjax.models import llama, tiny
from specjax.trees import Tree

# Every split dimension (heads, kv heads, MLP width, vocab) divides by 8; weight shapes differ.
TARGET = tiny.random_model(
  seed=0, vocab_size=96, dim=32, num_layers=3, num_heads=8, num_kv_heads=8, ffn_dim=80,
  logit_std=3.0, residual_scale=0.2,
)  # fmt: skip
PROMPTS = [[5, 6, 7, 5, 6], [1], [9, 8, 7, 6, 5, 4, 3], [2, 2], [40, 41], [7, 7, 7], [3], [90, 1]]
KW = dict(max_new_tokens=24, max_len=40)
LAYOUTS = {
  "data": {"data": 8},
  "tensor": {"data": 1, "tensor": 8},
  "mixed": {"data": 2, "tensor": 4},
}
# The drafters decoded in each layout: every one where rows and heads are both split; the draft
# model and EAGLE (the drafters with a KV cache of their own) in every layout.
LAYOUT_DRAFTERS = {"data": ("draft_model", "eagle_tree"), "tensor": ("draft_model", "eagle_tree")}
# The exact-distribution case in its multi-step form: vocab 6 (the tensor axis splits kv heads,
# vocab and MLP by 2), five tokens per sample over several speculative steps, three ragged
# prompts in every batch, a stop id.
V6_TARGET = tiny.random_model(seed=7, vocab_size=6, num_heads=2, num_kv_heads=2)
V6_PROMPTS, V6_STOP = ([1, 2, 1, 2], [3], [0, 2, 2, 1, 3, 0]), (4,)
EXACT_LAYOUT = {"data": 4, "tensor": 2}


def cases() -> dict:
  """Drafter name -> (drafter, params): a draft model and four tree drafters (prompt lookup,
  EAGLE, the published EAGLE-3 architecture with a reduced vocabulary, Medusa)."""
  dcfg, dparams = tiny.truncated(*TARGET, num_layers=1)
  return {
    "draft_model": (DraftModel(dcfg, 3), dparams),
    "prompt_lookup_tree": (PromptLookup(3, max_ngram=2, num_branches=2), None),
    "eagle_tree": testing.eagle_drafter(TARGET, top_k=2, depth=3, total=5, sampled=False),
    "eagle3_tree": testing.eagle_drafter(
      TARGET,
      2,
      3,
      5,
      tuple(range(0, 96, 2)),
      sampled=False,
      features=(0, 1, 2),
      architecture="eagle3",
    ),  # fmt: skip
    "medusa_tree": testing.medusa_drafter(TARGET[0], Tree.from_spec((2, 2)), 2, sampled=False),
  }


def run(drafter, dparams, mesh=None):
  return generate(TARGET[1], TARGET[0], PROMPTS, drafter=drafter, drafter_params=dparams,
                  mesh=mesh, **KW)  # fmt: skip


def weight_gathers(drafter, dparams, mesh) -> list[str]:
  """All-gathers in the compiled program whose result is a whole weight of the target."""
  hlo = compiled(TARGET[1], TARGET[0], PROMPTS, drafter=drafter, drafter_params=dparams,
                 mesh=mesh, **KW).as_text()  # fmt: skip
  shapes = {"[" + ",".join(map(str, x.shape)) + "]" for x in jax.tree.leaves(TARGET[1])}
  gathered = re.findall(r"= \w+(\[[\d,]*\])\S* all-gather\(", hlo)
  return [g for g in gathered if g in shapes and g.count(",") == 1]


def load_onto(mesh, directory) -> dict:
  """The target saved as a two-shard HF checkpoint, loaded straight onto ``mesh``: shardings
  and values against ``placement.place``, and (the check's teeth) the same load without a mesh."""
  from safetensors.numpy import save_file

  from specjax.models import checkpoint, export

  cfg, params = TARGET
  export.save_model(directory, cfg, params)
  tensors = dict(export.hf_tensors(cfg, params))
  (directory / "model.safetensors").unlink()
  names, index = sorted(tensors), {}
  for k in range(2):
    file = f"model-{k + 1:05d}-of-00002.safetensors"
    save_file({n: tensors[n] for n in names[k::2]}, str(directory / file))
    index |= dict.fromkeys(names[k::2], file)
  (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
  want = jax.tree.leaves(placement.place(params, llama.RULES, mesh))
  got = jax.tree.leaves(checkpoint.load_safetensors(directory, np.float32, mesh)[1])
  plain = jax.tree.leaves(checkpoint.load_safetensors(directory, np.float32)[1])
  same = lambda xs: all(a.sharding == b.sharding for a, b in zip(xs, want, strict=True))  # noqa: E731
  return {
    "same_shardings": same(got),
    "same_values": all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)),
    "without_mesh_same_shardings": same(plain),
  }


def main(args: dict) -> dict:
  out: dict = {"tokens": {}, "shards": {}, "weight_gathers": {}}
  for name, layout in args.get("layouts", {}).items():
    mesh = placement.mesh_for(parallel.MeshConfig(**layout))
    placed = placement.place(TARGET[1], llama.RULES, mesh)
    out["shards"][name] = list(placed["layers"][0]["wq"].addressable_shards[0].data.shape)
    for drafter_name, (drafter, dparams) in cases().items():
      if drafter_name not in LAYOUT_DRAFTERS.get(name, (drafter_name,)):
        continue
      got = run(drafter, dparams, mesh)
      out["tokens"][f"{drafter_name}/{name}"] = got.tokens
      out["tokens"][f"{drafter_name}/{name}/tau"] = got.metrics["tau"]
    out["weight_gathers"][name] = weight_gathers(*cases()["draft_model"], mesh)
    if args.get("load_onto") == name:
      with tempfile.TemporaryDirectory() as d:
        out["load_onto"] = load_onto(mesh, Path(d))
  if args.get("fsdp_check"):  # the check's teeth: weights split over fsdp are gathered every step
    fsdp = parallel.make_mesh(parallel.MeshConfig(data=1, fsdp=8))
    out["weight_gathers"]["fsdp"] = weight_gathers(*cases()["draft_model"], fsdp)
  if args.get("exact"):
    mesh = placement.mesh_for(parallel.MeshConfig(**EXACT_LAYOUT))
    drafter, dparams = testing.eagle_drafter(V6_TARGET, top_k=2, depth=2, total=3)
    kw = dict(prompts=V6_PROMPTS, num_new=5, stop_ids=V6_STOP, calls=1, mesh=mesh)  # 4,000 rows
    knobs = dict(temperature=1.0, top_k=5)
    out["exact"] = testing.exact_pvalues(V6_TARGET, drafter, dparams, knobs, **kw)
    out["exact_broken"] = testing.exact_pvalues(
      V6_TARGET, drafter, dparams, knobs, verifier=testing.keep_rejected_candidate, **kw
    )
  return out


if __name__ == "__main__":
  result = main(json.loads(sys.argv[1]))
  print("RESULT " + json.dumps(result, default=lambda x: np.asarray(x).tolist()))
