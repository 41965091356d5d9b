"""Medusa heads: candidates, the features they read, saving/loading, training, bad input.

Exact-distribution tests (multi-step, ragged, stop ids; top-k, top-p, reduced vocabulary) and
their broken verifiers are in test_lossless.py with every other drafter's.
"""

import dataclasses
import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import config_dict

from configs import train_tiny
from specjax import build, losses, metrics, testing
from specjax.decode import generate
from specjax.drafters import medusa
from specjax.drafters.base import DraftContext, Verdict
from specjax.models import source, tiny
from specjax.sampling import SamplingParams
from specjax.tasks import medusa_tree, train
from specjax.train import objectives
from specjax.trees import Tree

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13]]
TREE = Tree.from_spec((3, 2, 1))


@pytest.mark.parametrize("sampled", [False, True], ids=["top_k", "sampled"])
@pytest.mark.parametrize("vocab_ids", [None, tuple(range(0, 64, 2))], ids=["full", "reduced"])
def test_greedy_equals_autoregressive(small_target, sampled, vocab_ids):
  """Batch 4, ragged prompts, a stop id: the tokens are AR's, and the trees do get accepted."""
  cfg, params = small_target
  kw = dict(max_new_tokens=24, max_len=48, eos_id=[5])
  ar = generate(params, cfg, PROMPTS, **kw)
  drafter, dparams = testing.medusa_drafter(cfg, TREE, 3, vocab_ids, sampled=sampled, scale=0.3)
  out = generate(params, cfg, PROMPTS, drafter=drafter, drafter_params=dparams, **kw)
  assert out.tokens == ar.tokens


def test_heads_draft_from_the_newest_feature_by_depth_and_rank(small_target):
  """Node i takes head depth(i)'s rank(i)-th token from the state h; commit keeps the verdict's
  feature at index n (the state whose logits gave the next token)."""
  cfg, _ = small_target
  drafter, params = testing.medusa_drafter(cfg, TREE, 3, sampled=False)
  h_BxF = jax.random.normal(jax.random.key(2), (2, cfg.dim))
  draft, _ = drafter.propose(params, h_BxF, None)
  order = np.argsort(-np.asarray(medusa.head_logits(params, h_BxF)), axis=-1)  # [B, H, V]
  depth, rank = TREE.depth[1:] - 1, [0, 1, 2] + [0, 1] * 3 + [0] * 6
  np.testing.assert_array_equal(draft.tokens, order[:, depth, rank])
  np.testing.assert_array_equal(draft.parents[0], TREE.parents)

  features = jax.random.normal(jax.random.key(3), (2, TREE.max_depth + 1, cfg.dim))
  n = jnp.array([0, 2])
  verdict = Verdict(n, jnp.zeros((2, TREE.max_depth), jnp.int32), n, features)
  kept = drafter.commit(h_BxF, verdict, None)
  np.testing.assert_array_equal(kept, features[jnp.arange(2), n])


@pytest.mark.parametrize("sampled", [False, True], ids=["top_k", "sampled"])
@pytest.mark.slow
def test_lookup_branch_is_the_roots_last_child_and_stays_greedy(small_target, sampled):
  """The lookup guess follows the heads' nodes as a chain from the root (longer than the heads'
  tree, so it sets the step's depth); batch 4, ragged prompts, a stop id: the tokens are AR's,
  and on prompts that repeat themselves the branch is accepted."""
  cfg, params = small_target
  tree = Tree.from_spec((2, 1))
  drafter, dparams = testing.medusa_drafter(cfg, tree, 2, sampled=sampled, scale=0.3, lookup=4)
  assert (drafter.num_nodes, drafter.num_draft) == (8, 4)
  assert drafter.nodes.parents == (0, 0, 1, 2, 0, 5, 6, 7)
  prompt = [7, 8, 9, 10, 11, 7, 8, 9]  # a 3-gram match: lookup guesses 10, 11, 7, 8
  ctx = DraftContext(
    tokens=jnp.asarray([prompt + [0] * 8]), lengths=jnp.asarray([len(prompt) - 1]),
    key=jax.random.key(0), sampling=SamplingParams.create(temperature=1.0),
    vocab_size=cfg.vocab_size,
  )  # fmt: skip
  h_BxF = jax.random.normal(jax.random.key(2), (1, cfg.dim))
  draft, _ = drafter.propose(dparams, h_BxF, ctx)
  heads_only, _ = dataclasses.replace(drafter, lookup=None).propose(dparams, h_BxF, ctx)
  np.testing.assert_array_equal(draft.tokens[:, :4], heads_only.tokens)
  assert draft.tokens[0, 4:].tolist() == [10, 11, 7, 8]
  assert draft.parents[0].tolist() == list(drafter.nodes.parents)
  if sampled:  # the heads' q as before; the guesses' q is one-hot
    np.testing.assert_array_equal(draft.probs[:, :4], heads_only.probs)
    np.testing.assert_array_equal(draft.probs[0, 4:], jax.nn.one_hot([10, 11, 7, 8], 64))
  kw = dict(max_new_tokens=24, max_len=48, eos_id=[5])
  prompts = PROMPTS + [prompt * 2]
  ar = generate(params, cfg, prompts, **kw)
  out = generate(params, cfg, prompts, drafter=drafter, drafter_params=dparams, **kw)
  assert out.tokens == ar.tokens
  plain = dataclasses.replace(drafter, lookup=None)
  without = generate(params, cfg, prompts, drafter=plain, drafter_params=dparams, **kw)
  assert out.metrics["target_calls"] < without.metrics["target_calls"]


