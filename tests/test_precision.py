"""dtype = "auto" on a CPU: float32 or bfloat16 by timing this machine, once per machine and
model; in bfloat16 a greedy speculative run's forwards at one shape (forward_rows = auto)."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny as tiny_config
from specjax import build, decode, loop, precision, testing, verify
from specjax.drafters.base import Draft, TokensOnly
from specjax.models import llama, source, tiny
from specjax.tasks import benchmark


def test_the_rule_needs_a_margin_and_guards_one_token():
  wins = {"1": 1.0, "2": 0.6, "8": 0.8, "8_one_shape": 1.0}  # verify forwards 20-40% cheaper
  assert precision.decide(wins, speculative=True) == "bfloat16"
  assert precision.decide(wins, speculative=False) == "float32"  # AR alone gains nothing
  assert precision.decide(wins | {"1": 1.2}, speculative=True) == "float32"  # AR steps slower
  # greedy: the verify runs at one shape, here no faster than float32's: float32
  assert precision.decide(wins, speculative=True, greedy=True) == "float32"
  assert precision.decide(wins | {"8_one_shape": 0.8}, True, greedy=True) == "bfloat16"
  small = {"1": 0.8, "2": 0.95, "8": 0.92, "8_one_shape": 0.95}
  assert precision.decide(small, speculative=True) == "float32"  # within the margin
  assert precision.decide(small, speculative=False) == "bfloat16"


@pytest.fixture
def measuring(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
  monkeypatch.delenv(precision.PIN, raising=False)  # the suite pins float32 (conftest.py)
  monkeypatch.setattr(precision, "_CHOSEN", {})  # a fresh process
  c = tiny_config.get_config()
  assert c.dtype == "auto"  # the default measures
  return c, tmp_path / "dtype.json"


@pytest.mark.slow
def test_measured_once_then_read_from_the_cache(measuring, monkeypatch, capsys):
  """The first run times both dtypes (real forwards of the model's shapes) and says what it
  chose and why; a later process reads the cache, times nothing and chooses the same; the
  cache's ratios decide, and the target and drafter load in the chosen dtype."""
  c, path = measuring
  first = build.dtype(c)
  said = capsys.readouterr().out
  assert f"dtype auto: {first} for a greedy speculative run" in said and "T=8 at one shape:" in said
  (entry,) = json.loads(path.read_text()).values()
  assert set(entry) == {"1", "2", "8", "8_one_shape"} and all(r > 0 for r in entry.values())

  monkeypatch.setattr(precision, "_CHOSEN", {})
  monkeypatch.setattr(precision, "ratios", lambda cfg: pytest.fail("timed again"))
  assert build.dtype(c) == first
  (key,) = json.loads(path.read_text())
  path.write_text(json.dumps({key: {"1": 1.0, "2": 0.5, "8": 0.6, "8_one_shape": 0.7}}))
  monkeypatch.setattr(precision, "_CHOSEN", {})
  assert build.dtype(c) == "bfloat16"
  model = build.target(c)
  assert model.params["layers"][0]["wq"].dtype == jnp.bfloat16
  c.drafter.name = "none"  # AR alone: one token decides, and it is no faster here
  assert build.dtype(c) == "float32"
  c.dtype = "measure"  # the choice's former name
  assert build.dtype(c) == "float32"


def test_the_pin_chooses_without_timing_and_a_bad_pin_is_one_error(measuring, monkeypatch):
  c, path = measuring
  monkeypatch.setattr(precision, "ratios", lambda cfg: pytest.fail("timed"))
  monkeypatch.setenv(precision.PIN, "bfloat16")
  assert build.dtype_choice(c) == {"dtype": "bfloat16", "how": f"pinned by ${precision.PIN}",
                                   "ratios": {}}  # fmt: skip
  c.dtype = "float32"  # the config's own choice wins over the pin
  assert build.dtype_choice(c)["how"] == "config.dtype" and build.dtype(c) == "float32"
  c.dtype = "auto"
  monkeypatch.setenv(precision.PIN, "fp16")
  with pytest.raises(ValueError, match=r"\$SPECJAX_CPU_DTYPE='fp16': set it to float32 or bf"):
    build.dtype(c)
  assert not path.exists()


@pytest.mark.slow
def test_auto_in_bfloat16_decodes_greedy_at_one_shape_beside_the_faster_ars(
  measuring, monkeypatch, tmp_path
):
  """The defaults on a CPU whose measured ratios favour bfloat16: the benchmark decodes in
  bfloat16 with every forward at the drafter's 5 rows (forward_rows = auto), its greedy text
  equal to AR's at those rows; AR at one row and AR in float32 run beside it, the speedup is
  over the fastest of the three, and the record says how the dtype was chosen. Explicit
  forward_rows = 0 turns it off (and then no one-row AR is needed)."""
  c, path = measuring
  path.write_text(json.dumps({precision.key(source.header_config(c.target)):
                              {"1": 0.9, "2": 0.5, "8": 0.6, "8_one_shape": 0.7}}))  # fmt: skip
  c.update(max_new_tokens=24, max_len=64, output_dir=str(tmp_path / "bench"))
  c.benchmark.repeats = 1
  record = benchmark.run(c)
  s, modes = record["summary"], record["modes"]
  assert s["dtype"]["dtype"] == "bfloat16" and s["dtype"]["how"].startswith("measured")
  assert s["dtype"]["ratios"] == {"1": 0.9, "2": 0.5, "8": 0.6, "8_one_shape": 0.7}
  assert s["forward_rows"] == c.drafter.draft_model.num_draft + 1
  assert s["greedy_outputs_identical"] is True
  assert {"ar", "ar_one_row", "ar_float32", "speculative"} <= set(modes)
  fastest = max(("ar", "ar_one_row", "ar_float32"), key=lambda m: modes[m]["tokens_per_s"])
  assert s["baseline"] == fastest and modes[fastest]["speedup"] == 1.0
  assert s["speedup"] == pytest.approx(
    modes["speculative"]["tokens_per_s"] / modes[fastest]["tokens_per_s"]
  )
  assert "greedy_equal_to_one_row_ar" in s
  c.forward_rows = 0
  assert build.forward_rows(c, build.drafter(c, build.target(c))[0]) == 0
  c.forward_rows, c.temperature = "auto", 0.7  # sampling is exact at any rows: none added
  assert build.forward_rows(c, build.drafter(c, build.target(c))[0]) == 0


def test_another_model_shape_is_timed_anew(measuring, monkeypatch):
  c, path = measuring
  slow = dict.fromkeys(precision.CELLS, 2.0)  # bfloat16 twice float32's time
  path.write_text(json.dumps({precision.key(source.header_config(c.target)): slow}))
  assert build.dtype(c) == "float32"
  timed = []
  monkeypatch.setattr(
    precision, "ratios", lambda cfg: timed.append(cfg.dim) or dict.fromkeys(precision.CELLS, 0.5)
  )
  c.target.dim = 2 * c.target.dim
  assert build.dtype(c) == "bfloat16" and timed == [c.target.dim]
  assert len(json.loads(path.read_text())) == 2


def test_unknown_dtype_is_refused_before_anything_loads():
  c = tiny_config.get_config()
  c.dtype = "fp8"
  with pytest.raises(
    ValueError, match=r"config.dtype='fp8' is unknown; choose one of auto, measure"
  ):
    build.check(c)


def test_the_decode_loop_reads_bfloat16_weights_inside_the_loop():
  """The compiled decode loop carries the bfloat16 weights themselves into its ``while``, not
  float32 copies made before it (XLA hoists a loop-invariant weight conversion out of the loop
  unless ``loop._step``'s barrier stops it; those copies made a bfloat16 AR step cost twice
  what it should: experiments/verify_cost/loop_cost.py). Without the barrier the loop carries a
  float32 copy of every weight matrix and this fails."""
  cfg = tiny.tiny_config(vocab_size=256, dim=64, num_layers=2, num_heads=4, num_kv_heads=2)
  params = llama.cast(llama.init_params(cfg, jax.random.key(0)), jnp.bfloat16)
  args, st = decode._arguments(params, cfg, [[1, 2, 3]], decode.AUTOREGRESSIVE, None, 8, 64,
                               0.0, 0, 1.0, 0, None, verify.verify, 0, None)  # fmt: skip
  fn, kw = loop.jitted(st, args[0], args[1])
  hlo = fn.lower(*args, **kw).compile().as_text()
  entry = hlo[hlo.index("\nENTRY") :]  # the decode loop; other whiles sit inside computations
  (carried,) = [ln.split(" while(")[0] for ln in entry.splitlines() if " while(" in ln]
  matrices = {tuple(x.shape) for x in jax.tree.leaves(params) if x.ndim == 2}
  matrices |= {s[::-1] for s in matrices}
  carried = {(d, (int(a), int(b))) for d, a, b in re.findall(r"(\w+)\[(\d+),(\d+)\]", carried)}
  weights = {(d, s) for d, s in carried if s in matrices}
  assert weights and all(d == "bf16" for d, _ in weights), sorted(weights)


def _features_by_position(rec) -> dict:
  """``(row, position) -> final hidden state`` of every token a ``testing.Recording`` saw
  committed (the root and the accepted nodes of each step)."""
  out = {}
  for before, after, n, feats in rec.log["steps"]:
    for r in range(feats.shape[0]):
      for j in range(int(n[r]) + 1):
        if before[r] + j < after[r]:
          out[r, int(before[r]) + j] = feats[r, j]
  return out


@pytest.mark.slow
def test_one_forward_shape_makes_bfloat16_speculative_rows_equal_ar_bit_for_bit():
  """With ``forward_rows``, every target forward after the prefill (AR steps, a chain's
  verifies, an abstaining lookup's one-token steps) runs at one shape, and the final hidden
  state of every committed token is the same bits in the speculative run as in AR. Without
  it, on this bfloat16 model, a fifth of the positions differ between the two runs (one-row
  AR steps against 4-row verifies; asserted: the check has teeth), and they do too when the
  loop pads the rows but sums attention over the cache and the new tokens apart (checked
  by hand); ``forward_rows`` below the drafter's rows per step is refused."""
  from specjax import testing
  from specjax.drafters import DraftModel, PromptLookup

  jax.clear_caches()  # Recordings hash alike: a cached program would log into another's record
  cfg, params = tiny.random_model(
    seed=0, vocab_size=64, dim=256, num_layers=1, residual_scale=0.2, logit_std=3.0
  )
  bf16 = llama.cast(params, jnp.bfloat16)
  prompts = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8], [9], [10, 11]]
  drafters = {"chain": (DraftModel(cfg, 3), bf16), "lookup": (PromptLookup(3, min_ngram=2), None)}
  equal = {}
  for rows in (0, 4):
    kw = dict(max_new_tokens=24, max_len=40, forward_rows=rows)
    ar = testing.Recording(decode.AUTOREGRESSIVE, ("final",))
    want = decode.generate(bf16, cfg, prompts, drafter=ar, **kw).tokens
    for name, (inner, dparams) in drafters.items():
      rec = testing.Recording(inner, ("final",))
      out = decode.generate(bf16, cfg, prompts, drafter=rec, drafter_params=dparams, **kw)
      assert out.tokens == want, (name, rows)
      a, b = _features_by_position(ar), _features_by_position(rec)
      assert set(b) <= set(a) and len(b) > 60
      equal[name, rows] = sum(np.array_equal(a[k], b[k]) for k in b) / len(b)
    jax.clear_caches()
  assert equal["chain", 4] == equal["lookup", 4] == 1.0, equal
  assert max(equal["chain", 0], equal["lookup", 0]) < 0.95, equal  # 1 row and 4 round apart
  with pytest.raises(ValueError, match="forward_rows=3 is fewer than the 4 rows"):
    decode.generate(bf16, cfg, prompts, drafter=DraftModel(cfg, 3), drafter_params=bf16,
                    max_new_tokens=4, max_len=40, forward_rows=3)  # fmt: skip
  with pytest.raises(ValueError, match="forward_rows must be an integer >= 0"):
    decode.generate(bf16, cfg, prompts, max_new_tokens=4, max_len=40, forward_rows=-1)


