"""The τ simulator replays greedy decoding exactly; the cost model prices steps; the task runs."""

import copy
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import config_dict

from configs import tiny as tiny_config
from specjax import build, costmodel, simulate, testing, trees
from specjax.decode import generate
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle import drafter as eagle_drafter
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.measure import sweep
from specjax.models import llama, tiny

PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 3, 4, 9, 2, 7, 1, 3, 3], [5, 6]]
NEW = 40


@pytest.fixture(scope="module")
def model():
  """Vocab 16 with damped residuals: truncations and random heads agree with it often enough
  that every drafter has accepted tokens to get right."""
  cfg, params = tiny.random_model(seed=0, vocab_size=16, dim=32, num_layers=3, residual_scale=0.3)
  return types.SimpleNamespace(cfg=cfg, params=params)


def drafters(m):
  dcfg, dparams = tiny.truncated(m.cfg, m.params, 1)
  md, mp = testing.medusa_drafter(m.cfg, trees.Tree.from_spec((3, 2, 1)), 3, sampled=False)
  ed, ep = testing.eagle_drafter((m.cfg, m.params), top_k=1, depth=4, total=4, sampled=False)
  et, tp = testing.eagle_drafter((m.cfg, m.params), top_k=2, depth=3, total=5, sampled=False)
  el, lp = testing.eagle_drafter((m.cfg, m.params), 1, 2, 2, sampled=False, lookup=3)
  ml, mlp = testing.medusa_drafter(m.cfg, trees.Tree.from_spec((2, 1)), 2, sampled=False, lookup=3)
  return {
    "lookup": (PromptLookup(4), None),
    "lookup_tree": (PromptLookup(3, num_branches=2), None),
    "draft_model": (DraftModel(dcfg, 3), dparams),
    "medusa": (md, mp),
    "medusa_lookup": (ml, mlp),  # a (2, 1) tree with lookup's 3-token guess beside it
    "eagle_chain": (ed, ep),
    "eagle_tree": (et, tp),  # EAGLE-2: a tree of its own at every root
    "eagle_lookup": (el, lp),  # a 2-chain with lookup's 3-token guess beside it
  }


def simulated_calls(m, d, dp, rows, first_root=lambda prompt: len(prompt)):
  calls = []
  for prompt, new in rows:
    text = list(prompt) + list(new)
    r = first_root(prompt)
    drafts, parents = simulate.offline_drafts(m, d, dp, text, r)
    acc = simulate.accepted_lengths(simulate.hits(drafts, parents, text, r), parents)
    calls.append(simulate.walk(acc, len(new), (drafts == simulate.ABSTAINED).all(1))[0])
  return calls


DRAFTERS = (
  "lookup", "lookup_tree", "draft_model", "medusa", "medusa_lookup", "eagle_chain", "eagle_tree",
  "eagle_lookup",
)  # fmt: skip


