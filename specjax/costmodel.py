"""What a decoding step costs on a device, and the speedup a drafter's τ is worth there.

A step of speculative decoding is a fixed list of forwards (static shapes: the same whatever
is accepted), ``step_work(drafter)``: e.g. a draft-model chain of K is the draft over 2 tokens,
K - 1 draft forwards over 1, and the target over K + 1. A ``Profile`` prices a forward of each
model over T tokens, plus a fixed per-step overhead (sampling, verification, bookkeeping), so

    predicted speedup = τ x step_seconds(AR) / step_seconds(drafter)

Two kinds of profile:

- ``measure`` (this machine): each forward timed on its own, jitted, batch 1, after a context
  of ``context`` cached tokens, as verification runs it (the cache read-only, its slots those
  of the decode). A drafter whose nodes form a tree (Medusa, EAGLE, branched lookup) is
  verified under a tree mask, which is data, not the causal mask XLA folds into the program:
  that forward (``target_tree``) is timed apart. For the target the cost of T tokens is the
  cheaper of one forward over T and T one-token forwards (a GEMM over T rows vs T
  matrix-vector products). Medusa and prompt lookup are timed as their whole ``propose``. The
  overhead is one AR step measured in decoding minus one target forward.
- ``roofline`` (a named chip, no measurement): a forward over T tokens reads the weights and
  the KV cache once and does 2 x params x T flops, so it takes max(bytes / bandwidth,
  flops / peak). Chips: ``CHIPS``, from their vendors' data sheets (bf16 dense peak, HBM
  bandwidth). It leaves out kernel-launch and host overhead, which dominate for small models
  on a GPU: the roofline is an upper bound on the speedup there.
"""

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling, trees
from specjax.drafters import eagle, prompt_lookup
from specjax.drafters.base import DraftContext, Forward, llama_sizes
from specjax.drafters.curves import eagle_grid, lookup_curve, tau_curve
from specjax.models import llama
from specjax.models.config import ModelConfig

# name: (HBM bytes/s, bf16 dense FLOP/s, source)
CHIPS = {
  "H100-SXM": (3.35e12, 989e12, "NVIDIA H100 data sheet (SXM5: 3.35 TB/s, 989 TFLOPS bf16 dense)"),
  "H200": (4.8e12, 989e12, "NVIDIA H200 data sheet (SXM: 4.8 TB/s, 989 TFLOPS bf16 dense)"),
  "TPU-v5e": (819e9, 197e12, "Google Cloud TPU v5e documentation (819 GB/s, 197 TFLOPS bf16)"),
  "TPU-v5p": (2765e9, 459e12, "Google Cloud TPU v5p documentation (2,765 GB/s, 459 TFLOPS bf16)"),
}


def verifies_tree(drafter) -> bool:
  """Whether ``drafter``'s drafts carry ``parents`` (verified under a tree mask)."""
  return drafter is not None and drafter.verifies_tree


def step_work(drafter) -> tuple[Forward, ...]:
  """The forwards of one decoding step with ``drafter`` (None: autoregressive), as the
  drafter lists them (``step_forwards``)."""
  return (Forward("target", 1),) if drafter is None else drafter.step_forwards()


@dataclasses.dataclass(frozen=True)
class Profile:
  """Seconds per forward (``cost(model, tokens)``) and per step beyond forwards."""

  name: str
  cost: Callable[[str, int], float]
  overhead: float
  source: str

  def step_seconds(self, drafter) -> float:
    return self.overhead + sum(self.cost(f.model, f.tokens) for f in step_work(drafter))

  def speedup(self, drafter, tau: float, abstained: float = 0.0) -> float:
    """τ x (one AR step) / (the mean step with ``drafter``), where a fraction ``abstained`` of
    the steps were one-token forwards (the drafter had nothing to propose)."""
    ar = self.step_seconds(None)
    return tau * ar / (abstained * ar + (1 - abstained) * self.step_seconds(drafter))


# --- roofline ---------------------------------------------------------------------------------


def model_sizes(target_cfg: ModelConfig, drafter, dparams) -> dict[str, tuple[int, int]]:
  """Per model of a step: (parameters read, KV bytes per cached token)."""
  out = {"target": llama_sizes(target_cfg), "lookup": (0, 0)}
  out["target_tree"] = out["target"]
  return out | ({} if drafter is None else drafter.own_sizes(dparams))