@dataclasses.dataclass(frozen=True)
class SecondBranch(TokensOnly):
  """Knows each row's AR text (``table``) and drafts it as the root's second child's chain,
  with a wrong token as the first child: every accepted path skips slot L + 1, so a node's
  ancestors sit at slots L, L + 2, L + 3, ... in the verify (consecutive in AR)."""

  table: tuple = ()
  depth: int = 3
  name: str = "second_branch"

  @property
  def num_draft(self) -> int:
    return self.depth

  @property
  def num_nodes(self) -> int:
    return self.depth + 1

  def propose(self, params, state, ctx):
    text = jnp.asarray(self.table, jnp.int32)
    at = jnp.clip(ctx.lengths[:, None] + 1 + jnp.arange(self.depth)[None], 0, text.shape[1] - 1)
    true = jnp.take_along_axis(text, at, axis=1)
    tokens = jnp.concatenate([(true[:, :1] + 1) % ctx.vocab_size, true], axis=1)
    parents = (0, 0, *range(2, self.depth + 1))
    return Draft(tokens=tokens, parents=jnp.broadcast_to(jnp.asarray(parents), tokens.shape)), state


@pytest.mark.slow
def test_one_forward_shape_makes_a_tree_nodes_bfloat16_rows_equal_ar_bit_for_bit():
  """A tree whose accepted path is the root's second child's chain (its ancestors at slots L,
  L + 2, ...): with ``forward_rows`` each node's attention reads its ancestors at consecutive
  places, as AR does (``llama.path_ordered``), and every committed token's final hidden state
  is AR's bits. Before, the verify read the ancestors where they sat, and on this model (150-
  token prompts) one position in 69 rounded apart; without ``forward_rows`` they differ too
  (asserted: the check has teeth)."""
  jax.clear_caches()
  cfg, params = tiny.random_model(
    seed=0, vocab_size=64, dim=256, num_layers=1, residual_scale=0.2, logit_std=3.0
  )
  bf16 = llama.cast(params, jnp.bfloat16)
  prompts = [list(np.random.default_rng(0).integers(0, 64, 150)) for _ in range(3)]
  equal = {}
  for rows in (0, 8):
    kw = dict(max_new_tokens=24, max_len=256, forward_rows=rows)
    ar = testing.Recording(decode.AUTOREGRESSIVE, ("final",))
    want = decode.generate(bf16, cfg, prompts, drafter=ar, **kw).tokens
    table = tuple(tuple(p) + tuple(w) + (0,) * (256 - len(p) - len(w))
                  for p, w in zip(prompts, want, strict=True))  # fmt: skip
    rec = testing.Recording(SecondBranch(table=table), ("final",))
    out = decode.generate(bf16, cfg, prompts, drafter=rec, **kw)
    assert out.tokens == want and out.metrics["tau"] > 3, (rows, out.metrics["tau"])
    a, b = _features_by_position(ar), _features_by_position(rec)
    assert set(b) <= set(a) and len(b) > 60
    equal[rows] = sum(np.array_equal(a[k], b[k]) for k in b) / len(b)
    jax.clear_caches()
  assert equal[8] == 1.0 and equal[0] < 1.0, equal