@pytest.fixture(scope="module")
def rows(model):
  """(prompt, AR's greedy continuation) per prompt: what the replays teacher-force."""
  ar = generate(model.params, model.cfg, PROMPTS, max_new_tokens=NEW, max_len=128)
  return list(zip(PROMPTS, ar.tokens, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", DRAFTERS)
def test_simulated_target_calls_equal_greedy_decoding_row_by_row(model, rows, name):
  """Each row decoded alone (batch 1: an abstaining row is an AR step, as replayed)."""
  every = drafters(model)
  assert set(DRAFTERS) == set(every)
  d, dp = every[name]
  outs = [
    generate(model.params, model.cfg, [p], drafter=d, drafter_params=dp, max_new_tokens=NEW,
             max_len=128, pad_to=16)
    for p in PROMPTS
  ]  # fmt: skip
  assert [o.tokens[0] for o in outs] == [new for _, new in rows]
  decoded = [int(o.counts["row_calls"][0]) for o in outs]
  assert simulated_calls(model, d, dp, rows) == decoded
  if name.startswith("lookup"):  # abstentions (no n-gram match) replayed row by row too
    replays = [simulate.replay(model, d, dp, [r]) for r in rows]
    assert [r.abstained for r in replays] == [int(o.counts["row_abstained"][0]) for o in outs]
    assert sum(r.abstained for r in replays) > 0
  assert sum(decoded) < len(PROMPTS) * NEW, "nothing accepted, the check is empty"


@pytest.mark.slow
def test_broken_replays_differ_from_the_replay_that_equals_decoding(model, rows, monkeypatch):
  """The row-by-row test's teeth. Its replays equal decoding; these broken ones differ from
  them: drafts taken at the prompt's last token as if the prefill had drafted too (for at
  least three drafters), and every EAGLE-2 root drafting from the feature of the pair before
  its own."""
  every = drafters(model)
  right = {name: simulated_calls(model, d, dp, rows) for name, (d, dp) in every.items()}
  wrong_root = [
    name for name, (d, dp) in every.items()
    if simulated_calls(model, d, dp, rows, lambda p: len(p) - 1) != right[name]
  ]  # fmt: skip
  assert len(wrong_root) >= 3, wrong_root

  state = eagle_drafter.EagleState

  def previous_pair(**kw):
    return state(**kw | {"pending_BxD1xF": jnp.roll(kw["pending_BxD1xF"], 1, axis=0)})

  d, dp = every["eagle_tree"]
  monkeypatch.setattr(eagle_drafter, "EagleState", previous_pair)
  simulate._drafts.clear_cache()  # traced again with the broken state, then dropped
  try:
    assert simulated_calls(model, d, dp, rows) != right["eagle_tree"]
  finally:
    simulate._drafts.clear_cache()


def test_accepted_lengths_follow_the_tree_and_walk_counts_the_prefill():
  parents = np.array([(0, 0, 1, 2)] * 4)  # two branches: node 1 -> 3, node 2 -> 4
  hits = np.array([[0, 1, 0, 1], [1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0]], bool)
  assert simulate.accepted_lengths(hits, parents).tolist() == [2, 2, 0, 1]
  # A tree per row (EAGLE-2): row 1 is a chain 1 -> 2 -> 3 -> 4.
  parents[1] = (0, 1, 2, 3)
  assert simulate.node_depths(parents)[1].tolist() == [0, 1, 2, 3, 4]
  # The decode loop's own depths (trees.ancestors, in JAX) on both kinds of row.
  want = trees.depths(trees.ancestors(jnp.asarray(parents, jnp.int32)))
  assert simulate.node_depths(parents).tolist() == np.asarray(want).tolist()
  assert simulate.accepted_lengths(hits, parents).tolist() == [2, 1, 0, 1]
  assert simulate.walk(np.array([2, 0, 0, 5, 0]), 5) == (3, 0)  # prefill, 3 tokens, then 1
  assert simulate.walk(np.array([0, 0, 0, 0]), 5, np.array([1, 0, 1, 1])) == (5, 3)
  assert simulate.acceptance_by_depth(np.array([0, 1, 2, 2]), 2) == [0.75, 2 / 3]


def test_drafters_with_extra_tokens_are_refused():
  from specjax.drafters.lookahead import Lookahead

  with pytest.raises(ValueError, match="offline acceptance is simulated for"):
    simulate.check_supported(Lookahead())


def test_step_work_and_roofline(model):
  d = drafters(model)
  work = costmodel.step_work(d["draft_model"][0])
  assert [(f.model, f.tokens) for f in work] == [("draft_model", 2)] + [("draft_model", 1)] * 2 + [
    ("target", 4)
  ]
  medusa_work = [(f.model, f.tokens) for f in costmodel.step_work(d["medusa"][0])]
  assert medusa_work == [("medusa", 1), ("target_tree", 16)]  # 3 + 6 + 6 nodes, a tree mask
  assert costmodel.step_work(None) == (costmodel.Forward("target", 1),)
  tree = [(f.model, f.tokens) for f in costmodel.step_work(d["eagle_tree"][0])]  # 2 x 3, 5 nodes
  assert tree == [("eagle", 4), ("eagle_level", 2), ("eagle_level", 2), ("target_tree", 6)]
  big = tiny.tiny_config(
    vocab_size=49152,
    dim=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    ffn_dim=1536,
    tie_embeddings=True,
  )  # fmt: skip  (SmolLM2-135M's shape)
  prof = costmodel.roofline("H200", {"target": costmodel.llama_sizes(big)}, context=256)
  one, eight, huge = (prof.cost("target", t) for t in (1, 8, 4096))
  assert eight < 1.01 * one  # memory-bound: 8 tokens cost what 1 does
  params = costmodel.llama_sizes(big)[0]
  assert huge == pytest.approx(2 * params * 4096 / 989e12)  # compute-bound far out
  assert one == pytest.approx((2 * params + 30 * 3 * 64 * 4 * 257) / 4.8e12)
  with pytest.raises(ValueError, match="unknown chip"):
    costmodel.roofline("A100-ish", {})


def test_verifies_tree_matches_the_drafts_each_drafter_proposes(model):
  """The cost model prices a tree mask where ``propose`` returns ``parents``: checked against
  the drafts themselves, for every drafter family. Whether a draft has parents is a matter of
  structure, so the drafts are traced (``jax.eval_shape``, as the jitted loop traces them), not
  computed."""
  from specjax import sampling
  from specjax.drafters.base import DraftContext, Prefill

  tokens = jnp.asarray([[1, 5, 9, 3, 1, 5, 9, 3, 2, 7]], jnp.int32)
  lengths = jnp.asarray([8], jnp.int32)
  ctx = DraftContext(tokens, lengths, jax.random.key(0), sampling.SamplingParams.create(0.0),
                     model.cfg.vocab_size)  # fmt: skip

  def draft_of(d, dp):
    _, feats = llama.logits_of(model.params, model.cfg, tokens, d.feature_layers)
    features = jnp.concatenate(feats, axis=-1) if d.feature_layers else None
    state = d.init(dp, Prefill(tokens, lengths, features, 24))
    return d.propose(dp, state, ctx)[0]

  for name, (d, dp) in drafters(model).items():
    draft = jax.eval_shape(lambda dp, d=d: draft_of(d, dp), dp)
    assert costmodel.verifies_tree(d) == (draft.parents is not None), name


def test_measured_profile_takes_the_cheaper_of_gemm_and_matvecs():
  causal = {1: 1.0, 4: 5.0, 8: 6.0}
  prof = costmodel.measured("m", {"target": causal, "target_tree": {1: 1.0, 8: 7.0}}, {}, 0.5)
  assert prof.cost("target", 4) == 4.0  # 4 one-token forwards beat the 5.0 GEMM
  assert prof.cost("target", 8) == 6.0
  assert prof.cost("target_tree", 8) == 7.0  # a tree's verify: timed under its own mask
  assert prof.step_seconds(None) == 1.5


def test_a_run_at_forward_rows_is_priced_at_its_rows_idle_steps_too():
  """With ``forward_rows`` every target forward of a step, a step with nothing to verify too,
  runs at the step's rows in one shape: priced from ``target_rows``, against one-row AR."""
  rows = {1: 0.1, 5: 3.0, 9: 4.0}  # one row in one shape: cheap, but no step runs it
  prof = costmodel.measured(
    "m", {"target": {1: 1.0, 5: 2.0}, "target_rows": rows}, {"lookup": {1: 0.5}}, 0.5
  )  # fmt: skip
  d = PromptLookup(4)  # verifies 5 tokens: the lookup, then the target over 5
  assert prof.step_seconds(d) == 0.5 + 0.5 + 2.0
  assert prof.step_seconds(d, rows=9) == 0.5 + 0.5 + 4.0  # at the run's rows, not its 5 tokens
  assert prof.cost("target_rows", 5) == 3.0  # never the one-row forwards' sum (5 x 0.1)
  assert prof.cost("target_rows", 7) == 3.5  # interpolated
  assert prof.speedup(d, 2.0) == pytest.approx(2.0 * 1.5 / 3.0)
  assert prof.speedup(d, 2.0, rows=9) == pytest.approx(2.0 * 1.5 / 5.0)
  # A quarter of the steps abstain: one-row AR steps, or at forward_rows the 9-row forward.
  assert prof.speedup(d, 2.0, 0.25) == pytest.approx(3.0 / (0.25 * 1.5 + 0.75 * 3.0))
  assert prof.speedup(d, 2.0, 0.25, rows=9) == pytest.approx(3.0 / (0.25 * 4.5 + 0.75 * 5.0))


def test_machine_timing_compiles_only_the_mask_the_drafter_verifies_with(model, monkeypatch):
  """``num_draft``/``total = "auto"`` time the target where they run: a chain's verify under the
  causal mask only, a tree's under the tree mask only (each mask is its own compiles), a grid
  of both under both."""
  monkeypatch.setattr(costmodel, "ar_step_seconds", lambda *a: 1.0)
  config = tiny_config.get_config()
  timed = []
  real = costmodel.llama_forward_seconds
  spy = lambda *a: timed.append(a[-1]) or real(*a)  # noqa: E731
  monkeypatch.setattr(costmodel, "llama_forward_seconds", spy)
  for d, mask, part in ((PromptLookup(4), "causal", "target"),
                        (PromptLookup(3, num_branches=2), "tree", "target_tree")):  # fmt: skip
    parts, overhead = costmodel._machine_target(config, model, [3, 5], 1, [d])
    assert timed.pop() == (mask,)
    assert sorted(parts[part]) == [1, 3, 5] and set(parts) <= {"target", part}
    assert parts["target"][1] > 0 and overhead >= 0  # the AR step's forward, either way
  # Options of both kinds (a block drafter's chains and trees under tree = "auto"): each mask.
  both = [PromptLookup(4), PromptLookup(3, num_branches=2)]
  parts, _ = costmodel._machine_target(config, model, [3, 5], 1, both)
  assert timed.pop() == ("causal", "tree") and set(parts) == {"target", "target_tree"}
  # At forward_rows: the one-row AR forward, and the options' rows in one shape, nothing else.
  parts, _ = costmodel._machine_target(config, model, [3, 5], 1, [PromptLookup(4)], [5, 7])
  assert timed[-3:] == [("causal",), ("one_shape",), ("one_shape",)]  # each R at its slots
  assert set(parts) == {"target", "target_rows"} and sorted(parts["target"]) == [1]
  assert sorted(parts["target_rows"]) == [5, 7]


@pytest.mark.slow
def test_cost_model_task_predicts_greedy_tau_exactly_and_feeds_auto(tmp_path, capsys, monkeypatch):
  from specjax.tasks import cost_model

  c = tiny_config.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.update(max_new_tokens=16, max_len=48, batch_size=1, output_dir=str(tmp_path))
  c.benchmark.repeats = 1
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes = (1,)
  c.sweep.verify_sizes = ()
  c.sweep.categories = {"repeats": ((1, 2, 3, 1, 2, 3),), "random": ((5, 9, 11),)}
  c.sweep.variants = {
    "lookup": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 3}},
    "draft": {"name": "draft_model", "draft_model": {"num_draft": 2}},
  }
  # Chains up to K = 4 (the task's default is 8: each K is another verify size to compile and
  # time), each forward timed 3 times: what is checked is the bookkeeping, not the timings.
  c.cost_model = config_dict.ConfigDict({"chips": ("H200",), "context": 16, "max_k": 4,
                                         "repeats": 3})  # fmt: skip
  out = cost_model.run(c)
  saved = json.loads((tmp_path / "cost_model.json").read_text())
  assert sorted(r["variant"] for r in saved["rows"]) == ["draft", "lookup"]
  for row in out["rows"]:
    assert row["tau_error"] == pytest.approx(0, abs=1e-9)
    assert row["predicted_speedup"] > 0 and row["H200_speedup"] > 0
    assert row["H200_step_vs_ar"] >= 1  # a step verifies more than one token
  assert saved["rows"][[r["variant"] for r in saved["rows"]].index("draft")]["tau_by_k"]
  grid = saved["lookup_grid"]  # every (K, min_ngram) of prompt lookup, replayed and priced
  assert {(g["num_draft"], g["min_ngram"]) for g in grid} == {
    (k, n) for k in range(1, 5) for n in (1, 2, 3)
  }
  assert all(g["predicted_speedup"] > 0 and 0 <= g["abstained"] <= 1 for g in grid)
  # The grid's min_ngram = 1 cells are the "lookup" variant (K = 3) cut to each K, all prompts
  # pooled: its tau_by_k, from one pass of the longest chain.
  lookup_row = saved["rows"][[r["variant"] for r in saved["rows"]].index("lookup")]
  for g in grid:
    if g["min_ngram"] == 1:
      assert g["tau"] == pytest.approx(lookup_row["tau_by_k"][str(g["num_draft"])])
  assert len({g["tau"] for g in grid}) > 3  # the settings differ: the check is not empty
  assert [r["forward_rows"] for r in saved["rows"]] == [0, 0]  # float32: each forward its rows
  assert not saved["target_rows_forward_ms"]

  # Greedy in bfloat16 the sweep decodes each variant at its rows (forward_rows = auto): its
  # steps, and every lookup cell's, are priced at those rows in one shape.
  bf16 = copy.deepcopy(c)
  bf16.update(dtype="bfloat16", output_dir=str(tmp_path / "bf16"))
  rows = cost_model.run(bf16)
  assert {r["variant"]: r["forward_rows"] for r in rows["rows"]} == {"lookup": 4, "draft": 3}
  assert sorted(rows["target_rows_forward_ms"]) == [2, 3, 4, 5]  # the lookup grid's K + 1 too
  for r in rows["rows"]:  # a step: the overhead, the drafter's forwards, the target at its rows
    own = sum(ms for t in rows["drafter_forward_ms"][r["variant"]].values() for ms in t.values())
    at_rows = rows["target_rows_forward_ms"][r["forward_rows"]]
    assert r["step_ms"] == pytest.approx(rows["overhead_ms"] + own + at_rows)

  # The prediction redone over the same measured decoding (no timed decoding): same rows; a
  # sweep.json written before a drafter option existed decoded as its default does.
  sweep_json = tmp_path / "sweep.json"
  older = json.loads(sweep_json.read_text())
  del older["config"]["drafter"]["eagle"]["auto_from"]
  sweep_json.write_text(json.dumps(older))
  c.cost_model.reuse_sweep = str(sweep_json)
  then = cost_model._ar_step(older)  # (a tiny model's AR step is mostly noise: fixed here)
  timed = sweep.timed_ar_rows
  monkeypatch.setattr(sweep, "timed_ar_rows", lambda *a: (timed(*a)[0], then * 1.1))
  again = cost_model.run(c)
  for a, b in zip(out["rows"], again["rows"], strict=True):
    assert (a["speedup"], a["predicted_tau"]) == (b["speedup"], b["predicted_tau"])
  monkeypatch.setattr(sweep, "timed_ar_rows", lambda *a: (timed(*a)[0], then * 1.9))  # another
  with pytest.raises(ValueError, match="would mix two machines"):
    cost_model.run(c)
  monkeypatch.undo()
  c.max_new_tokens = 12
  with pytest.raises(ValueError, match="measured with other config.max_new_tokens"):
    cost_model.run(c)
  c.max_new_tokens = 16
  del c.cost_model["reuse_sweep"]
  c.sweep.resume = True  # a resumed sweep has no AR rows for the categories it kept
  with pytest.raises(ValueError, match="does not resume a sweep"):
    cost_model.run(c)
  del c.sweep["resume"]

  # Prompt lookup's num_draft = "auto" picks K and min_ngram from that grid.
  la = tiny_config.get_config()
  la.target.update(c.target.to_dict())
  la.drafter.name = "prompt_lookup"
  la.drafter.prompt_lookup.num_draft = "auto"
  with pytest.raises(ValueError, match="prompt_lookup.num_draft='auto' needs"):
    build.check(la)
  la.drafter.prompt_lookup.auto_from = str(tmp_path / "cost_model.json")
  la.drafter.prompt_lookup.num_branches = 2
  with pytest.raises(ValueError, match="picks a chain"):
    build.check(la)
  la.drafter.prompt_lookup.num_branches = 1
  build.check(la)
  d, _ = build.drafter(la, build.target(la))
  assert (d.num_draft, d.min_ngram) in {(g["num_draft"], g["min_ngram"]) for g in grid}
  assert "chose K=" in capsys.readouterr().out
  # Where a step costs what an AR step does, the pick is the cell with the highest tau.
  monkeypatch.setattr(costmodel, "_machine_target", lambda *a, **k: ({"target": {1: 1.0}}, 0.0))
  monkeypatch.setattr(costmodel, "drafter_seconds", lambda *a, **k: {"lookup": {1: 0.0}})
  d, _ = build.drafter(la, build.target(la))
  top = max(grid, key=lambda g: (g["tau"], -g["num_draft"], -g["min_ngram"]))
  assert (d.num_draft, d.min_ngram) == (top["num_draft"], top["min_ngram"])
  # Greedy in bfloat16 on a CPU, every forward runs at the option's rows (forward_rows =
  # auto): K is priced at K + 1 rows in one shape; past 2 rows they are dear here, so K = 1.
  asked = []

  def rows_dear(config, target, sizes, repeats, drafter, rows=()):
    asked.append(list(rows))
    return {"target": {1: 1.0}, "target_rows": {r: 1.0 + 10 * (r - 2) for r in rows}}, 0.0

  monkeypatch.setattr(costmodel, "_machine_target", rows_dear)
  bf16 = copy.deepcopy(la)
  bf16.update(dtype="bfloat16", temperature=0.0)
  d, _ = build.drafter(bf16, build.target(bf16))
  assert asked == [[2, 3, 4, 5]] and d.num_draft == 1
  assert "rows in one shape" in capsys.readouterr().out
  bf16.forward_rows = 3  # a fixed row count: only the settings that fit it are priced
  d, _ = build.drafter(bf16, build.target(bf16))
  assert asked[-1] == [3] and d.num_draft <= 2
  bf16.forward_rows = 1
  with pytest.raises(ValueError, match="forward_rows=1 is fewer rows than any setting"):
    build.drafter(bf16, build.target(bf16))
  monkeypatch.undo()
  la.drafter.prompt_lookup.max_ngram = 4  # the grid replayed max_ngram = 3
  with pytest.raises(ValueError, match="replayed max_ngram=3"):
    build.check(la)
  la.drafter.prompt_lookup.max_ngram = 3
  la.drafter.prompt_lookup.num_draft = "fast"
  with pytest.raises(ValueError, match="an integer K >= 1, or 'auto'"):
    build.check(la)
  la.drafter.prompt_lookup.num_draft = "auto"
  la.target.name = "other"  # a grid measured for another target: its fixed K, said so
  capsys.readouterr()
  build.check(la)
  assert la.drafter.prompt_lookup.num_draft == la.drafter.prompt_lookup.auto_fallback == 4
  assert "was measured for target 'tiny-target', not 'other'; drafting K = 4" in (
    capsys.readouterr().out
  )
  la.drafter.prompt_lookup.num_draft = "auto"
  la.drafter.prompt_lookup.auto_fallback = 0  # or an error, before anything loads
  with pytest.raises(ValueError, match="was measured for target"):
    build.check(la)

  # num_draft = "auto" picks K from that file and this machine's step costs.
  auto = tiny_config.get_config()
  auto.target.update(c.target.to_dict())
  auto.drafter.name = "draft_model"
  auto.drafter.draft_model.num_draft = "auto"
  with pytest.raises(ValueError, match="needs config.drafter.draft_model.auto_from"):
    build.check(auto)
  auto.drafter.draft_model.auto_from = str(tmp_path / "cost_model.json")
  build.check(auto)
  target = build.target(auto)
  d, _ = build.drafter(auto, target)
  assert 1 <= d.num_draft <= c.cost_model.get("max_k", 8)
  assert "num_draft=auto:" in capsys.readouterr().out
  auto.drafter.draft_model.source = "model"  # another draft model: no curve for it
  auto.drafter.draft_model.model.update(c.target.to_dict() | {"name": "tiny-draft", "seed": 7})
  for check in (lambda: build.check(auto), lambda: build.drafter(auto, target)):
    with pytest.raises(ValueError, match="has no tau_by_k for draft model"):
      check()
  auto.target.seed = 5
  auto.target.name = "other"
  with pytest.raises(ValueError, match="was measured for target"):
    build.check(auto)  # before anything loads

  c.cost_model.chips = ("B200",)
  with pytest.raises(ValueError, match="cost_model.chips"):
    cost_model.run(c)
  c.cost_model.chips = ("H200",)
  # Refused before the sweep: max_k = 0 was refused after it, context = -1 ran through.
  for field, bad in (("max_k", 0), ("context", -1), ("repeats", 0)):
    wrong = copy.deepcopy(c)
    wrong.cost_model[field] = bad
    with pytest.raises(ValueError, match=rf"config.cost_model.{field} must be an integer >= "):
      cost_model.run(wrong)