def test_untrained_heads_are_the_targets_head(small_target):
  """Identity residual layers and the target's head: every untrained head predicts what the
  target itself predicts from h."""
  cfg, params = small_target
  heads = medusa.HeadsConfig(cfg.dim, 2, cfg.vocab_size, cfg.vocab_size)
  hp = medusa.init_heads(heads, params, cfg, np.arange(cfg.vocab_size))
  h = jax.random.normal(jax.random.key(0), (3, cfg.dim))
  want = h @ medusa.target_head(params, cfg).T
  got = medusa.head_logits(hp, h)
  np.testing.assert_allclose(got, jnp.stack([want, want], axis=1), rtol=1e-5, atol=1e-5)


def test_medusa_loss_is_minimal_for_heads_that_copy_the_target():
  """Head k's labels are the target's distribution k positions later, within a document."""
  key = jax.random.key(0)
  t_logits = 3 * jax.random.normal(key, (2, 9, 7))
  mask = jnp.ones((2, 9)).at[:, -1].set(0).at[0, 4].set(0)  # a document boundary in row 0
  ids = jnp.arange(7)
  heads = jnp.stack([jnp.roll(t_logits, -k, axis=1) for k in (1, 2)], axis=2)  # [B, T, 2, V]
  xent = jax.jit(lambda heads: losses.medusa_xent(t_logits, heads, ids, mask, decay=0.5))
  loss, m = xent(heads)
  assert m["top1_1"] == 1 and m["top1_2"] == 1 and m["top5_2"] == 1
  noisy = heads + jax.random.normal(jax.random.key(1), heads.shape)
  loss_noisy, m_noisy = xent(noisy)
  assert loss_noisy > loss and m_noisy["top1_1"] < 1
  # Positions whose label crosses the boundary do not count: garbage there changes nothing.
  spoiled = heads.at[0, 3, 0].set(100 * jax.random.normal(key, (7,)))
  assert xent(spoiled)[0] == loss


def _tiny_target():
  return source.Model(*tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=3))


def test_saved_heads_load_and_decode_the_same(tmp_path):
  target = _tiny_target()
  drafter, params = testing.medusa_drafter(target.cfg, TREE, 3, tuple(range(40)), seed=4)
  medusa.save(tmp_path / "heads", drafter.heads, params, target, TREE)
  heads, loaded, meta = medusa.load(tmp_path / "heads", target)
  assert heads == drafter.heads and meta["tree"] == list(TREE.parents)
  # Heads saved beside a float32 target load beside the same target in bfloat16 (the dtype
  # on an accelerator): the fingerprint does not depend on the dtype.
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), target.params)
  medusa.load(tmp_path / "heads", dataclasses.replace(target, params=bf16))
  kw = dict(max_new_tokens=12, max_len=32)
  a = generate(target.params, target.cfg, PROMPTS, drafter=drafter, drafter_params=params, **kw)
  b = generate(target.params, target.cfg, PROMPTS, drafter=drafter, drafter_params=loaded, **kw)
  assert a.tokens == b.tokens and a.metrics["target_calls"] == b.metrics["target_calls"]
  assert not list(tmp_path.glob(".*tmp"))  # written atomically


def _medusa_config(max_nodes=None, **drafter):
  c = train_tiny.get_config()
  c.drafter.name = "medusa"
  c.drafter.medusa.update(drafter)
  if max_nodes is not None:
    c.drafter.max_nodes = max_nodes
  return c


def _bad_inputs(tmp_path):
  """(field the error must name, a call that must raise ValueError)."""
  target = _tiny_target()
  drafter, params = testing.medusa_drafter(target.cfg, TREE, 3, seed=4)
  medusa.save(tmp_path / "heads", drafter.heads, params, target, TREE)
  other = source.Model(*tiny.random_model(seed=1, vocab_size=64, dim=32, num_layers=3))
  wide = source.Model(*tiny.random_model(seed=0, vocab_size=64, dim=48, num_layers=3))
  with_eos = SimpleNamespace(cfg=target.cfg, tokenizer=SimpleNamespace(stop_ids={63}))
  return {
    "tree deeper than the heads": (
      "tree_spec",
      lambda: build.check(_medusa_config(num_heads=2, tree_spec=(2, 2, 2))),
    ),
    "tree deeper than the heads (constructor)": (
      "only 2 heads",
      lambda: medusa.Medusa(dataclasses.replace(drafter.heads, num_heads=2), TREE),
    ),
    "malformed paths": (
      "drafter.medusa.tree_paths",
      lambda: build.check(_medusa_config(tree_paths=((0,), (0, 1)))),
    ),
    "unknown candidates": (
      "drafter.medusa.candidates",
      lambda: build.check(_medusa_config(candidates="beam")),
    ),
    "negative lookup branch": (
      "drafter.medusa.lookup must be an integer >= 0",
      lambda: build.check(_medusa_config(lookup=-1)),
    ),
    "lookup branch over the node budget": (
      "max_nodes",
      lambda: build.check(_medusa_config(tree_spec=(2, 1), lookup=4, max_nodes=7)),
    ),
    "heads of another hidden size": ("hidden size", lambda: medusa.load(tmp_path / "heads", wide)),
    "heads of another target": ("fingerprint", lambda: medusa.load(tmp_path / "heads", other)),
    "no heads there": ("medusa.json", lambda: medusa.load(tmp_path, target)),
    "vocabulary without EOS": (
      "stop token",
      lambda: medusa.check_vocab(np.arange(40), with_eos, "vocab"),
    ),
    "an unknown token loss": (
      "objective.medusa.loss='l2' is unknown",
      lambda: objectives.registry()["medusa"].check(_objective_with(loss="l2")),
    ),
  }


