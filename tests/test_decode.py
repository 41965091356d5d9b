"""decode.py: greedy exactness, per-row batching, EOS, no retrace, input checks, public API."""

import dataclasses
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import decode, loop, sampling, testing, verify
from specjax.decode import generate
from specjax.drafters import DraftModel, Lookahead, PromptLookup
from specjax.models import tiny

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [10], [3, 9, 3, 7, 20]]
GEN = dict(max_new_tokens=24, max_len=48)


@pytest.fixture(scope="module")
def ar_tokens(small_target):
  cfg, params = small_target
  return generate(params, cfg, PROMPTS, **GEN).tokens


@pytest.fixture(scope="module")
def drafts(small_target):
  return {
    "truncated": tiny.truncated(*small_target, num_layers=1),
    "independent": tiny.random_model(seed=1, vocab_size=64, dim=32, num_layers=1),
  }


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("which", ["truncated", "independent"])
def test_greedy_speculative_equals_autoregressive(small_target, drafts, ar_tokens, k, which):
  cfg, params = small_target
  dcfg, dparams = drafts[which]
  out = generate(params, cfg, PROMPTS, drafter=DraftModel(dcfg, k), drafter_params=dparams, **GEN)
  assert out.tokens == ar_tokens
  assert out.metrics["tokens"] == 4 * GEN["max_new_tokens"]


def test_rows_accept_different_counts_and_match_solo_runs(small_target, drafts):
  cfg, params = small_target
  dcfg, dparams = drafts["truncated"]
  drafter = DraftModel(dcfg, 3)
  batch = generate(params, cfg, PROMPTS, drafter=drafter, drafter_params=dparams, **GEN)
  # Every row generated the same number of tokens; if their target-call counts differ, some
  # step had rows accepting different counts.
  calls = batch.metrics["row_calls"]
  assert len(set(calls)) > 1, calls
  hist = batch.metrics["accept_hist"]
  assert sum(1 for c in hist if c) > 1, hist
  for prompt, row in zip(PROMPTS, batch.tokens, strict=True):
    solo = generate(params, cfg, [prompt], drafter=drafter, drafter_params=dparams, **GEN)
    assert solo.tokens[0] == row


@pytest.mark.parametrize("two_stop_ids", [False, True])
def test_eos_and_budget_stop_rows(small_target, drafts, ar_tokens, two_stop_ids):
  cfg, params = small_target
  dcfg, dparams = drafts["truncated"]
  stops = {ar_tokens[2][5]} | ({ar_tokens[0][7]} if two_stop_ids else set())
  budgets = [24, 10, 24, 3]
  out = generate(
    params,
    cfg,
    PROMPTS,
    drafter=DraftModel(dcfg, 3),
    drafter_params=dparams,
    max_new_tokens=budgets,
    max_len=48,
    eos_id=sorted(stops),
  )
  for row, ref, budget in zip(out.tokens, ar_tokens, budgets, strict=True):
    ref = ref[:budget]
    ends = [i for i, t in enumerate(ref) if t in stops]
    assert row == (ref[: ends[0] + 1] if ends else ref)
  assert out.tokens[2][-1] in stops


@pytest.mark.slow
def test_no_retrace_across_prompts_temperature_and_seed(small_target, drafts):
  """Prompts, budgets, temperature, seed and stop ids are traced: one program serves them all,
  except that temperature 0 (greedy) and top-k/top-p filtering being on are static, each a
  program of its own that then serves every value; the program without filtering holds no
  filter (fewer sorts in its HLO)."""
  cfg, params = small_target
  dcfg, dparams = drafts["truncated"]
  drafter = DraftModel(dcfg, 2)
  common = dict(drafter=drafter, drafter_params=dparams, max_len=48)
  generate(params, cfg, [[1, 2], [3, 4, 5]], max_new_tokens=8, **common)
  before = loop.TRACES["generate"]
  generate(params, cfg, [[7, 7, 7, 1], [9]], max_new_tokens=[5, 12], seed=123, eos_id=3, **common)
  assert loop.TRACES["generate"] == before
  generate(
    params, cfg, [[7, 7, 7, 1], [9]], max_new_tokens=[5, 12], temperature=0.8, seed=123,
    eos_id=3, **common,
  )  # fmt: skip
  generate(params, cfg, [[2], [5, 6]], max_new_tokens=8, temperature=1.3, seed=9, **common)
  assert loop.TRACES["generate"] == before + 1
  generate(params, cfg, [[2], [5, 6]], temperature=0.8, top_k=5, top_p=0.9, **common)
  generate(params, cfg, [[7, 1], [9]], temperature=1.3, top_k=2, seed=4, eos_id=3, **common)
  generate(params, cfg, [[3], [4, 4]], temperature=0.5, top_p=0.8, **common)
  assert loop.TRACES["generate"] == before + 2

  def sorts(top_k):
    args, st = decode._arguments(
      params, cfg, [[1, 2], [3]], drafter, dparams, 8, 48, 1.0, top_k, 1.0, 0, None,
      verify.verify, 0,
    )  # fmt: skip
    fn, kw = loop.jitted(st, args[0], args[1])
    return fn.lower(*args, **kw).as_text().count("stablehlo.sort")

  assert sorts(top_k=0) < sorts(top_k=5)