def test_tau_by_chain_length_matches_each_chain_simulated_alone(model):
  ar = generate(model.params, model.cfg, PROMPTS, max_new_tokens=NEW, max_len=128)
  rows = list(zip(PROMPTS, ar.tokens, strict=True))
  d, dp = drafters(model)["draft_model"]
  curve = simulate.tau_by_chain_length(model, d, dp, rows, 4)
  for k in (1, 2, 4):
    alone = simulate.replay(model, simulate.with_chain_length(d, k), dp, rows).tau
    assert curve[k] == pytest.approx(alone)
  assert curve[4] > curve[1] > 1


@pytest.mark.slow
def test_eagle_budget_grid_is_replayed_priced_and_feeds_total_auto(tmp_path, capsys, monkeypatch):
  from specjax.drafters import eagle
  from specjax.tasks import cost_model

  c = tiny_config.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.update(max_new_tokens=16, max_len=48, batch_size=1, output_dir=str(tmp_path))
  c.benchmark.repeats = 1
  target = build.target(c)
  d, dp = testing.eagle_drafter((target.cfg, target.params), 2, 3, 5, sampled=False)
  path = str(tmp_path / "eagle")
  eagle.save(path, d.cfg, dp, target)
  e = lambda k, depth, n: {"name": "eagle", "eagle": {"path": path, "top_k": k, "depth": depth,  # noqa: E731
                                                      "total": n}}  # fmt: skip
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes = (1,)
  c.sweep.verify_sizes = ()
  c.sweep.categories = {"repeats": ((1, 2, 3, 1, 2, 3),), "random": ((5, 9, 11),)}
  c.sweep.variants = {"chain": e(1, 3, 3), "tree": e(2, 3, 5)}
  budgets = ((1, 2, 2), (1, 3, 3), (2, 3, 5), (2, 2, 4))
  c.cost_model = config_dict.ConfigDict({"chips": ("H200",), "context": 16, "max_k": 4,
                                         "repeats": 3, "eagle_budgets": budgets})  # fmt: skip
  out = cost_model.run(c)
  grid = json.loads((tmp_path / "cost_model.json").read_text())["eagle_grid"]
  assert [(g["top_k"], g["depth"], g["total"]) for g in grid] == list(budgets)
  assert all(g["path"] == path and g["predicted_speedup"] > 0 and g["H200_speedup"] > 0
             for g in grid)  # fmt: skip
  # The chain budgets are the chain variant's tau_by_k (one pass of the longest chain), and
  # the (2, 3, 5) budget is the tree variant replayed over every prompt.
  rows = {r["variant"]: r for r in out["rows"]}
  assert grid[0]["tau"] == pytest.approx(rows["chain"]["tau_by_k"][2])
  assert grid[1]["tau"] == pytest.approx(rows["chain"]["tau_by_k"][3])
  ar = generate(target.params, target.cfg, [[1, 2, 3, 1, 2, 3], [5, 9, 11]], max_new_tokens=16,
                max_len=48)  # fmt: skip
  every = list(zip([[1, 2, 3, 1, 2, 3], [5, 9, 11]], ar.tokens, strict=True))
  assert grid[2]["tau"] == pytest.approx(simulate.replay(target, d, dp, every).tau)
  assert len({g["tau"] for g in grid}) > 1

  # total = "auto": the budget predicted fastest here, from that grid.
  a = tiny_config.get_config()
  a.target.update(c.target.to_dict())
  a.drafter.name = "eagle"
  a.drafter.eagle.update(path=path, total="auto")
  with pytest.raises(ValueError, match="eagle.total='auto' needs config.drafter.eagle.auto_from"):
    build.check(a)
  a.drafter.eagle.auto_from = str(tmp_path / "cost_model.json")
  build.check(a)
  chosen, _ = build.drafter(a, target)
  assert (chosen.top_k, chosen.depth, chosen.total) in set(budgets)
  assert "chose" in capsys.readouterr().out
  # Where every step costs one AR step, the pick is the budget with the highest τ.
  zero = {"eagle": {1: 0.0}, "eagle_level": {1: 0.0}}
  free_target = {"target": {1: 1.0}, "target_tree": {1: 1.0}}
  monkeypatch.setattr(costmodel, "_machine_target", lambda *a, **k: (free_target, 0.0))
  monkeypatch.setattr(costmodel, "drafter_seconds", lambda *a, **k: zero)
  chosen, _ = build.drafter(a, target)
  top = max(grid, key=lambda g: (g["tau"], -g["total"], -g["depth"]))
  assert (chosen.top_k, chosen.depth, chosen.total) == (top["top_k"], top["depth"], top["total"])
  a.drafter.max_nodes = 1
  with pytest.raises(ValueError, match="no tree budget of its eagle_grid fits"):
    build.drafter(a, target)
  monkeypatch.undo()
  a.drafter.max_nodes = 64

  other = tmp_path / "other"
  eagle.save(other, d.cfg, dp, target)
  a.drafter.eagle.path = str(other)
  with pytest.raises(ValueError, match="has no eagle_grid for the drafter"):
    build.check(a)
  a.drafter.eagle.path = path
  a.drafter.eagle.total = "big"
  with pytest.raises(ValueError, match="an integer number of nodes, or 'auto'"):
    build.check(a)
  a.drafter.eagle.total = "auto"
  a.target.name = "other"
  with pytest.raises(ValueError, match="was measured for target"):
    build.check(a)


