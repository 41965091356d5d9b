"""Trees: topology, masks, tree verification (exact distribution and greedy), bad input."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing, trees, verify
from specjax.decode import generate
from specjax.drafters.base import Draft
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.sampling import SamplingParams
from specjax.testing import P_FAIL, P_PASS

REPETITIVE = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 5, 6, 5], [7, 1, 7, 2, 7, 1], [3, 3, 3]]
TREE = trees.Tree.from_spec((3, 2))  # 3 children of the root, 2 under each: 9 nodes, depth 2
# For the exact-distribution tests: 3 candidates at depth 1, one child each. A peaked random q
# (spread 2) makes wrong variants visible: the first child takes much of q's mass, so q and the
# renormalised q' differ a lot for its siblings.
SMALL_TREE = trees.Tree.from_spec((3, 1))


# --- topology -------------------------------------------------------------------------------


def test_tree_from_paths():
  t = trees.Tree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
  assert t.parents == (0, 0, 1, 1, 2, 3)
  assert t.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
  assert (t.max_depth, t.max_width, t.num_nodes) == (3, 3, 6)
  assert sorted(t.paths()) == [[1, 3, 6], [1, 4], [2, 5]]
  m = t.mask()
  assert m[6].tolist() == [True, True, False, True, False, False, True]
  assert m[5].tolist() == [True, False, True, False, False, True, False]
  assert not t.is_chain and trees.Tree.chain(4).is_chain


def test_tree_from_spec_is_full():
  assert TREE.num_nodes == 9 and TREE.max_depth == 2 and TREE.max_width == 6
  assert TREE.parents == (0, 0, 0, 1, 1, 2, 2, 3, 3)


def test_array_helpers_match_static_tree():
  t = trees.Tree.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
  parents = jnp.asarray([t.parents, t.parents])
  anc = trees.ancestors(parents)
  np.testing.assert_array_equal(anc[0], t.mask())
  np.testing.assert_array_equal(trees.depths(anc)[1], t.depth)
  path = trees.path_to(anc, trees.depths(anc), jnp.asarray([6, 5]), max_depth=3)
  assert path.tolist() == [[1, 3, 6], [2, 5, 0]]


@pytest.mark.parametrize(
  "paths, match",
  [
    ([], "empty"),
    ([[]], "empty"),
    ([[0], [2]], "no sibling"),
    ([[0], [0, -1]], ">= 0"),
    ([[0.5]], ">= 0"),
  ],
)
def test_malformed_paths(paths, match):
  with pytest.raises(ValueError, match=match):
    trees.Tree.from_paths(paths)


@pytest.mark.parametrize(
  "build, match",
  [
    (lambda: trees.Tree.chain(2).with_branch(0), "branch"),
    (lambda: trees.Tree.chain(2).with_branch(-1), "branch"),
    (lambda: trees.Tree.chain(-2), "chain"),
    (lambda: trees.Tree.chain(2.5), "chain"),
    (lambda: trees.Tree.from_spec((2.0, 2)), "branching"),
    (lambda: trees.Tree.from_spec((True,)), "branching"),
    (lambda: trees.Tree.from_spec(3), "branching"),
    (lambda: trees.Tree((0.5,)), "parent"),
    (lambda: trees.Tree.from_paths([0, 1]), "path 0"),
    (lambda: trees.Tree.from_paths(None), "paths"),
    (lambda: trees.Tree.from_spec((64, 64, 64, 16)), "nodes"),
    (lambda: trees.Tree.from_paths([[0] * (trees.MAX_NODES + 1)]), "nodes"),
    (lambda: trees.Tree.from_accuracy([[float("nan"), 0.5]], 2), "accuracy"),
  ],
)
def test_bad_tree_arguments_are_named(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_numpy_tree_arguments_are_taken_as_their_values():
  assert trees.Tree.from_spec(np.array([2, 2])) == trees.Tree.from_spec((2, 2))
  assert trees.Tree.chain(np.int64(3)) == trees.Tree.chain(3)
  assert trees.Tree.chain(0).num_nodes == 0


def test_parents_must_precede_children():
  with pytest.raises(ValueError, match="parent"):
    trees.Tree((0, 2, 1))


def test_tree_budget():
  TREE.check_budget(max_depth=2, max_nodes=9)
  with pytest.raises(ValueError, match="max_depth"):
    TREE.check_budget(max_depth=1, max_nodes=64)
  with pytest.raises(ValueError, match="max_nodes"):
    TREE.check_budget(max_depth=8, max_nodes=8)
  with pytest.raises(ValueError, match="branching"):
    trees.Tree.from_spec((2, 0))


# --- the verifier on its own ------------------------------------------------------------------


def test_tree_rejection_rate_is_total_variation():
  """One node: accepted with probability sum(min(p, q)) = 1 - TV(p, q)."""
  p = jnp.asarray([0.5, 0.3, 0.2, 0.0])
  q = jnp.asarray([0.1, 0.2, 0.3, 0.4])
  n = 200_000
  key_x, key_v = jax.random.split(jax.random.key(0))
  x = jax.random.categorical(key_x, jnp.log(q), shape=(n, 1)).astype(jnp.int32)
  draft = Draft(
    tokens=x, probs=jnp.broadcast_to(q, (n, 1, 4)), parents=jnp.zeros((n, 1), jnp.int32)
  )
  end, _ = verify.rejection_sample_tree(
    key_v, draft, jnp.broadcast_to(p, (n, 2, 4)), SamplingParams.create(1.0)
  )
  rate = float(jnp.mean(end == 1))
  expected = float(jnp.sum(jnp.minimum(p, q)))
  assert abs(rate - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


def test_greedy_tree_takes_longest_matching_path():
  # root -> 1 (a) -> 3 (b);  root -> 2 (a) -> 4 (c) -> 5 (d). Target argmax: a, then c, then d.
  parents = jnp.asarray([[0, 0, 1, 2, 4]])
  tokens = jnp.asarray([[0, 0, 1, 2, 3]])
  argmax = [0, 2, 2, 1, 3, 1]  # per node 0..5: what the target predicts after it
  p = jax.nn.one_hot(jnp.asarray([argmax]), 4)
  draft = Draft(tokens=tokens, parents=parents)  # deterministic candidates (one-hot q)
  end, nxt = verify.rejection_sample_tree(jax.random.key(0), draft, p, SamplingParams.create(0.0))
  assert end.tolist() == [5] and nxt.tolist() == [1]


# --- exact distribution through generate ------------------------------------------------------

KNOBS = {
  "t1": dict(temperature=1.0),
  "t1_topk4": dict(temperature=1.0, top_k=4),
  "t1_topp0.9": dict(temperature=1.0, top_p=0.9),
}


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_tree_exact_distribution(tiny_pair, knobs):
  target, _ = tiny_pair
  drafter = testing.RandomTreeDrafter(SMALL_TREE, spread=2.0)
  assert testing.exact_pvalue(target, drafter, None, knobs) > P_PASS


@pytest.mark.slow
def test_dynamic_tree_exact_distribution(tiny_pair):
  """Parents as data: each row draws one of two topologies per step."""
  target, _ = tiny_pair
  alt = trees.Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])  # 4 nodes, depth 3
  drafter = testing.RandomTreeDrafter(trees.Tree.from_spec((2, 1)), spread=2.0, alt_tree=alt)
  assert testing.exact_pvalue(target, drafter, None, dict(temperature=1.0)) > P_PASS


@pytest.mark.slow
def test_deterministic_topk_with_soft_q_fails(tiny_pair):
  """Top-k picks are not draws from q: labelling them with the soft q is not lossless."""
  target, _ = tiny_pair
  drafter = testing.RandomTreeDrafter(SMALL_TREE, spread=2.0, mode="top_soft")
  assert testing.exact_pvalue(target, drafter, None, dict(temperature=1.0)) < P_FAIL


@pytest.mark.slow
def test_verifier_without_q_renormalisation_fails(tiny_pair):
  target, _ = tiny_pair
  drafter = testing.RandomTreeDrafter(SMALL_TREE, spread=2.0)
  knobs = dict(temperature=1.0)
  assert (
    testing.exact_pvalue(target, drafter, None, knobs, verifier=testing.skip_q_renormalisation)
    < P_FAIL
  )


@pytest.mark.slow
def test_prompt_lookup_tree_and_lookahead_exact_distribution(tiny_pair):
  target, _ = tiny_pair
  knobs, prompt = dict(temperature=1.0), [1, 2, 1, 2, 1]
  lookup = PromptLookup(2, num_branches=2)
  assert testing.exact_pvalue(target, lookup, None, knobs, prompt=prompt) > P_PASS
  lookahead = Lookahead(window=3, ngram=3, num_candidates=2, pool_size=8)
  assert testing.exact_pvalue(target, lookahead, None, knobs, prompt=prompt) > P_PASS


@pytest.mark.slow
def test_typical_acceptance_is_lossy_but_greedy_at_temperature_0(tiny_pair, small_target):
  target, _ = tiny_pair
  drafter = testing.RandomTreeDrafter(SMALL_TREE, spread=2.0)
  typical = verify.TypicalAcceptance(epsilon=0.3, delta=0.3)
  assert (
    testing.exact_pvalue(target, drafter, None, dict(temperature=1.0), verifier=typical) < P_FAIL
  )
  cfg, params = small_target
  kw = dict(max_new_tokens=16, max_len=40)
  ar = generate(params, cfg, REPETITIVE, **kw)
  out = generate(params, cfg, REPETITIVE, drafter=PromptLookup(3), verifier=typical, **kw)
  assert out.tokens == ar.tokens


# --- greedy exactness, batch 1 and 4 ----------------------------------------------------------

DRAFTERS = {
  "random_tree": testing.RandomTreeDrafter(TREE, spread=3.0),
  "dynamic_tree": testing.RandomTreeDrafter(
    trees.Tree.from_spec((2, 1)),
    spread=3.0,
    alt_tree=trees.Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]]),
  ),
  "prompt_lookup_tree": PromptLookup(3, num_branches=3),
  "lookahead": Lookahead(window=4, ngram=3, num_candidates=3, pool_size=32),
}


@pytest.mark.parametrize("drafter", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_greedy_tree_drafters_equal_autoregressive(small_target, drafter):
  cfg, params = small_target
  kw = dict(max_new_tokens=32, max_len=64)
  ar = generate(params, cfg, REPETITIVE, **kw)
  out = generate(params, cfg, REPETITIVE, drafter=drafter, **kw)
  assert out.tokens == ar.tokens
  assert out.metrics["target_calls"] <= ar.metrics["target_calls"]
  for row in (0, 3):
    solo = generate(params, cfg, [REPETITIVE[row]], drafter=drafter, **kw)
    assert solo.tokens[0] == ar.tokens[row]


def test_tree_drafters_accept_tokens(small_target):
  """The trees are not vacuous: on repetitive prompts they accept draft tokens."""
  cfg, params = small_target
  kw = dict(max_new_tokens=32, max_len=64)
  for name in ("prompt_lookup_tree", "lookahead"):
    out = generate(params, cfg, REPETITIVE, drafter=DRAFTERS[name], **kw)
    assert sum(out.metrics["accept_hist"][1:]) > 0, name


# --- Lookahead internals and bad input --------------------------------------------------------


def test_lookahead_pool_skips_duplicates_and_wraps():
  la = Lookahead(window=3, ngram=3, num_candidates=1, pool_size=4)
  keys, conts = jnp.full((4,), -1), jnp.zeros((4, 2), jnp.int32)
  grams = jnp.asarray([[1, 2, 3], [1, 2, 3], [4, 5, 6]])
  keys, conts, ptr = la._insert(keys, conts, jnp.int32(0), grams)
  assert keys.tolist() == [1, 4, -1, -1] and int(ptr) == 2
  keys, conts, ptr = la._insert(keys, conts, ptr, jnp.asarray([[4, 5, 6], [7, 8, 9], [2, 2, 2]]))
  assert keys.tolist() == [1, 4, 7, 2] and conts[3].tolist() == [2, 2] and int(ptr) == 0
  keys, conts, ptr = la._insert(keys, conts, ptr, jnp.asarray([[9, 9, 8], [7, 8, 9], [7, 8, 9]]))
  assert keys.tolist() == [9, 4, 7, 2] and conts[0].tolist() == [9, 8] and int(ptr) == 1


def test_lookahead_window_mask():
  la = Lookahead(window=3, ngram=3, num_candidates=1, pool_size=4)
  offsets, mask = la._window_layout()
  assert offsets.tolist() == [1, 2, 3, 2, 3, 4]
  extras = mask[:, 1 + la.num_nodes :]
  # (level 1, column 1) sees level 0 columns 0..1 and itself.
  assert extras[4].tolist() == [True, True, False, False, True, False]
  assert mask[:, 0].all() and not mask[:, 1 : 1 + la.num_nodes].any()


@pytest.mark.parametrize(
  "kw, field",
  [
    (dict(window=0), "window"),
    (dict(ngram=1), "ngram"),
    (dict(num_candidates=0), "num_candidates"),
    (dict(num_candidates=8, pool_size=4), "pool_size"),
  ],
)
def test_bad_lookahead_config(kw, field):
  with pytest.raises(ValueError, match=field):
    Lookahead(**kw)


def test_ngram_longer_than_context(small_target):
  cfg, params = small_target
  with pytest.raises(ValueError, match="max_ngram"):
    generate(params, cfg, [[1, 2]], drafter=PromptLookup(2, max_ngram=16), max_len=16)
  with pytest.raises(ValueError, match="ngram"):
    generate(params, cfg, [[1, 2]], drafter=Lookahead(ngram=20), max_len=16)


def _valid(paths: set) -> bool:
  """Prefix-closed, with child choices 0, 1, 2, ... under every node."""
  return all(
    (len(p) == 1 or p[:-1] in paths) and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in paths)
    for p in paths
  )


@pytest.mark.parametrize("seed", range(3))
def test_tree_from_accuracy_is_the_best_tree_of_its_size(seed):
  """Against every valid tree of depth <= 2 and 3 ranks: the grown tree's expected accepted
  length is the largest for each node budget, and the reported value is that tree's."""
  rng = np.random.default_rng(seed)
  acc = -np.sort(-rng.uniform(0, 0.6, size=(2, 3)), axis=1)  # falls with the rank
  candidates = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
  prob = lambda p: np.prod([acc[d, c] for d, c in enumerate(p)])  # noqa: E731
  for n in range(1, 7):
    best = max(
      sum(prob(p) for p in subset)
      for subset in itertools.combinations(candidates, n)
      if _valid(set(subset))
    )
    tree, expected = trees.Tree.from_accuracy(acc, n)
    assert tree.num_nodes == n and np.isclose(expected, best)
    on_paths = {tuple(_choices(tree, node)) for node in range(1, n + 1)}
    assert np.isclose(sum(prob(p) for p in on_paths), expected)