@pytest.mark.slow
def test_same_result_without_jit(small_target, drafts):
  cfg, params = small_target
  dcfg, dparams = drafts["truncated"]
  kw = dict(
    drafter=DraftModel(dcfg, 2),
    drafter_params=dparams,
    max_new_tokens=4,
    max_len=16,
    temperature=1.0,
    seed=4,
  )
  jitted = generate(params, cfg, PROMPTS[:2], **kw)
  with jax.disable_jit():
    eager = generate(params, cfg, PROMPTS[:2], **kw)
  assert jitted.tokens == eager.tokens


def test_autoregressive_tau_is_one(small_target, ar_tokens):
  cfg, params = small_target
  m = generate(params, cfg, PROMPTS, **GEN).metrics
  assert m["tau"] == 1.0 and m["target_calls"] == GEN["max_new_tokens"]


def _bad_calls(small_target, drafts):
  """Each case: (field the error must name, a call that must raise)."""
  cfg, params = small_target
  dcfg, dparams = drafts["truncated"]
  ocfg, oparams = tiny.random_model(seed=1, vocab_size=32)
  run = lambda prompts=PROMPTS, **kw: generate(params, cfg, prompts, **(GEN | kw))
  return {
    "temperature": lambda: run(temperature=-1.0),
    "temperature must be finite": lambda: run(temperature=float("inf")),
    "integer token ids": lambda: run(prompts=[[1.0, 2.7], [3]]),
    "seed": lambda: run(seed=-1),
    "params have 1 layers": lambda: generate(
      {**params, "layers": params["layers"][:1]}, cfg, PROMPTS, **GEN
    ),
    "drafter_params do not fit": lambda: run(drafter=DraftModel(dcfg, 2), drafter_params=oparams),
    "KV cache": lambda: run(max_len=2**40),
    "top_p": lambda: run(top_p=0.0),
    "top_k": lambda: run(top_k=-2),
    "max_len": lambda: run(max_new_tokens=40, max_len=42),
    "empty": lambda: run(prompts=[[1, 2], []]),
    "vocab_size": lambda: run(drafter=DraftModel(ocfg, 2), drafter_params=oparams),
    "num_draft": lambda: run(drafter=DraftModel(dcfg, -1), drafter_params=dparams),
  }


@pytest.mark.parametrize(
  "field",
  ["temperature", "temperature must be finite", "integer token ids", "seed",
   "params have 1 layers", "drafter_params do not fit", "KV cache", "top_p", "top_k",
   "max_len", "empty", "vocab_size", "num_draft"],
)  # fmt: skip
def test_bad_input_raises_before_compiling(small_target, drafts, field):
  call = _bad_calls(small_target, drafts)[field]
  before = loop.TRACES["generate"]
  with pytest.raises(ValueError, match=field):
    call()
  assert loop.TRACES["generate"] == before