@pytest.mark.slow
def test_a_bfloat16_sweep_checks_each_drafter_against_ar_at_its_rows(monkeypatch, tmp_path):
  """A greedy sweep in bfloat16 (pinned) decodes each drafter at its own rows per step and
  compares it with AR at those rows (one AR run per row count, ``ar_rows_<P>``); plain ``ar``
  runs at one row and stays the speed baseline."""
  from ml_collections import config_dict

  from specjax.measure import sweep

  monkeypatch.setenv(precision.PIN, "bfloat16")
  monkeypatch.setattr(precision, "_CHOSEN", {})
  c = tiny_config.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.update(max_new_tokens=12, max_len=40, batch_size=2, output_dir=str(tmp_path))
  c.benchmark.repeats = 1
  c.sweep = config_dict.ConfigDict()
  c.sweep.batch_sizes, c.sweep.verify_sizes = (2,), ()
  c.sweep.categories = {"repeats": ((1, 2, 3, 1, 2, 3),)}
  c.sweep.variants = {
    "lookup_2": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 2}},
    "lookup_4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }
  record = sweep.run(c)
  runs = {r["variant"]: r for r in record["runs"]}
  assert record["dtype"]["dtype"] == "bfloat16"
  assert set(runs) == {"ar", "ar_rows_3", "ar_rows_5", "lookup_2", "lookup_4"}
  assert runs["lookup_2"]["forward_rows"] == 3 and runs["lookup_4"]["forward_rows"] == 5
  assert runs["lookup_2"]["identical"] and runs["lookup_4"]["identical"]
  assert runs["ar"]["speedup"] == 1.0
