"""The draft-model drafter: an independent smaller LM with its own KV cache.

Each step feeds the draft model the two newest committed tokens (slots L-1, L), then its own
samples one at a time, K forwards in all. Re-feeding slot L-1 makes the cache right whatever
the last step accepted: after a full acceptance the draft never saw its K-th token, and
otherwise the rewrite is identical to what is there. So the draft cache needs no commit:
like the target's, it is rolled back by lengths alone (it borrows the target's).

Config (``config.drafter.draft_model``): ``num_draft`` K, or ``"auto"``: the K with the best
speedup predicted for the machine it runs on (``costmodel.auto`` with the family's ``tune``: τ
for every K from the offline simulation in the ``auto_from`` file that ``task=cost_model``
wrote, step costs timed here); ``source`` = ``truncate`` (the target's first ``num_layers``
layers) or ``model`` (the ``model`` subsection, any model source: registry, gguf, safetensors,
random).
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
from flax import struct
from ml_collections import config_dict

from specjax import sampling
from specjax.drafters import curves
from specjax.drafters.base import (
  Draft,
  DraftContext,
  DrafterBase,
  Forward,
  Prefill,
  check_auto_from,
  check_num_draft,
  llama_sizes,
  verify_forward,
)
from specjax.models import llama, source, tiny
from specjax.models.cache import KVCache, gather_rows
from specjax.models.config import ModelConfig

FIELD = "config.drafter.draft_model"


@struct.dataclass
class DraftModelState:
  cache: KVCache


@dataclasses.dataclass(frozen=True)
class DraftModel(DrafterBase):
  cfg: ModelConfig
  num_draft: int
  name: str = "draft_model"

  def __post_init__(self):
    check_num_draft(self.num_draft, low=1)

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.num_draft = config_dict.FieldReference(4, field_type=object)  # K per step, or "auto"
    c.auto_from = ""  # num_draft = "auto": a cost_model.json with this pair's tau for every K
    c.source = "truncate"  # truncate: the target's first num_layers layers | model
    c.num_layers = 1  # layers kept when source = truncate
    c.model = source.config()  # used when source = model (fields: models/source.py)
    return c

  @classmethod
  def check(cls, c, config):
    if c.num_draft == "auto":
      name = check_auto_from(c, FIELD, "with this draft model (it holds tau for every K)", config)
      curves.tau_curve(c.auto_from, config, name)  # its curve is for this target and draft
    else:
      try:
        check_num_draft(c.num_draft, f"{FIELD}.num_draft", low=1)
      except ValueError as e:
        raise ValueError(f"{e} Or 'auto' (with auto_from) to pick K for this machine.") from None
    source.choice(c.source, ("truncate", "model"), "drafter.draft_model.source")
    # The sizes from the files' headers (or a random model's fields), before any weights load.
    target = source.header_config(config.target)
    if c.source == "model":
      source.check(c.model, "drafter.draft_model.model")
      dcfg = source.header_config(c.model, f"{FIELD}.model")
      if dcfg.vocab_size != target.vocab_size:
        given = f".vocab_size={dcfg.vocab_size}" if c.model.source == "random" else (
          f" ({dcfg.name!r}) has a vocab_size of {dcfg.vocab_size}, which")  # fmt: skip
        raise ValueError(
          f"{FIELD}.model{given} differs from the target's {target.vocab_size}: a draft model "
          "must share the target's tokenizer; pick one of the target's model family."
        )
    else:
      _check_truncation(c.num_layers, target.num_layers)
      dcfg = dataclasses.replace(target, num_layers=c.num_layers)
    if c.num_draft == "auto":
      return None  # K is picked once the models load
    if c.num_draft > config.drafter.max_depth:
      raise ValueError(
        f"{FIELD}.num_draft={c.num_draft} is more than config.drafter.max_depth="
        f"{config.drafter.max_depth} (the most draft tokens a step may accept): lower num_draft "
        "or raise max_depth."
      )
    return cls(dcfg, c.num_draft)  # its step budget is checked too

  @classmethod
  def build(cls, c, config, target: source.Model):
    if c.source == "truncate":
      _check_truncation(c.num_layers, target.cfg.num_layers)
      dcfg, dparams = tiny.truncated(target.cfg, target.params, c.num_layers)
    else:
      draft = source.load_shared(c.model)
      source.check_same_tokenizer(target, draft)
      dcfg, dparams = draft.cfg, draft.params
    d = cls(dcfg, 1 if c.num_draft == "auto" else c.num_draft)  # auto: K is set by build.drafter
    d.check_target(target.cfg)
    return d, dparams

  def check_target(self, target_cfg: ModelConfig) -> None:
    if target_cfg.vocab_size != self.cfg.vocab_size:
      raise ValueError(
        f"draft vocab_size ({self.cfg.vocab_size}) != target vocab_size "
        f"({target_cfg.vocab_size}): a draft model must share the target's tokenizer."
      )

  def check_params(self, params) -> None:
    try:
      llama.check_params(self.cfg, params)
    except ValueError as e:
      raise ValueError(f"drafter_params do not fit the draft model: {e}") from None

  def draft_calls_per_step(self) -> int:
    return self.num_draft

  def init(self, params, prefill: Prefill):
    b, p = prefill.tokens.shape
    cache = llama.init_cache(self.cfg, b, prefill.num_slots, llama.param_dtype(params))
    positions = jnp.broadcast_to(jnp.arange(p), (b, p))
    _, _, cache = llama.forward(
      params, self.cfg, prefill.tokens, positions, cache, llama.causal_mask(p), window=p
    )
    return DraftModelState(cache=cache.replace(lengths=prefill.lengths))

  def _step(self, params, cache, tokens_BxT, positions_BxT, key, sp):
    """One draft forward: returns (q of the last token [B, V], its sample [B], cache)."""
    t = tokens_BxT.shape[1]
    logits, _, cache = llama.forward(
      params, self.cfg, tokens_BxT, positions_BxT, cache, llama.causal_mask(t)
    )
    q_BxV = sampling.probs(logits[:, -1], sp)
    return q_BxV, sampling.sample(key, q_BxV, sp), cache.replace(lengths=cache.lengths + t)

  def step_forwards(self):
    """Its first forward re-feeds the two newest tokens (no commit needed), then one per draft
    token."""
    own = (Forward("draft_model", 2),) + (Forward("draft_model", 1),) * (self.num_draft - 1)
    return own + (verify_forward(self),)

  def own_sizes(self, params):
    del params
    return {"draft_model": llama_sizes(self.cfg)}

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """Node n's token at root r is the draft's argmax after ``x[:r + n]``: one draft forward
    over the whole text gives every root's chain at once."""
    del target
    logits, _ = llama.logits_of(params, self.cfg, x_1xS)
    argmax_S = jnp.argmax(logits[0], -1)
    depth_K = jnp.arange(1, self.num_draft + 1)
    tokens = argmax_S[jnp.minimum(roots_R[:, None] + depth_K[None] - 1, row_len - 1)]
    return tokens, None, jnp.zeros(roots_R.shape, bool)

  def propose(self, params, state, ctx: DraftContext):
    keys = jax.random.split(ctx.key, self.num_draft)
    last2_Bx2 = ctx.lengths[:, None] + jnp.array([-1, 0])
    cache = state.cache.replace(lengths=ctx.lengths - 1)
    q_BxV, x_B, cache = self._step(
      params, cache, gather_rows(ctx.tokens, last2_Bx2), last2_Bx2, keys[0], ctx.sampling
    )

    def body(carry, key):
      x_B, cache = carry
      q_BxV, nxt_B, cache = self._step(
        params, cache, x_B[:, None], cache.lengths[:, None], key, ctx.sampling
      )
      return (nxt_B, cache), (nxt_B, q_BxV)

    (_, cache), (xs_KxB, qs_KxBxV) = jax.lax.scan(body, (x_B, cache), keys[1:])
    tokens_BxK = jnp.concatenate([x_B[:, None], xs_KxB.T], axis=1)
    probs_BxKxV = jnp.concatenate([q_BxV[:, None], jnp.moveaxis(qs_KxBxV, 0, 1)], axis=1)
    return Draft(tokens=tokens_BxK, probs=probs_BxKxV), DraftModelState(cache=cache)

  def commit(self, state, verdict, ctx):
    return state


def _check_truncation(num_layers: int, target_layers: int) -> None:
  if not 1 <= num_layers < target_layers:
    raise ValueError(
      f"{FIELD}.num_layers={num_layers} must be in [1, {target_layers}) to truncate the target "
      "into a draft."
    )