# Each case: (what the one ValueError must say, generate's arguments over PROMPTS and GEN).
BAD_ARGUMENTS = {
  "eos_id_text": ("eos_id must be a token id", dict(eos_id="12")),
  "eos_id_float": ("eos_id must be a token id", dict(eos_id=3.0)),
  "eos_id_padding": (r"eos_id has -1, outside \[0, 64\)", dict(eos_id=-1)),
  "eos_id_outside_vocab": (r"eos_id has 1000, outside \[0, 64\)", dict(eos_id=[3, 1000])),
  "eos_id_overflow": ("eos_id has 1099511627776", dict(eos_id=2**40)),
  "max_new_tokens_float_entry": (
    r"max_new_tokens\[0\] must be an integer",
    dict(prompts=[[1]], max_new_tokens=[2.5]),
  ),
  "max_new_tokens_float": ("max_new_tokens must be an integer", dict(max_new_tokens=4.0)),
  "max_new_tokens_bool": ("max_new_tokens must be an integer", dict(max_new_tokens=True)),
  "drafter_params_without_drafter": ("takes no drafter_params", dict(drafter_params={"w": 1})),
  "drafter_params_for_lookup": (
    "takes no drafter_params",
    dict(drafter=PromptLookup(2), drafter_params={"w": 1}),
  ),
  "verifier_text": ("verifier must be", dict(drafter=PromptLookup(2), verifier="typical")),
  "verifier_none": ("verifier must be", dict(drafter=PromptLookup(2), verifier=None)),
  "verifier_class": (
    "TypicalAcceptance\\(\\)",
    dict(drafter=PromptLookup(2), verifier=verify.TypicalAcceptance, temperature=1.0),
  ),
  "flat_prompt": (r"prompts\[0\] is 1, not a list of token ids", dict(prompts=[1, 2, 3])),
  "none_prompt": (r"prompts\[0\] is None", dict(prompts=[None])),
  "generator_prompts": ("prompts must be a list", dict(prompts=([1, 2] for _ in range(2)))),
  "max_len_float": ("max_len must be an integer", dict(max_len=64.5)),
  "max_len_text": ("max_len must be an integer", dict(max_len="64")),
  "max_len_negative": ("max_len must be an integer", dict(max_len=-1)),
  "seed_float": ("seed must be an integer", dict(seed=1.5)),
  "seed_none": ("seed must be an integer", dict(seed=None)),
  "seed_text": ("seed must be an integer", dict(seed="0")),
  "seed_key_batch": ("seed must be an integer", dict(seed=jax.random.split(jax.random.key(0)))),
  "pad_to_float": ("pad_to must be an integer", dict(pad_to=3.5)),
  "pad_to_text": ("pad_to must be an integer", dict(pad_to="32")),
  "top_k_overflow": (
    r"top_k must be an integer in \[0, 2\*\*31\)",
    dict(temperature=1.0, top_k=10**12),
  ),
  "temperature_text": ("temperature must be a number", dict(temperature="1.0")),
  "temperature_none": ("temperature must be a number", dict(temperature=None)),
  "drafter_class": (r"drafter must be a drafter instance.*DraftModel\(", dict(drafter=DraftModel)),
  "drafter_text": ("drafter must be a drafter instance", dict(drafter="draft_model")),
  "mesh_text": ("mesh must be a jax.sharding.Mesh", dict(mesh="data")),
  "mesh_axes": (
    "mesh must be a jax.sharding.Mesh",
    dict(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))),
  ),
  "target_cfg_dict": ("target_cfg must be a ModelConfig", dict(target_cfg={"vocab_size": 64})),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_argument_is_named_before_compiling(small_target, case):
  """A bad argument is one ValueError naming it, raised before anything is traced."""
  cfg, params = small_target
  match, kw = BAD_ARGUMENTS[case]
  kw = GEN | kw
  prompts, target_cfg = kw.pop("prompts", PROMPTS), kw.pop("target_cfg", cfg)
  before = loop.TRACES["generate"]
  with pytest.raises(ValueError, match=match):
    generate(params, target_cfg, prompts, **kw)
  assert loop.TRACES["generate"] == before


def test_numpy_and_jax_arguments_are_taken_as_their_values(small_target):
  """Prompts as a jax array, numpy integer budgets, seeds and stop ids: checked, not refused."""
  cfg, params = small_target
  args, _ = decode._arguments(
    params, cfg, jnp.asarray([[1, 2, 3], [4, 5, 6]]), decode.AUTOREGRESSIVE, None, np.int64(4),
    48, 0.0, 0, 1.0, np.int64(3), np.int64(5), verify.verify, 0,
  )  # fmt: skip
  assert args[2][:, :3].tolist() == [[1, 2, 3], [4, 5, 6]]
  assert args[5].max_new.tolist() == [4, 4] and 5 in args[5].stop_ids.tolist()


