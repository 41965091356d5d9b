"""Exact-distribution tests: speculative sampling reproduces the target's distribution.

Each test samples rows through the real batched ``generate`` path and compares their histogram
with the target's enumerated distribution (``specjax.testing``) by a chi-square test; cells
with expected count < 5 are pooled. A correct sampler must give p > 1e-3 (Bonferroni-divided
over the prompts checked; seeds are fixed, so the run is repeatable); each deliberately broken
verifier must give p < 1e-6.

Two kinds of case:

* three tokens after one prompt (vocab 8), with K >= 2: the acceptance rule itself;
* state carried across steps (vocab 5): five tokens with K = 1 or depth-1 trees, so several
  speculative steps shape every sample, three prompts of different lengths in one batch (each
  checked on its own), and a stop id the model emits mid-sample. What a drafter carries from
  step to step (its cache, the tree compaction, the Lookahead pool) then decides sampled
  tokens. Every drafter gets this case.
"""

import jax
import jax.numpy as jnp
import pytest

from specjax import testing, trees
from specjax.drafters import DraftModel, Lookahead, NoDraft, PromptLookup
from specjax.models import llama, tiny
from specjax.testing import P_FAIL, P_PASS

KNOBS = {
  "t1": dict(temperature=1.0),
  "t0.7_topk3": dict(temperature=0.7, top_k=3),
  "t1_topp0.8": dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_exact_distribution_independent_draft(tiny_pair, knobs):
  target, (dcfg, dparams) = tiny_pair
  assert testing.exact_pvalue(target, DraftModel(dcfg, 2), dparams, knobs) > P_PASS


@pytest.mark.slow
def test_exact_distribution_truncated_draft(tiny_pair):
  """A draft close to the target accepts often: exercises the multi-token and bonus paths."""
  target, _ = tiny_pair
  dcfg, dparams = tiny.truncated(*target, num_layers=1)
  assert testing.exact_pvalue(target, DraftModel(dcfg, 3), dparams, dict(temperature=1.0)) > P_PASS


def test_autoregressive_exact_distribution(tiny_pair):
  """The K = 0 loop (the baseline every speedup is measured against) samples the target too."""
  target, _ = tiny_pair
  assert testing.exact_pvalue(target, NoDraft(), None, dict(temperature=1.0)) > P_PASS


BROKEN = {
  "resample_from_target": testing.resample_from_target,
  "accept_with_target_prob": testing.accept_with_target_prob,
}


@pytest.mark.parametrize("verifier", BROKEN.values(), ids=BROKEN.keys())
def test_broken_verifier_fails(tiny_pair, verifier):
  """The same test, run on a wrong verifier, must reject it: the test has teeth."""
  target, (dcfg, dparams) = tiny_pair
  knobs = dict(temperature=1.0)
  assert testing.exact_pvalue(target, DraftModel(dcfg, 2), dparams, knobs, verifier) < P_FAIL


# --- state carried across steps: vocab 5, five tokens, ragged prompts, a stop id --------------

V5_PROMPTS = ([1, 2, 1, 2], [3], [0, 2, 2, 1, 3, 0])
V5_STOP = (4,)
V5_CFG = tiny.tiny_config(vocab_size=5)
V5_TARGET = tiny.random_model(seed=7, vocab_size=5)  # the v5_pair target
MEDUSA_TREE = trees.Tree.from_spec((2, 1))  # two sampled children, one grandchild each


@pytest.fixture(scope="module")
def v5_pair():
  """Vocab 5 target (stop id 4 has mass ~0.2 somewhere) and an independent draft."""
  return tiny.random_model(seed=7, vocab_size=5), tiny.random_model(seed=8, vocab_size=5)


# Samples: calls of V5_ROWS rows, the three prompts cycled (rows x calls / 3 per prompt). Sized by
# the broken variants' chi-square statistics measured at 10,000 rows per prompt
# (notes/testing-diary.md, "Sample counts"): the two that move a lookup branch (medusa_lookup_first,
# statistic 328 on 121 degrees of freedom; eagle_lookup_first) need 0.57 and 0.25 of that to reach p
# = 1e-9 in expectation, so a drafter with a lookup branch draws 5,000 per prompt; every other
# variant needs 0.23 or less, so other drafters draw 3,000 (skip_q_renormalisation, the weakest of
# them, expects p = 1e-13 there). Each broken test below runs at its drafter's count and fails below
# P_FAIL; a correct sampler passes at any count.
V5_ROWS, V5_CALLS, V5_CALLS_LOOKUP = 3000, 3, 5


def _v5_pvalues(target, drafter, dparams, verifier=None, knobs=None, forward_rows=0):
  kw = {} if verifier is None else {"verifier": verifier}  # None: the default, lossless one
  kw["forward_rows"] = forward_rows
  calls = V5_CALLS if getattr(drafter, "lookup", None) is None else V5_CALLS_LOOKUP
  return testing.exact_pvalues(
    target,
    drafter,
    dparams,
    knobs or dict(temperature=1.0),
    prompts=V5_PROMPTS,
    num_new=5,
    rows=V5_ROWS,
    calls=calls,
    stop_ids=V5_STOP,
    **kw,
  )


STATEFUL = {
  "autoregressive": lambda d: (NoDraft(), None),
  "draft_model_k1": lambda d: (DraftModel(d[0], 1), d[1]),
  "draft_model_k2": lambda d: (DraftModel(d[0], 2), d[1]),
  "prompt_lookup_k1": lambda d: (PromptLookup(1), None),
  "prompt_lookup_tree_2x1": lambda d: (PromptLookup(1, num_branches=2), None),
  "prompt_lookup_abstaining": lambda d: (PromptLookup(1, min_ngram=2), None),
  "lookahead_depth1": lambda d: (Lookahead(window=2, ngram=2, num_candidates=2, pool_size=8), None),
  "random_tree_3": lambda d: (testing.RandomTreeDrafter(trees.Tree((0, 0, 0)), spread=2.0), None),
  "top_one_hot_tree_3": lambda d: (
    testing.RandomTreeDrafter(trees.Tree((0, 0, 0)), spread=2.0, mode="top_one_hot"),
    None,
  ),
  # Medusa heads read the target's feature of the newest token, carried across steps.
  "medusa_sampled_2x1": lambda d: testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2),
  "medusa_top_k_2x1": lambda d: testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2, sampled=False),
  "medusa_reduced_vocab": lambda d: testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2, (0, 2, 4)),
  # ... with prompt lookup's 2-token guess as the root's last child (one-hot q).
  "medusa_sampled_lookup": lambda d: testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2, lookup=2),
  # EAGLE reads the target's features of the accepted tokens and keeps its own cache; its
  # dynamic tree (2 children per expanded node, 3 of the 6 offered nodes kept) differs per row.
  "eagle_sampled_2x2_3": lambda d: testing.eagle_drafter(V5_TARGET, 2, 2, 3),
  "eagle_top_k_2x2_3": lambda d: testing.eagle_drafter(V5_TARGET, 2, 2, 3, sampled=False),
  "eagle_reduced_vocab": lambda d: testing.eagle_drafter(V5_TARGET, 2, 2, 3, (0, 2, 4)),
  # ... with prompt lookup's 2-token guess as the root's last child (one-hot q).
  "eagle_sampled_lookup": lambda d: testing.eagle_drafter(V5_TARGET, 3, 2, 5, lookup=2),
  "eagle_top_k_lookup": lambda d: testing.eagle_drafter(
    V5_TARGET, 3, 2, 5, sampled=False, lookup=2
  ),  # fmt: skip
  # DFlash: one block forward drafts every depth (its q per depth is the same whatever was
  # drafted above); the context is the target's features of the committed tokens, carried.
  "dflash_sampled_chain": lambda d: testing.dflash_drafter(V5_TARGET, trees.Tree.chain(2), 3),
  "dflash_sampled_tree": lambda d: testing.dflash_drafter(V5_TARGET, MEDUSA_TREE, 3),
  "dflash_top_k_tree": lambda d: testing.dflash_drafter(V5_TARGET, MEDUSA_TREE, 3, sampled=False),
  "dflash_sampled_lookup": lambda d: testing.dflash_drafter(V5_TARGET, MEDUSA_TREE, 3, lookup=2),
  "dflash_reduced_vocab": lambda d: testing.dflash_drafter(
    V5_TARGET, MEDUSA_TREE, 3, vocab_ids=(0, 2, 4)
  ),  # fmt: skip
  # DSpark: DFlash whose anchor position drafts too, with a Markov head: a node's children draw
  # under its token (q per parent), the rnn kind carrying a state down each path.
  "dspark_sampled_tree": lambda d: testing.dflash_drafter(
    V5_TARGET, MEDUSA_TREE, 2, markov_rank=4, sample_from_anchor=True
  ),  # fmt: skip
  "dspark_rnn_chain": lambda d: testing.dflash_drafter(
    V5_TARGET, trees.Tree.chain(3), 3, markov_rank=4, markov_head="rnn", sample_from_anchor=True
  ),  # fmt: skip
  # P-EAGLE: the EAGLE-3 layer drafts every depth in one forward (the newest pair, then masked
  # rows); its cache of committed pairs is carried across steps.
  "peagle_sampled_chain": lambda d: testing.peagle_drafter(V5_TARGET, trees.Tree.chain(2), 2),
  "peagle_reduced_vocab_tree": lambda d: testing.peagle_drafter(
    V5_TARGET, MEDUSA_TREE, 2, vocab_ids=(0, 2, 4)
  ),  # fmt: skip
  "peagle_sampled_lookup": lambda d: testing.peagle_drafter(V5_TARGET, MEDUSA_TREE, 2, lookup=2),
  # The published EAGLE-1 architecture (no input norm, no final norm), sampled candidates (its
  # EAGLE-3 sibling with a reduced vocabulary: test_interop_eagle.py, imported).
  "eagle1_official_sampled": lambda d: testing.eagle_drafter(
    V5_TARGET, 2, 2, 3, architecture="eagle1"
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize("make", STATEFUL.values(), ids=STATEFUL.keys())
def test_exact_distribution_across_steps(v5_pair, make):
  target, draft = v5_pair
  drafter, dparams = make(draft)
  pvalues = _v5_pvalues(target, drafter, dparams)
  assert min(pvalues) > P_PASS / len(pvalues), pvalues


def _check(pvalues, broken: bool) -> None:
  """The correct sampler passes every prompt's test (Bonferroni); a broken one fails one."""
  if broken:
    assert min(pvalues) < P_FAIL, pvalues
  else:
    assert min(pvalues) > P_PASS / len(pvalues), pvalues


# bfloat16 weights and caches (the accelerator default; float32 activations, bfloat16 products
# accumulated in float32): the same carried-state case with the target and the drafter's weights
# cast, against the bfloat16 target's own enumerated distribution. One chain, one Medusa and one
# EAGLE tree, sampled with the lookup branch; the broken EAGLE verifier shows the case's teeth
# in this dtype too.
BF16 = {
  "draft_model_k2": (STATEFUL["draft_model_k2"], None),
  "medusa_sampled_lookup": (STATEFUL["medusa_sampled_lookup"], None),
  "eagle_sampled_lookup": (STATEFUL["eagle_sampled_lookup"], None),
  "eagle_keep_rejected_candidate": (
    STATEFUL["eagle_sampled_2x2_3"],
    testing.keep_rejected_candidate,
  ),
  "dflash_keep_rejected_candidate": (
    STATEFUL["dflash_sampled_tree"],
    testing.keep_rejected_candidate,
  ),
  "dflash_chain_resample_from_target": (
    STATEFUL["dflash_sampled_chain"],
    testing.resample_from_target,
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize("make, verifier", BF16.values(), ids=BF16)
def test_exact_distribution_in_bfloat16(v5_pair, make, verifier):
  bf16 = lambda params: None if params is None else llama.cast(params, jnp.bfloat16)  # noqa: E731
  (tcfg, tparams), (dcfg, dparams) = v5_pair
  drafter, params = make((dcfg, dparams))
  params, target = bf16(params), (tcfg, bf16(tparams))
  floats = {
    x.dtype for x in jax.tree.leaves((params, target[1])) if jnp.issubdtype(x.dtype, jnp.floating)
  }
  assert floats == {jnp.dtype(jnp.bfloat16)}
  pvalues = _v5_pvalues(target, drafter, params, verifier)
  _check(pvalues, broken=verifier is not None)


# Every target forward at one shape (``forward_rows``: the step's rows plus two filler rows,
# the new K/V read at their cache slots): an EAGLE tree with the lookup branch, the one-token
# steps of an abstaining lookup, and the broken EAGLE verifier (must fail).
ONE_SHAPE = {
  "eagle_sampled_lookup": (STATEFUL["eagle_sampled_lookup"], None),
  "prompt_lookup_abstaining": (STATEFUL["prompt_lookup_abstaining"], None),
  "eagle_keep_rejected_candidate": (
    STATEFUL["eagle_sampled_2x2_3"],
    testing.keep_rejected_candidate,
  ),
  "dflash_keep_rejected_candidate": (
    STATEFUL["dflash_sampled_tree"],
    testing.keep_rejected_candidate,
  ),
  "dflash_chain_resample_from_target": (
    STATEFUL["dflash_sampled_chain"],
    testing.resample_from_target,
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize("make, verifier", ONE_SHAPE.values(), ids=ONE_SHAPE)
def test_exact_distribution_at_one_forward_shape(v5_pair, make, verifier):
  target, draft = v5_pair
  drafter, dparams = make(draft)
  rows = drafter.num_nodes + drafter.num_extra + 1 + 2
  pvalues = _v5_pvalues(target, drafter, dparams, verifier, forward_rows=rows)
  _check(pvalues, broken=verifier is not None)


BROKEN_ACROSS_STEPS = {
  "resample_from_target": (STATEFUL["draft_model_k1"], testing.resample_from_target),
  "accept_with_target_prob": (STATEFUL["draft_model_k1"], testing.accept_with_target_prob),
  "lookup_resample_from_target": (STATEFUL["prompt_lookup_k1"], testing.resample_from_target),
  "skip_q_renormalisation": (STATEFUL["random_tree_3"], testing.skip_q_renormalisation),
  "medusa_skip_q_renormalisation": (
    STATEFUL["medusa_sampled_2x1"],
    testing.skip_q_renormalisation,
  ),
  "medusa_keep_rejected_candidate": (
    STATEFUL["medusa_sampled_2x1"],
    testing.keep_rejected_candidate,
  ),
  "eagle_keep_rejected_candidate": (
    STATEFUL["eagle_sampled_2x2_3"],
    testing.keep_rejected_candidate,
  ),
  "dflash_keep_rejected_candidate": (
    STATEFUL["dflash_sampled_tree"],
    testing.keep_rejected_candidate,
  ),
  "dflash_chain_resample_from_target": (
    STATEFUL["dflash_sampled_chain"],
    testing.resample_from_target,
  ),
  "peagle_keep_rejected_candidate": (
    STATEFUL["peagle_reduced_vocab_tree"],
    testing.keep_rejected_candidate,
  ),
  "peagle_chain_resample_from_target": (
    STATEFUL["peagle_sampled_chain"],
    testing.resample_from_target,
  ),
  # DSpark's children verified with their depth's q, not their parent's (the bias dropped).
  "dspark_unconditioned_q": (
    lambda d: testing.unconditioned_q(*STATEFUL["dspark_sampled_tree"](d)),
    None,
  ),
  # The lookup guess tried before the sampled children: their q loses its token.
  "eagle_lookup_first": (
    lambda d: testing.lookup_first(*STATEFUL["eagle_sampled_lookup"](d)),
    None,
  ),
  "medusa_lookup_first": (
    lambda d: testing.lookup_first(*STATEFUL["medusa_sampled_lookup"](d)),
    None,
  ),
  # The best 1 of 2 sampled children by its own q, verified with q.
  "eagle_rerank_by_own_q": (
    lambda d: testing.rerank_by_own_q(*testing.eagle_drafter(V5_TARGET, 2, 1, 1)),
    None,
  ),
}


@pytest.mark.slow
@pytest.mark.parametrize("make, verifier", BROKEN_ACROSS_STEPS.values(), ids=BROKEN_ACROSS_STEPS)
def test_broken_verifier_fails_across_steps(v5_pair, make, verifier):
  """(A broken drafter with the right verifier where the verifier is None.)"""
  target, draft = v5_pair
  drafter, dparams = make(draft)
  assert min(_v5_pvalues(target, drafter, dparams, verifier)) < P_FAIL


def test_v5_case_stops_mid_sample_and_runs_several_steps(v5_pair):
  """The case is what it claims: rows end at the stop id before five tokens, and a row takes
  several target calls."""
  (tcfg, tparams), (dcfg, dparams) = v5_pair
  from specjax.decode import generate

  out = generate(
    tparams, tcfg, list(V5_PROMPTS) * 50, drafter=DraftModel(dcfg, 1), drafter_params=dparams,
    max_new_tokens=5, max_len=16, temperature=1.0, eos_id=list(V5_STOP),
  )  # fmt: skip
  stopped = [r for r in out.tokens if r[-1] in V5_STOP and len(r) < 5]
  assert 0.1 < len(stopped) / len(out.tokens) < 0.9
  assert min(out.metrics["row_calls"]) < max(out.metrics["row_calls"])
  assert out.metrics["target_calls"] >= 4


@pytest.mark.slow
def test_skipping_tree_compaction_fails_across_steps(v5_pair, monkeypatch):
  """The carried state shapes samples: with the verified nodes' K/V kept in node order instead
  of along the accepted path (no compaction), later steps attend to a rejected sibling, and
  the case sees it."""
  from specjax import loop

  node_order = lambda path: jnp.broadcast_to(
    jnp.arange(path.shape[1] + 1), (path.shape[0], path.shape[1] + 1)
  )
  monkeypatch.setattr(loop, "path_slots", node_order)
  target, _ = v5_pair
  drafter = testing.RandomTreeDrafter(trees.Tree((0, 0, 0)), spread=2.01)  # a fresh trace
  assert min(_v5_pvalues(target, drafter, None)) < P_FAIL


MEDUSA_KNOBS = {"top_k_3": dict(temperature=0.7, top_k=3), "top_p_0.8": dict(top_p=0.8)}


@pytest.mark.slow
@pytest.mark.parametrize("knobs", MEDUSA_KNOBS.values(), ids=MEDUSA_KNOBS)
@pytest.mark.parametrize(
  "vocab_ids, lookup", [(None, 0), ((0, 2, 4), 2)], ids=["full_vocab", "reduced_vocab_lookup"]
)
def test_medusa_exact_with_top_k_and_top_p(v5_pair, knobs, vocab_ids, lookup):
  """Children drawn from the heads' filtered q (zero outside top-k / top-p and the draft
  vocabulary) and verified with it: still exactly the target's filtered distribution; with a
  reduced vocabulary, also with a lookup branch (whose guesses may lie outside it)."""
  target, _ = v5_pair
  drafter, params = testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2, vocab_ids, seed=1, lookup=lookup)
  pvalues = _v5_pvalues(target, drafter, params, knobs=dict(temperature=1.0) | knobs)
  assert min(pvalues) > P_PASS / len(pvalues), pvalues


@pytest.mark.slow
@pytest.mark.parametrize("knobs", MEDUSA_KNOBS.values(), ids=MEDUSA_KNOBS)
@pytest.mark.parametrize(
  "vocab_ids, lookup", [(None, 0), ((0, 2, 4), 2)], ids=["full_vocab", "reduced_vocab_lookup"]
)
def test_eagle_exact_with_top_k_and_top_p(v5_pair, knobs, vocab_ids, lookup):
  """EAGLE-2 dynamic trees with children drawn from the filtered q: exact, batch > 1; with a
  reduced vocabulary, also with a lookup branch (whose guesses may lie outside it)."""
  target, _ = v5_pair
  drafter, params = testing.eagle_drafter(V5_TARGET, 2, 2, 3, vocab_ids, seed=1, lookup=lookup)
  pvalues = _v5_pvalues(target, drafter, params, knobs=dict(temperature=1.0) | knobs)
  assert min(pvalues) > P_PASS / len(pvalues), pvalues


@pytest.mark.slow
def test_own_q_rerank_verified_as_deterministic_stays_exact(v5_pair):
  """The rerank that breaks q-aware verification is lossless under the one-hot rule (EAGLE's
  reference verifier treats draft tokens as q = 1): no child was chosen by looking at the
  target, only by the draft's own randomness."""
  target, _ = v5_pair
  drafter, params = testing.rerank_by_own_q(*testing.eagle_drafter(V5_TARGET, 2, 1, 1))
  pvalues = _v5_pvalues(target, drafter, params, testing.children_as_deterministic)
  assert min(pvalues) > P_PASS / len(pvalues), pvalues


@pytest.mark.slow
def test_sampled_children_verified_as_deterministic_stay_exact(v5_pair):
  """Verifying sampled children as one-hot candidates (their q ignored, a rejected one removed
  from p') is lossless too, since no child looks at the target; q only raises acceptance."""
  target, _ = v5_pair
  drafter, params = testing.medusa_drafter(V5_CFG, MEDUSA_TREE, 2)
  pvalues = _v5_pvalues(target, drafter, params, testing.children_as_deterministic)
  assert min(pvalues) > P_PASS / len(pvalues), pvalues
