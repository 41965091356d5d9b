"""EAGLE's training objective: the drafter's layer on the frozen target's features, trained
on the target's own text (``config.objective.name = "eagle"``; the interface is
``train/objectives.py``'s ``Objective``). Specjax's architecture and the published EAGLE-1 and
EAGLE-3 ones (``objective.eagle.architecture``) train here alike.
"""

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from specjax import losses, parallel
from specjax.drafters import artifact, prompt_lookup
from specjax.drafters.base import sampled_candidates
from specjax.drafters.eagle import drafter as eagle_drafter
from specjax.drafters.eagle import model as eagle
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.typing import Params


def architecture(c: ml_collections.ConfigDict, field: str = "config.objective.eagle") -> str:
  """``c.architecture`` of an ``objective.eagle`` config, ``auto`` resolved (see
  ``EagleFeatures.config``)."""
  arch = c.get("architecture", "specjax")  # configs from before the field: specjax's
  if arch != "auto":
    return arch
  if c.init_from:
    saved = eagle.read_meta(c.init_from, f"{field}.init_from")["eagle"]
    return saved.get("architecture", "specjax")
  several = len(c.feature_layers) > 1 and c.inputs == eagle.INPUTS[0] and c.copy_layer < 0
  return "eagle3" if several else "specjax"