@pytest.mark.parametrize(
  "prefixes, match",
  [
    (np.zeros((0, 3), np.int32), "prefixes is empty"),
    ([1, 2, 3], r"prefixes\[0\] is 1, not a list of token ids"),
    ([[1] * 100], "max_len"),
  ],
)
def test_next_token_probs_bad_prefixes(small_target, prefixes, match):
  cfg, params = small_target
  with pytest.raises(ValueError, match=match):
    decode.next_token_probs(params, cfg, prefixes, max_len=64)
  with pytest.raises(ValueError, match="top_k"):
    decode.next_token_probs(params, cfg, [[1]], temperature=1.0, top_k=10**12)


def test_next_token_probs_is_what_generate_samples(small_target):
  """The public next-token distribution equals the enumerated target's first-token marginal."""
  cfg, params = small_target
  knobs = dict(temperature=0.8, top_k=5)
  got = decode.next_token_probs(params, cfg, [[1, 2, 3], [7]], **knobs)
  as_array = decode.next_token_probs(params, cfg, np.array([[1, 2, 3]]), **knobs)
  np.testing.assert_allclose(as_array, got[:1], atol=1e-6)
  for row, prefix in zip(got, ([1, 2, 3], [7]), strict=True):
    dist = testing.sequence_distribution(
      params, cfg, prefix, 1, sampling.SamplingParams.create(**knobs)
    )
    want = np.array([dist.get((x,), 0.0) for x in range(cfg.vocab_size)])
    np.testing.assert_allclose(row, want, atol=1e-6)
  assert (got > 0).sum(axis=1).tolist() == [5, 5]
  with pytest.raises(ValueError, match="outside"):
    decode.next_token_probs(params, cfg, [[cfg.vocab_size]])


@dataclasses.dataclass(frozen=True)
class OddRowsAbstain(PromptLookup):
  """Prompt lookup whose odd rows always abstain."""

  def propose(self, params, state, ctx):
    draft, state = super().propose(params, state, ctx)
    return draft.replace(abstain=jnp.arange(ctx.tokens.shape[0]) % 2 == 1), state


def test_abstain_counts_per_row(small_target):
  """Per row: the steps its drafter abstained while it was live; and the steps every live row
  abstained (one-token forwards) once only the abstaining row is left."""
  cfg, params = small_target
  out = generate(params, cfg, PROMPTS[:2], drafter=OddRowsAbstain(2), max_new_tokens=[4, 12])
  m = out.metrics
  steps = [calls - 1 for calls in m["row_calls"]]  # the prefill is no step
  assert m["row_abstained"] == [0, steps[1]]
  assert m["abstained_calls"] == steps[1] - steps[0] > 0


def test_library_does_not_import_testing():
  """specjax/testing.py is for tests: no library module imports it."""
  root = Path(decode.__file__).parent
  offenders = [
    str(p.relative_to(root))
    for p in root.rglob("*.py")
    if p.name != "testing.py"
    and re.search(r"\bspecjax\.testing\b|from specjax import .*\btesting\b", p.read_text())
  ]
  assert offenders == []


def test_pad_to_shares_one_program_across_prompt_lengths(small_target, ar_tokens):
  """Batches padded to a run's longest prompt compile once and give the same tokens."""
  cfg, params = small_target
  kw = dict(GEN, pad_to=20)
  first = generate(params, cfg, PROMPTS[:1], **kw)
  before = loop.TRACES["generate"]
  second = generate(params, cfg, PROMPTS[1:2], **kw)
  assert loop.TRACES["generate"] == before
  assert [first.tokens[0], second.tokens[0]] == ar_tokens[:2]


@pytest.mark.parametrize(
  "drafter", [decode.AUTOREGRESSIVE, PromptLookup(2), Lookahead(3, 3, 2, 16)], ids=lambda d: d.name
)
def test_the_loop_updates_the_cache_in_place(small_target, drafter):
  """No copy of a loop-carried cache buffer in the compiled program: with a cache big enough for
  window switching, with the abstain cond (prompt lookup) and with a tree (Lookahead). Either
  costs a copy of every layer's cache every step (measured: the max_len 4096 slowdown)."""
  cfg, params = small_target
  program = decode.compiled(params, cfg, PROMPTS, drafter=drafter, max_len=300)
  slots = 300 + drafter.num_nodes + drafter.num_extra + 1
  shape = f"f32[{len(PROMPTS)},{cfg.num_kv_heads},{slots},{cfg.head_dim}]"
  copies = [
    line
    for line in program.as_text().splitlines()
    if " copy(" in line and shape in line and "broadcast" not in line
  ]
  assert copies == [], copies[:3]