def roofline(chip: str, sizes: dict[str, tuple[int, int]], context: int = 256) -> Profile:
  """A named chip's profile from bandwidth and peak flops (bf16 weights and caches)."""
  if chip not in CHIPS:
    raise ValueError(f"unknown chip {chip!r}; known: {', '.join(CHIPS)}.")
  bandwidth, flops, source = CHIPS[chip]

  def cost(model: str, tokens: int) -> float:
    params, kv_per_token = sizes[model]
    bytes_read = 2 * params + kv_per_token * (context + tokens)
    return max(bytes_read / bandwidth, 2 * params * tokens / flops)

  return Profile(chip, cost, 0.0, source)


# --- measured ---------------------------------------------------------------------------------


def median_seconds(fn: Callable[[], jax.Array], repeats: int = 9) -> float:
  """Median wall time of ``fn()`` (compiled by a first call that is not timed)."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def llama_forward_seconds(
  params,
  cfg: ModelConfig,
  sizes,
  context: int,
  repeats: int = 9,
  num_slots: int = 0,
  masks: tuple[str, ...] = ("causal",),
) -> dict[str, dict[int, float]]:
  """``{mask: {T: seconds}}`` of one batch-1 forward over T tokens after ``context`` cached
  ones, run as verification runs it (``llama.forward_kv``: the cache of ``num_slots`` slots,
  by default just enough, read only), under a causal mask (a constant) and/or a tree mask
  (``"tree"``: data, as a tree's ancestors are). The median of ``repeats`` rounds, each timing
  every (mask, T) once: a slow spell of a shared machine then lands on every size alike."""

  fwd = functools.partial(_forward_logits, cfg=cfg, context=context)
  num_slots = num_slots or context + max(sizes) + 1
  if context + max(sizes) > num_slots:
    raise ValueError(f"context {context} + {max(sizes)} tokens do not fit {num_slots} slots.")
  cache = llama.init_cache(cfg, 1, num_slots, llama.param_dtype(params))
  cache = cache.replace(lengths=jnp.asarray([context], jnp.int32))
  tree = lambda t: trees.ancestors(jnp.zeros((1, t - 1), jnp.int32))  # noqa: E731  (a star)
  mask = lambda m, t: llama.causal_mask(t) if m == "causal" or t == 1 else tree(t)  # noqa: E731
  jobs = {(m, t): (jnp.ones((1, t), jnp.int32), mask(m, t)) for m in masks for t in sizes}
  for tokens, mask in jobs.values():  # compile
    jax.block_until_ready(fwd(params, cache, tokens, mask))
  times = {job: [] for job in jobs}
  for _ in range(repeats):
    for job, (tokens, mask) in jobs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fwd(params, cache, tokens, mask))
      times[job].append(time.perf_counter() - t0)
  return {m: {t: statistics.median(times[m, t]) for t in sizes} for m in masks}


@functools.partial(jax.jit, static_argnames=("cfg", "context"))
def _forward_logits(params, cache, tokens_1xT, mask, *, cfg: ModelConfig, context: int):
  """The verify forward that ``llama_forward_seconds`` times (one program per model, context
  and shape, shared by every call that times it)."""
  positions = context + jnp.arange(tokens_1xT.shape[1])[None]
  logits, _, _ = llama.forward_kv(params, cfg, tokens_1xT, positions, cache, mask)
  return logits


TARGET_PARTS = {"causal": "target", "tree": "target_tree"}  # mask -> step_work's model name


def target_seconds(
  target, sizes, context: int, num_slots: int, repeats: int, masks=("causal", "tree")
) -> dict:
  """``{"target": {T: s}, "target_tree": {T: s}}``: the target's verify forwards, timed under
  each of ``masks``. ``"target"`` always holds T = 1 (an AR step: one token, no tree)."""
  by_mask = llama_forward_seconds(target.params, target.cfg, sorted(sizes), context, repeats,
                                  num_slots, tuple(masks))  # fmt: skip
  out = {TARGET_PARTS[m]: by_mask[m] for m in masks}
  out.setdefault("target", {1: by_mask[masks[0]][1]})
  return out


def drafter_seconds(
  drafter, dparams, target_cfg: ModelConfig, context: int, repeats: int = 9, also=()
):
  """``{model: {T: seconds}}`` for the drafter's own forwards in ``step_work``, and those of
  the drafters ``also`` (the same weights in other shapes, e.g. EAGLE at other budgets with
  the same ``top_k``)."""
  models = {}
  for f in (f for d in (drafter, *also) for f in step_work(d)):
    if not f.model.startswith("target"):
      models.setdefault(f.model, set()).add(f.tokens)
  out = {}
  for model, sizes in models.items():
    if model == "draft_model":
      out[model] = llama_forward_seconds(dparams, drafter.cfg, sorted(sizes), context,
                                         repeats)["causal"]  # fmt: skip
    elif model in ("eagle", "eagle_level"):
      rows = 1 if model == "eagle" else drafter.top_k
      out[model] = {t: _eagle_seconds(drafter, dparams, t, rows, repeats) for t in sorted(sizes)}
    elif model in ("medusa", "lookup"):  # the whole propose: heads, top-k, the tree's tokens
      state = jnp.ones((1, target_cfg.dim), jnp.float32) if model == "medusa" else None
      ctx = DraftContext(
        tokens=jnp.ones((1, context + 64), jnp.int32), lengths=jnp.asarray([context], jnp.int32),
        key=jax.random.key(0), sampling=sampling.SamplingParams.create(0.0),
        vocab_size=target_cfg.vocab_size,
      )  # fmt: skip
      fn = jax.jit(lambda p, s, ctx: drafter.propose(p, s, ctx)[0].tokens)
      run = lambda fn=fn, s=state, ctx=ctx: fn(dparams, s, ctx)  # noqa: E731
      out[model] = {1: median_seconds(run, repeats)}
  return out


def _eagle_seconds(drafter, p, t: int, head_rows: int, repeats: int) -> float:
  """One EAGLE forward over t pairs (fc, the layer) with no cache, its head on the last
  ``head_rows``."""
  fwd = functools.partial(_eagle_logits, cfg=drafter.cfg, head_rows=head_rows)
  width = drafter.cfg.target.dim * len(drafter.feature_layers)
  s = jnp.ones((1, t, width), jnp.float32)
  return median_seconds(lambda: fwd(p, jnp.ones((1, t), jnp.int32), s), repeats)


@functools.partial(jax.jit, static_argnames=("cfg", "head_rows"))
def _eagle_logits(p, tokens_1xT, s_1xTxF, *, cfg, head_rows: int):
  """The EAGLE forward that ``_eagle_seconds`` times."""
  t = tokens_1xT.shape[1]
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  x = eagle.inputs(p, cfg, tokens_1xT, eagle.fuse(p, s_1xTxF))
  out, _, _ = eagle.layer(p, cfg, x, jnp.arange(t)[None], None, None, attn)
  return eagle.logits(p, cfg, out[:, t - head_rows :])


def measured(name: str, target_parts: dict, drafter_parts: dict, overhead: float) -> Profile:
  """A profile from timed forwards, ``{model: {T: seconds}}`` (interpolated in T); for the
  target (``target``, ``target_tree``), the cheaper of one forward over T and T one-token
  forwards."""
  tables = target_parts | drafter_parts

  def cost(model: str, tokens: int) -> float:
    table = tables[model]
    xs = sorted(table)
    t = float(np.interp(tokens, xs, [table[x] for x in xs]))
    return min(t, tokens * table[xs[0]]) if model.startswith("target") and xs[0] == 1 else t

  return Profile(name, cost, overhead, "timed on this machine (batch 1, jitted, median)")


# --- num_draft = "auto" -----------------------------------------------------------------------


def _machine_profile(config, target, sizes, drafter, dparams, repeats: int) -> Profile:
  """This machine's profile for ``drafter``: the target's forwards over ``sizes`` tokens and
  the drafter's own, timed here, and the per-step overhead (a short AR decode minus one
  forward)."""
  target_s, overhead = _machine_target(config, target, sizes, repeats, drafter)
  parts = drafter_seconds(drafter, dparams, target.cfg, _context(config), repeats)
  return measured("this machine", target_s, parts, overhead)


def _context(config) -> int:
  return min(128, config.max_len // 2)


def _machine_target(config, target, sizes, repeats: int, drafter) -> tuple[dict, float]:
  """The target's forwards over ``sizes`` tokens timed here (``target_seconds``), under the
  one mask ``drafter`` verifies with, and the decode loop's per-step overhead beyond one
  forward."""
  context = _context(config)
  slots = config.max_len + max(sizes)
  masks = ("tree",) if verifies_tree(drafter) else ("causal",)
  target_s = target_seconds(target, {1, *sizes}, context, slots, repeats, masks)
  step = ar_step_seconds(config, target, context)
  return target_s, max(step - target_s["target"][1], 0.0)


def ar_step_seconds(config, target, context: int) -> float:
  """One AR step of the decode loop after ``context`` cached tokens: decodes of s and 2s
  tokens, the difference over s (their prefills cancel)."""
  from specjax.decode import generate

  prompt, s = [[1] * context], max(1, min(16, (config.max_len - context) // 2))

  def decode_seconds(n: int) -> float:
    t0 = time.perf_counter()
    generate(target.params, target.cfg, prompt, max_new_tokens=n, max_len=config.max_len)
    return time.perf_counter() - t0

  decode_seconds(s)  # compile (the budget is traced: one program for both)
  return (decode_seconds(2 * s) - decode_seconds(s)) / s


def _k_limit(config, most: int) -> int:
  return min(most, config.drafter.max_depth, config.drafter.max_nodes)


def auto_chain_length(config, target, drafter, dparams, repeats: int = 5):
  """The draft model with the K (within ``config.drafter.max_depth`` and ``max_nodes``) whose
  predicted speedup is best on this machine: τ(K) from the offline simulation, step costs
  from forwards timed here."""
  curve = tau_curve(config.drafter.draft_model.auto_from, config, target.cfg.name)
  ks = [k for k in sorted(curve) if k <= _k_limit(config, max(curve))]
  profile = _machine_profile(config, target, [k + 1 for k in ks], drafter, dparams, repeats)
  options = {k: profile.speedup(dataclasses.replace(drafter, num_draft=k), curve[k]) for k in ks}
  best = max(options, key=lambda k: (options[k], -k))
  table = ", ".join(f"K={k}: τ {curve[k]:.2f} → {options[k]:.2f}x" for k in ks)
  print(f"num_draft=auto: {table}; chose K={best}")
  if options[best] < 1:
    print(f"num_draft=auto: even K={best} is predicted slower than AR on this machine.")
  return dataclasses.replace(drafter, num_draft=best)


# --- prompt lookup: K and min_ngram for the machine ---------------------------------------------


def lookup_grid(target, rows, k_max: int, max_ngram: int = 3) -> list[dict]:
  """Prompt lookup (a chain, abstaining where nothing matches) replayed for every K in
  1..k_max and min_ngram in 1..max_ngram over ``rows`` (prompt ids, the target's greedy new
  ids): ``[{num_draft, min_ngram, tau, abstained}]``, ``abstained`` the share of target calls
  that were one-token steps. Stateless, so no model runs."""
  from specjax import simulate

  out = []
  for n in range(1, max_ngram + 1):
    for k in range(1, k_max + 1):
      d = prompt_lookup.PromptLookup(k, max_ngram=max_ngram, min_ngram=n)
      r = simulate.replay(target, d, None, rows)
      out.append({"num_draft": k, "min_ngram": n, "tau": r.tau, "abstained": r.abstained / r.calls})
  return out


def auto_lookup(config, target, drafter, repeats: int = 5):
  """Prompt lookup with the (K, min_ngram) whose predicted speedup is best on this machine:
  τ and abstentions from the offline replay in the ``auto_from`` file, step costs timed here.
  Where verifying K + 1 tokens costs several one-token forwards (a CPU), a longer min_ngram
  (abstain unless the match is long: an AR step) beats guessing from one-token matches."""
  grid = lookup_curve(config.drafter.prompt_lookup.auto_from, target.cfg.name)
  limit = _k_limit(config, max(g["num_draft"] for g in grid))
  grid = [g for g in grid if g["num_draft"] <= limit]
  k_max = max(g["num_draft"] for g in grid)
  sizes = sorted({2, 3, (k_max + 3) // 2, k_max + 1})  # timed; the T between, interpolated
  print(f"prompt_lookup num_draft=auto: timing the target's forwards over {sizes} tokens ...")
  profile = _machine_profile(config, target, sizes, drafter, None, repeats)

  def speedup(g):
    d = dataclasses.replace(drafter, num_draft=g["num_draft"], min_ngram=g["min_ngram"])
    return profile.speedup(d, g["tau"], g["abstained"])

  best = max(grid, key=lambda g: (speedup(g), -g["num_draft"], -g["min_ngram"]))
  top = sorted(grid, key=speedup, reverse=True)[:3]
  table = ", ".join(f"K={g['num_draft']} min_ngram={g['min_ngram']}: τ {g['tau']:.2f} → "
                    f"{speedup(g):.2f}x" for g in top)  # fmt: skip
  print(f"prompt_lookup num_draft=auto (best of {len(grid)}): {table}; chose "
        f"K={best['num_draft']}, min_ngram={best['min_ngram']}")  # fmt: skip
  if speedup(best) < 1:
    print("prompt_lookup num_draft=auto: every setting is predicted slower than AR here.")
  return dataclasses.replace(drafter, num_draft=best["num_draft"], min_ngram=best["min_ngram"])


# --- EAGLE-2: the tree budget for the machine ---------------------------------------------------


def eagle_profiles(target_s, overhead, drafter, dparams, target_cfg, budgets, context, repeats):
  """``{top_k: Profile}`` pricing ``drafter`` at every ``(top_k, depth, total)`` in
  ``budgets``: its forwards timed once per ``top_k`` (the head reads top_k rows per level)."""
  out = {}
  for k in sorted({b[0] for b in budgets}):
    shapes = [dataclasses.replace(drafter, top_k=k, depth=d, total=n) for kk, d, n in budgets
              if kk == k]  # fmt: skip
    parts = drafter_seconds(shapes[0], dparams, target_cfg, context, repeats, also=shapes[1:])
    out[k] = measured("this machine", target_s, parts, overhead)
  return out


def auto_eagle(config, target, drafter, dparams, repeats: int = 5):
  """EAGLE-2 with the tree budget ``(top_k, depth, total)`` (within ``config.drafter``'s
  ``max_depth`` and ``max_nodes``) whose predicted speedup is best on this machine: greedy τ
  of every budget from the offline replay in the ``auto_from`` file, step costs timed here."""
  c = config.drafter.eagle
  grid = [
    g
    for g in eagle_grid(c.auto_from, target.cfg.name, c.path)
    if g["depth"] <= config.drafter.max_depth and g["total"] <= config.drafter.max_nodes
  ]
  if not grid:
    raise ValueError(
      f"config.drafter.eagle.auto_from={c.auto_from!r}: no tree budget of its eagle_grid fits "
      f"config.drafter.max_depth={config.drafter.max_depth} and max_nodes="
      f"{config.drafter.max_nodes}; raise them."
    )  # fmt: skip
  budgets = [(g["top_k"], g["depth"], g["total"]) for g in grid]
  sizes = sorted({n + 1 for _, _, n in budgets})
  print(f"eagle total=auto: timing {len(budgets)} tree budgets' forwards here ...")
  target_s, overhead = _machine_target(config, target, sizes, repeats, drafter)
  profiles = eagle_profiles(target_s, overhead, drafter, dparams, target.cfg, budgets,
                            _context(config), repeats)  # fmt: skip

  def speedup(g):
    d = dataclasses.replace(drafter, top_k=g["top_k"], depth=g["depth"], total=g["total"])
    return profiles[g["top_k"]].speedup(d, g["tau"])

  best = max(grid, key=lambda g: (speedup(g), -g["total"], -g["depth"]))
  top = sorted(grid, key=speedup, reverse=True)[:3]
  name = lambda g: f"{g['top_k']}x{g['depth']} with {g['total']} nodes"  # noqa: E731
  table = ", ".join(f"{name(g)}: τ {g['tau']:.2f} → {speedup(g):.2f}x" for g in top)
  print(f"eagle total=auto (best of {len(grid)}, greedy τ): {table}; chose {name(best)}")
  if speedup(best) < 1:
    print("eagle total=auto: every tree budget is predicted slower than AR here.")
  return dataclasses.replace(drafter, top_k=best["top_k"], depth=best["depth"], total=best["total"])