@dataclasses.dataclass(frozen=True)
class EagleFeatures:
  """EAGLE (``drafters/eagle``): one decoder layer on the frozen target's features.

  Pair t = (s_t, token t + 1) is drafted from the target's own feature f_t (teacher forcing:
  one target forward per batch gives every pair its input and labels). Its output is trained
  towards f_{t + 1} (smooth-L1, weight ``feature_weight``) and its distribution towards the
  target's at t + 1 (``token_loss``, one of ``losses.TOKEN_LOSSES``; weight ``token_weight``);
  the input features get uniform noise of width ``noise`` (robustness to the drafter's own,
  imperfect features at decode time).
  """

  target_cfg: ModelConfig
  eagle: eagle.EagleConfig
  vocab_ids: tuple | None = None  # the draft vocabulary's target ids; None = all of them
  copy_layer: int = -1  # the target layer the drafter's layer starts from; -1 = random
  noise: float = 0.2
  feature_weight: float = 1.0
  token_weight: float = 0.1
  rollout: int = 1  # training-time test: steps unrolled on the drafter's own outputs
  rollout_decay: float = 0.8
  init_from: str = ""
  token_loss: str = "soft_ce"  # the token term (losses.TOKEN_LOSSES)
  hass_top_k: int = 0  # HASS's top-k term (0 = off) ...
  hass_weight: float = 1.0  # ... added to the token term with this weight
  name: str = "eagle"
  rules: parallel.Rules = ()
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.eagle``: what the drafter reads and how it is trained."""
    c = ml_collections.ConfigDict()
    # specjax | eagle1 | eagle3: specjax's own variant, or the published EAGLE-1/2 or EAGLE-3
    # architecture exactly (drafters/eagle/model.py), which export_drafter writes for vLLM/SGLang.
    # auto: the published EAGLE-3 where several feature layers are read (it drafted better than
    # specjax's EAGLE-3 at equal budget: experiments/eagle_smollm2, official_eagle3_300), unless
    # the config asks for what only specjax's variant has (an input ablation, a copied layer);
    # specjax's variant for the final feature alone; init_from's architecture when continuing.
    c.architecture = "auto"
    c.feature_layers = ("final",)  # target features read ("final" = EAGLE-1)
    c.inputs = "feature+token"  # what each pair feeds the layer: feature+token | feature | token
    c.vocab_size = 0  # draft vocabulary V' (0 = the target's): the most frequent training tokens
    c.copy_layer = -1  # start the drafter's layer from this target layer; -1 = random
    # The layer's MLP width: 0 = the target's (or, with init_from, the drafter's). Wider than
    # init_from's drafter: its MLP is widened without changing what it computes (eagle.widen).
    c.ffn_dim = 0
    c.noise = 0.2  # width of the uniform noise added to input features
    c.feature_weight = 1.0  # smooth-L1 on the next feature
    c.token_weight = 0.1  # the token term, on the next token
    # The token term (specjax.losses.TOKEN_LOSSES): soft_ce (cross-entropy on the
    # target's distribution), kl, rkl, jsd, tv (1 - acceptance), nla, ce (on its argmax), lk.
    c.loss = "soft_ce"
    # HASS's harmonized objective distillation: + hass_weight x the soft cross-entropy on the
    # target's hass_top_k most likely tokens (0 = off; HASS: 10 and 1.0), every rollout step.
    # (HASS's context alignment is the rollout itself: step j attends to the drafter's own
    # outputs of the steps before, as a depth-j tree node does at decode time.)
    c.hass_top_k = 0
    c.hass_weight = 1.0
    c.rollout = 1  # training-time test (EAGLE-3): steps unrolled on the drafter's own outputs
    c.rollout_decay = 0.8  # loss weight of rollout step j: rollout_decay ** (j - 1)
    c.init_from = ""  # a trained drafter (a draft_final directory) to continue from
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    f = "config.objective.eagle"
    if int(c.vocab_size) != c.vocab_size or c.vocab_size < 0:
      raise ValueError(f"{f}.vocab_size must be an integer >= 0 (0 = the target's).")
    if not tuple(c.feature_layers):
      raise ValueError(
        f"{f}.feature_layers is empty: an EAGLE drafter reads at least one target feature; "
        "name them, e.g. ('final',) (EAGLE-1) or layer indices (EAGLE-3)."
      )
    for key in ("noise", "feature_weight", "token_weight"):
      if not 0 <= c[key] < math.inf:
        raise ValueError(f"{f}.{key} must be finite and >= 0, got {c[key]}.")
    if int(c.ffn_dim) != c.ffn_dim or c.ffn_dim < 0:
      raise ValueError(f"{f}.ffn_dim must be an integer >= 0 (0 = the target's MLP width).")
    if int(c.rollout) != c.rollout or c.rollout < 1:
      raise ValueError(f"{f}.rollout must be an integer >= 1 (1 = teacher forcing only).")
    if not 0 < c.rollout_decay <= 1:
      raise ValueError(f"{f}.rollout_decay must be in (0, 1], got {c.rollout_decay}.")
    if not c.feature_weight + c.token_weight > 0:
      raise ValueError(f"{f}: feature_weight and token_weight cannot both be 0.")
    if c.inputs not in eagle.INPUTS:
      raise ValueError(
        f"{f}.inputs={c.inputs!r} is unknown; choose one of {', '.join(eagle.INPUTS)} (the "
        "input ablation: both halves of the pair, the feature alone, the token alone)."
      )
    losses.check_token_loss(c.loss, f"{f}.loss")
    if int(c.hass_top_k) != c.hass_top_k or c.hass_top_k < 0:
      raise ValueError(f"{f}.hass_top_k must be an integer >= 0 (0 = off), got {c.hass_top_k}.")
    if not 0 <= c.hass_weight < math.inf:
      raise ValueError(f"{f}.hass_weight must be finite and >= 0, got {c.hass_weight}.")
    if c.init_from:
      eagle.read_meta(c.init_from, f"{f}.init_from")

  @classmethod
  def check_seq_len(cls, c: ml_collections.ConfigDict, seq_len: int) -> None:
    """Rollout step j at position t learns the target at t + j (its next token, t + j + 1):
    the first step's labels need 3 tokens a row, each further step one more."""
    if c.rollout + 2 > seq_len:
      raise ValueError(
        f"config.objective.eagle.rollout={c.rollout} needs rows of at least {c.rollout + 2} "
        f"tokens (a pair, its label's token, then one more per rollout step), but "
        f"config.data.seq_len={seq_len}: no position would train; raise seq_len or lower rollout."
      )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "EagleFeatures":
    f = "config.objective.eagle"
    layers = tuple(c.feature_layers)
    try:
      llama.check_features(target, layers)
    except ValueError as e:
      raise ValueError(f"{f}.feature_layers: {e}") from None
    try:
      cfg = eagle.EagleConfig(target, layers, c.vocab_size, c.inputs, c.ffn_dim, architecture(c, f))
    except ValueError as e:  # EagleConfig names the drafter's fields: these are the objective's
      said = str(e).replace(eagle.FIELD, f)
      raise ValueError(said if said.startswith(f) else f"{f}: {said}") from None
    if not -1 <= c.copy_layer < target.num_layers:
      raise ValueError(f"{f}.copy_layer={c.copy_layer} must be -1 or in [0, {target.num_layers}).")
    if c.copy_layer >= 0 and cfg.architecture == "eagle3":
      raise ValueError(
        f"{f}.copy_layer={c.copy_layer}: architecture='eagle3' reads 2F-wide pairs, which no "
        "target layer does; set copy_layer = -1."
      )
    if c.copy_layer >= 0 and cfg.mlp_width != target.ffn_dim:
      raise ValueError(
        f"{f}.copy_layer={c.copy_layer} copies a target layer, whose MLP is {target.ffn_dim} "
        f"wide, not ffn_dim={c.ffn_dim}: set ffn_dim = 0 or copy_layer = -1."
      )
    if c.init_from:
      saved = eagle.EagleConfig.fromdict(eagle.read_meta(c.init_from, f"{f}.init_from")["eagle"])
      if (saved.feature_layers, saved.target.dim) != (cfg.feature_layers, cfg.target.dim):
        raise ValueError(
          f"{f}.init_from={c.init_from!r} reads features {saved.feature_layers} of a "
          f"{saved.target.dim}-wide target, not {cfg.feature_layers} of {target.dim}."
        )
      if saved.architecture != cfg.architecture:
        raise ValueError(
          f"{f}.init_from={c.init_from!r} has architecture={saved.architecture!r}, not "
          f"{cfg.architecture!r}: set {f}.architecture={saved.architecture!r}."
        )
      if saved.inputs != cfg.inputs:
        raise ValueError(
          f"{f}.init_from={c.init_from!r} was trained with inputs={saved.inputs!r}, not "
          f"{cfg.inputs!r}: set {f}.inputs={saved.inputs!r} or start from scratch."
        )
      if c.ffn_dim and c.ffn_dim < saved.mlp_width:
        raise ValueError(
          f"{f}.ffn_dim={c.ffn_dim} is narrower than init_from's MLP ({saved.mlp_width}): a "
          "drafter is widened, never narrowed; set ffn_dim = 0 to keep its width."
        )
      # Its vocabulary is kept, and its width unless ffn_dim asks for a wider one.
      width = c.ffn_dim or saved.ffn_dim
      cfg = dataclasses.replace(cfg, vocab_size=saved.vocab_size, ffn_dim=width)
    return cls(
      target, cfg, copy_layer=c.copy_layer, noise=c.noise, feature_weight=c.feature_weight,
      token_weight=c.token_weight, rollout=c.rollout, rollout_decay=c.rollout_decay,
      init_from=c.init_from, token_loss=c.loss, hass_top_k=c.hass_top_k,
      hass_weight=c.hass_weight,
    )  # fmt: skip

  def with_data(self, dataset, tokenizer) -> "EagleFeatures":
    if self.init_from:
      ids = eagle.read_trained(self.init_from)["vocab_ids"]
      return dataclasses.replace(self, vocab_ids=tuple(int(i) for i in ids))
    if not self.eagle.vocab_size:
      return self
    ids = artifact.frequent_ids(
      dataset, self.target_cfg.vocab_size, self.eagle.vocab_size, tokenizer
    )
    return dataclasses.replace(self, vocab_ids=ids)

  def _vocab(self) -> jax.Array:
    if self.vocab_ids is None:
      return jnp.arange(self.eagle.draft_vocab, dtype=jnp.int32)
    return jnp.asarray(self.vocab_ids, jnp.int32)

  def describe(self) -> str:
    trained = self.eagle.trained
    shapes = eagle.param_shapes(self.eagle)
    n = sum(math.prod(s) for k, s in shapes.items() if k.partition(".")[0] in trained)
    return (
      f"EAGLE drafter ({self.eagle.architecture}) reading {list(self.eagle.feature_layers)}, "
      f"one layer (MLP {self.eagle.mlp_width} wide), draft vocabulary "
      f"{self.eagle.draft_vocab} ({n / 1e6:.2f} M trained params)"
    )

  def init(self, key: jax.Array, frozen: Params) -> Params:
    if self.init_from:
      trained = eagle.read_trained(self.init_from)
      keep = self.eagle.trained
      trained = {k: jax.tree.map(jnp.asarray, v) for k, v in trained.items() if k in keep}
      return eagle.widen(trained, self.eagle, key)
    copy = None if self.copy_layer < 0 else self.copy_layer
    params = eagle.init_params(self.eagle, key, frozen, self._vocab(), copy)
    return {k: params[k] for k in self.eagle.trained if k in params}

  def model_params(self, params: Params, frozen: Params) -> Params:
    return dict(params) | eagle.frozen_params(self.eagle, frozen, self._vocab())

  def cached_features(self) -> tuple:
    """The drafter's input features, then the final one (labels and the target's logits)."""
    return tuple(dict.fromkeys(self.eagle.feature_layers + (llama.FINAL,)))

  def _features(self, frozen, batch):
    """Target logits, the drafter's input features and the final feature (its label): from
    the batch's cached features (``cached_features`` order; logits = the target's head on the
    final one) or from one target forward."""
    wanted = self.cached_features()
    if "features" in batch:
      f = self.target_cfg.dim
      cached = batch["features"].astype(jnp.float32)
      feats = [cached[..., i * f : (i + 1) * f] for i in range(len(wanted))]
      logits_BxTxV = llama.head(frozen, self.target_cfg, feats[-1])
    else:
      logits_BxTxV, feats = llama.logits_of(frozen, self.target_cfg, batch["tokens"], wanted)
    feats = dict(zip(wanted, jax.lax.stop_gradient(feats), strict=True))
    f_in = jnp.concatenate([feats[f] for f in self.eagle.feature_layers], axis=-1)
    return jax.lax.stop_gradient(logits_BxTxV), f_in, feats[llama.FINAL]

  def loss(self, params, frozen, batch, key):
    tokens_BxT, mask_BxT = batch["tokens"], batch["mask"]
    b, t = tokens_BxT.shape
    p, vocab = self.model_params(params, frozen), self._vocab()
    target_logits_BxTxV, f_in_BxTxG, f_BxTxF = self._features(frozen, batch)
    p_BxTxW = jax.nn.softmax(target_logits_BxTxV, axis=-1)[..., vocab]
    argmax_BxT = jnp.argmax(target_logits_BxTxV, axis=-1)
    noise = self.noise * (jax.random.uniform(key, f_in_BxTxG.shape) - 0.5)
    s_BxTxF = eagle.fuse(p, f_in_BxTxG[:, :-1] + noise[:, :-1])
    x = eagle.inputs(p, self.eagle, tokens_BxT[:, 1:], s_BxTxF)  # pair t: (s_t, token t + 1)
    positions = jnp.broadcast_to(jnp.arange(t - 1), (b, t - 1))
    attn = llama.attention_inputs(jnp.zeros((b,), jnp.int32), llama.causal_mask(t - 1), 0, 0, False)
    out_BxTxF, k1, v1 = eagle.layer(p, self.eagle, x, positions, None, None, attn)
    later = lambda x, j: _shift(x, j, t - 1)  # noqa: E731  (position t + j, zero past the end)
    feature_weight = 0.0 if self.eagle.fused else self.feature_weight  # EAGLE-3: tokens only
    total, metrics, rolled = 0.0, {}, []
    for j in range(1, self.rollout + 1):
      if j > 1:  # training-time test: the drafter's own output is the next step's feature
        x = eagle.inputs(p, self.eagle, later(tokens_BxT, j), out_BxTxF)
        out_BxTxF, k, v = eagle.rollout_layer(p, self.eagle, x, positions + j - 1, (k1, v1), rolled)
        rolled.append((k, v))
      terms = losses.eagle_losses(
        out_BxTxF, later(f_BxTxF, j), eagle.logits(p, self.eagle, out_BxTxF), later(p_BxTxW, j),
        later(argmax_BxT, j), vocab, later(losses.within_document(mask_BxT, j), 0),
        self.token_loss, self.hass_top_k,
      )  # fmt: skip
      token = terms["token"] + self.hass_weight * terms.get("top_k", 0.0)
      total += self.rollout_decay ** (j - 1) * (
        feature_weight * terms["feature"] + self.token_weight * token
      )
      suffix = "" if j == 1 else f"_{j}"
      metrics |= {f"{k}{suffix}": v for k, v in terms.items()}
    return total, metrics

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "eagle": self.eagle.asdict() | {"target": self.target_cfg.name},
      "copy_layer": self.copy_layer,
      "rollout": self.rollout,
      "init_from": self.init_from,
      "loss": self.token_loss,
    } | ({"hass": [self.hass_top_k, self.hass_weight]} if self.hass_top_k else {})

  def drafter(self, config: ml_collections.ConfigDict) -> eagle_drafter.Eagle:
    c = config.drafter.eagle
    sampled = sampled_candidates(c, eagle.FIELD)
    return eagle_drafter.Eagle(
      self.eagle, c.top_k, c.depth, c.total, sampled, prompt_lookup.branch(c)
    )

  def export(self, directory: Path, params: Params, target) -> Path:
    """The drafter that ``drafter.eagle.path`` loads (with the target's fingerprint)."""
    extra = {"noise": self.noise, "init_from": self.init_from}
    return eagle.save(directory, self.eagle, params, target, extra)


def _shift(x_BxTx, j: int, t: int) -> jax.Array:
  """``[B, t, ...]``: ``x[:, i + j]`` at index i, zero where ``i + j`` is past the end."""
  x = x_BxTx[:, j : j + t]
  pad = [(0, 0), (0, t - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
  return jnp.pad(x, pad)