def _choices(tree, node):
  """The child choices leading to ``node``."""
  out = []
  while node:
    parent = tree.parents[node - 1]
    siblings = [i for i in range(1, node) if tree.parents[i - 1] == parent]
    out.append(len(siblings))
    node = parent
  return out[::-1]


def test_tree_from_accuracy_rejects_bad_tables():
  with pytest.raises(ValueError, match="accuracy"):
    trees.Tree.from_accuracy([[1.5]], 2)
  with pytest.raises(ValueError, match="num_nodes"):
    trees.Tree.from_accuracy([[0.5]], 0)


@pytest.mark.parametrize("spec", [(1,), (3, 2, 1), (2, 1, 2)])
def test_choices_are_the_path_list_the_tree_is_built_from(spec):
  tree = trees.Tree.from_spec(spec)
  assert trees.Tree.from_paths(tree.choices()) == tree
  assert len(tree.choices()) == tree.num_nodes


@pytest.mark.parametrize(
  "paths",
  [((0,),), ((0,), (1,), (0, 0), (0, 1), (0, 2), (1, 0))],
  ids=["one_node_chain", "uneven_tree"],
)
def test_static_tree_drafts_rank_with_top_k_not_a_sort(paths):
  """XLA on a CPU turns a top-k whose result is sliced into a sort of every position (a
  1-chain over a block of 7 positions cost 14 ms instead of 4). Both static drafts, each
  depth's logits and the Markov head's level-by-level draws, compile to top-k alone."""
  from specjax.drafters import static_tree
  from specjax.drafters.base import DraftContext

  tree = trees.Tree.from_paths(paths)
  ctx = DraftContext(tokens=jnp.ones((1, 16), jnp.int32), lengths=jnp.asarray([4], jnp.int32),
                     key=jax.random.key(0), sampling=SamplingParams.create(0.0),
                     vocab_size=256)  # fmt: skip
  logits = jax.random.normal(jax.random.key(1), (1, 7, 256))

  def by_parent(x):
    children = lambda level, tok, state: (x[:, level, None] + 0 * tok[..., None], state)  # noqa: E731
    return static_tree.draft_by_parent(tree, children, jnp.ones((1,), jnp.int32),
                                       jnp.zeros((1, 2)), False, ctx).tokens  # fmt: skip

  for fn in (lambda x: static_tree.draft(tree, x, False, ctx).tokens, by_parent):
    compiled = jax.jit(fn).lower(logits).compile().as_text()
    assert " sort(" not in compiled and "TopK" in compiled