@pytest.mark.slow
def test_block_tree_grid_is_replayed_and_feeds_tree_auto(tmp_path, capsys, monkeypatch):
  """A block drafter's ``tree = "auto"``: task=cost_model replays every tree of
  ``static_tree.swept_trees`` per (family, drafter, lookup branch) into ``block_grid``, and
  ``build.drafter`` picks the one predicted fastest here from it."""
  import dataclasses

  from specjax.drafters import dflash, peagle, static_tree
  from specjax.tasks import cost_model

  c = tiny_config.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.update(max_new_tokens=16, max_len=48, batch_size=1, output_dir=str(tmp_path))
  c.benchmark.repeats = 1
  target = build.target(c)
  pair = (target.cfg, target.params)
  d, dp = testing.dflash_drafter(pair, trees.Tree.chain(3), block_size=4, sampled=False)
  p, pp = testing.peagle_drafter(pair, trees.Tree.chain(3), num_depths=3, sampled=False)
  dpath, ppath = str(tmp_path / "dflash"), str(tmp_path / "peagle")
  dflash.model.save(dpath, d.cfg, dp, target)
  peagle.model.save(ppath, p.cfg, pp, target)
  prompts = [[1, 2, 3, 1, 2, 3], [5, 9, 11]]
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes = (1,)
  c.sweep.verify_sizes = ()
  c.sweep.categories = {"repeats": (tuple(prompts[0]),), "random": (tuple(prompts[1]),)}
  c.sweep.variants = {
    "dflash": {"name": "dflash", "dflash": {"path": dpath}},
    "dflash_l2": {"name": "dflash", "dflash": {"path": dpath, "lookup": 2}},
    "peagle": {"name": "peagle", "peagle": {"path": ppath}},
  }
  # max_k past the blocks' 3 positions: their chains' tau_by_k stops at the block.
  c.cost_model = config_dict.ConfigDict({"chips": ("H200",), "context": 16, "max_k": 5,
                                         "repeats": 3, "eagle_budgets": ()})  # fmt: skip
  out = cost_model.run(c)
  assert {r["variant"]: sorted(r["tau_by_k"]) for r in out["rows"] if r.get("tau_by_k")} == {
    "dflash": [1, 2, 3], "peagle": [1, 2, 3]}  # fmt: skip
  cm_path = str(tmp_path / "cost_model.json")
  grid = json.loads((tmp_path / "cost_model.json").read_text())["block_grid"]
  of = lambda fam, path, lookup: [g for g in grid if (g["family"], g["path"], g["lookup"])  # noqa: E731
                                  == (fam, path, lookup)]  # fmt: skip
  for fam, path, lookup in (("dflash", dpath, 0), ("dflash", dpath, 2), ("peagle", ppath, 0)):
    rows = of(fam, path, lookup)
    assert [trees.Tree.from_paths(g["tree_paths"]) for g in rows] == static_tree.swept_trees(3)
    assert all(g["predicted_speedup"] > 0 and g["H200_speedup"] > 0 for g in rows)
    assert [g["nodes"] for g in rows] == [1 + lookup, 2 + lookup, 3 + lookup, 4 + lookup,
                                          6 + lookup]  # fmt: skip
  # Each τ is the simulator's replay of that tree (and branch) over the task's rows.
  ar = generate(target.params, target.cfg, prompts, max_new_tokens=16, max_len=48)
  every = list(zip(prompts, ar.tokens, strict=True))
  wide = static_tree.caterpillar(2)
  with_branch = dataclasses.replace(d, tree=wide, lookup=PromptLookup(2, abstain=False))
  row = of("dflash", dpath, 2)[4]
  assert row["tau"] == pytest.approx(simulate.replay(target, with_branch, dp, every).tau)
  assert row["tau"] > of("dflash", dpath, 0)[4]["tau"]  # the branch accepts on the repeats

  # tree = "auto": the tree predicted fastest here, from that grid.
  a = tiny_config.get_config()
  a.target.update(c.target.to_dict())
  a.drafter.name = "dflash"
  a.drafter.dflash.update(path=dpath, lookup=2, tree="auto")
  with pytest.raises(ValueError, match="dflash.tree='auto' needs config.drafter.dflash.auto_from"):
    build.check(a)
  a.drafter.dflash.auto_from = cm_path
  build.check(a)
  chosen, _ = build.drafter(a, target)
  assert chosen.tree in static_tree.swept_trees(3) and chosen.lookup.num_draft == 2
  assert "dflash tree=auto" in capsys.readouterr().out
  # Where every step costs one AR step, the pick is the tree with the highest τ.
  free_target = {"target": {1: 1.0}, "target_tree": {1: 1.0}}
  monkeypatch.setattr(costmodel, "_machine_target", lambda *a, **k: (free_target, 0.0))
  monkeypatch.setattr(costmodel, "drafter_seconds", lambda *a, **k: {"dflash": {1: 0.0}})
  chosen, _ = build.drafter(a, target)
  top = max(of("dflash", dpath, 2), key=lambda g: (g["tau"], -g["nodes"], -g["depth"]))
  assert chosen.tree == trees.Tree.from_paths(top["tree_paths"])
  # ... a random drafter's trees tie (the branch accepts alone): a grid where the widest tree
  # replayed best must pick it.
  record = json.loads((tmp_path / "cost_model.json").read_text())
  widest = record["block_grid"].index(of("dflash", dpath, 2)[-1])
  record["block_grid"][widest]["tau"] = 3.0
  (tmp_path / "best_wide.json").write_text(json.dumps(record))
  a.drafter.dflash.auto_from = str(tmp_path / "best_wide.json")
  chosen, _ = build.drafter(a, target)
  assert chosen.tree == static_tree.caterpillar(3)
  a.drafter.dflash.auto_from = cm_path
  monkeypatch.undo()
  a.drafter.max_nodes = 2  # the grid's smallest tree with the branch verifies 3
  with pytest.raises(ValueError, match="no tree of its block_grid fits"):
    dflash.FAMILY.tune.grid(a, target.cfg.name)
  a.drafter.max_nodes = 64

  a.drafter.dflash.tree_spec = (2, 1)
  with pytest.raises(ValueError, match="leave tree_spec and tree_paths empty"):
    build.check(a)
  a.drafter.dflash.tree_spec = ()
  a.drafter.dflash.tree = "wide"
  with pytest.raises(ValueError, match=r"'' \(the tree of tree_spec or tree_paths\) or 'auto'"):
    build.check(a)
  a.drafter.name = "peagle"
  a.drafter.peagle.update(path=ppath, lookup=2, tree="auto", auto_from=cm_path)
  with pytest.raises(ValueError, match="no block_grid for the peagle drafter .* lookup=2"):
    build.check(a)
  a.drafter.peagle.lookup = 0
  build.check(a)
  chosen, _ = build.drafter(a, target)
  assert chosen.tree in static_tree.swept_trees(3) and chosen.lookup is None