def _objective_with(**fields):
  c = objectives.registry()["medusa"].config()
  c.update(fields)
  return c


@pytest.mark.parametrize(
  "case", ["tree deeper than the heads", "tree deeper than the heads (constructor)",
           "malformed paths", "unknown candidates", "negative lookup branch",
           "lookup branch over the node budget", "heads of another hidden size",
           "heads of another target", "no heads there", "vocabulary without EOS",
           "an unknown token loss"],
)  # fmt: skip
def test_bad_input_is_one_clear_error(tmp_path, case):
  field, call = _bad_inputs(tmp_path)[case]
  with pytest.raises(ValueError, match=field):
    call()


@pytest.mark.slow
def test_training_heads_raises_tau(tmp_path):
  """Medusa-1 on a random tiny target's own text: the heads' accuracy and tau rise, and the
  exported heads decode through ``drafter.medusa.path`` with the tau the run reported."""
  c = _medusa_config(tree_spec=(2, 2, 1))
  c.objective = objectives.default_config("medusa")
  c.objective.medusa.vocab_size = 200  # reduced: the 200 most frequent tokens
  c.workdir = str(tmp_path / "run")
  c.optim.learning_rate = 1e-2
  record = train.run(c)
  init, final = record["decode"]["init"], record["decode"]["final"]
  assert final["tau"] > init["tau"] + 0.05, (init, final)
  log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  logged = [m for m in log if "top1_1" in m]
  assert logged[-1]["top1_1"] > logged[0]["top1_1"]

  c.drafter.medusa.path = str(tmp_path / "run" / "draft_final")
  target = build.target(c)
  drafter, params = build.drafter(c, target)
  assert drafter.heads.vocab_size == 200 and len(params["vocab_ids"]) == 200
  req = build.request(c, target)
  outs = [
    generate(target.params, target.cfg, b, drafter=drafter, drafter_params=params,
             **req.generate_kwargs())
    for b in req.batches()
  ]  # fmt: skip
  assert metrics.summarize(metrics.merge([o.counts for o in outs]))["tau"] == final["tau"]

  # Training can continue from saved heads: same tensors, same draft vocabulary.
  c.objective.medusa.init_from = c.drafter.medusa.path
  objectives.check(c)
  again = objectives.build(c, target.cfg).with_data(None, None)
  start = again.init(jax.random.key(0), target.params)
  np.testing.assert_array_equal(start["res_w"], params["res_w"])
  assert again.vocab_ids == tuple(np.asarray(params["vocab_ids"]).tolist())
  c.objective.medusa.num_layers = 2
  with pytest.raises(ValueError, match="init_from.*num_layers"):
    objectives.check(c)

  # The tree grown from held-out accuracy and the verify cost is saved with the heads and used.
  c.task, c.output_dir = "medusa_tree", str(tmp_path / "tree")
  c.medusa_tree = config_dict.ConfigDict({"budgets": (2, 4, 6), "ranks": 3, "context": 16})
  for field, bad in (("ranks", 0), ("context", -1)):  # were refused late, or saved a tree
    wrong = c.copy_and_resolve_references()
    wrong.medusa_tree[field] = bad
    with pytest.raises(ValueError, match=rf"config.medusa_tree.{field} must be an integer >= "):
      medusa_tree.run(wrong)
  got = medusa_tree.run(c)
  acc = np.asarray(got["rank_accuracy"])
  assert acc.shape == (4, 3) and acc[0, 0] > acc[0, 2] and got["held_out_positions"] > 500
  chosen = next(r for r in got["budgets"] if r["nodes"] == got["chosen"])
  with pytest.raises(ValueError, match=r"tree_spec=\(2, 2, 1\) would not decode: the heads"):
    build.drafter(c, target)  # the config's tree beside the saved one (was ignored unsaid)
  c.drafter.medusa.tree_spec = medusa.Medusa.config().tree_spec
  drafter, _ = build.drafter(c, target)
  assert drafter.tree.parents == tuple(chosen["parents"]) and drafter.num_nodes == got["chosen"]
