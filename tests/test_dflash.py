"""DFlash block drafters: speculators' own ``DFlashDraftModel`` (random weights, saved by its
``save_pretrained``) loads into specjax and gives the same block logits; specjax's export reads
back in speculators; decoding is greedy = AR, replayed by the simulator call for call, priced by
the cost model; candidates are drawn at the run's temperature (a drafter that draws ignoring it
fails the exact-distribution check). The exact-distribution cases across steps are in
test_lossless.py (chain, tree, lookup branch, and a broken verifier)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import costmodel, simulate, testing
from specjax.decode import generate
from specjax.drafters import dflash
from specjax.drafters.dflash import formats, layouts
from specjax.drafters.dflash import model as dmodel
from specjax.models import tiny
from specjax.models.source import Model
from specjax.trees import Tree

torch = pytest.importorskip("torch")

V = 64


@pytest.fixture(scope="module")
def target():
  cfg, params = tiny.random_model(seed=3, vocab_size=V, dim=32, num_layers=4, num_heads=4,
                                  num_kv_heads=2, ffn_dim=64)  # fmt: skip
  return Model(cfg=cfg, params=params, tokenizer=None)


def _speculators_installed():
  pytest.importorskip("speculators", reason="bash scripts/install_oracles.sh installs it")


def _speculators(target, aux, block, layers=2, mask=5, seed=0):
  """speculators' DFlash model for ``target``'s widths, random weights, the verifier's
  embedding and head copied in (as its ``load_verifier_weights`` does), eager attention."""
  pytest.importorskip("speculators", reason="bash scripts/install_oracles.sh installs it")
  import transformers
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.models.dflash import DFlashSpeculatorConfig
  from speculators.models.dflash.core import DFlashDraftModel
  from speculators.proposals.greedy import GreedyTokenProposalConfig

  t = target.cfg
  layer = transformers.Qwen3Config(
    hidden_size=t.dim, num_hidden_layers=layers, intermediate_size=t.ffn_dim,
    num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim,
    rms_norm_eps=t.norm_eps, rope_theta=t.rope_theta, vocab_size=t.vocab_size,
    max_position_embeddings=256,
  )  # fmt: skip
  layer._attn_implementation = "eager"
  spec = SpeculatorsConfig(
    algorithm="dflash", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block - 1)],
    default_proposal_method="greedy",
    verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
  )  # fmt: skip
  config = DFlashSpeculatorConfig(
    transformer_layer_config=layer, draft_vocab_size=t.vocab_size, block_size=block,
    aux_hidden_state_layer_ids=aux, mask_token_id=mask, speculators_config=spec,
  )  # fmt: skip
  torch.manual_seed(seed)
  m = DFlashDraftModel(config).eval()
  return fill_like_the_verifier(m, target, seed)


def fill_like_the_verifier(m, target, seed: int):
  """``m`` (a speculators block drafter) with random weights (norms near 1) and the target's
  embedding and head where speculators' ``load_verifier_weights`` puts them."""
  g = torch.Generator().manual_seed(seed)
  head = target.params["embed"] if target.cfg.tie_embeddings else target.params["lm_head"]
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.startswith(("embed_tokens", "lm_head", "verifier")):
        continue
      if name.endswith("norm.weight") or "layernorm" in name:
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)
    m.embed_tokens.weight.copy_(torch.from_numpy(np.asarray(target.params["embed"])))
    m.lm_head.weight.copy_(torch.from_numpy(np.asarray(head)))
    m.verifier_lm_head.weight.copy_(torch.from_numpy(np.asarray(head)))
    m.verifier_norm.weight.fill_(1.0)
  return m


def _reference_logits(m, tokens_1xT, feats_1xTxnF, block):
  """speculators' own training forward with every valid position an anchor; the block logits
  caught by a hook on its head: ``[A, block, V]`` and the anchors (0 .. T - block - 1)."""
  t = tokens_1xT.shape[1]
  caught = {}
  hook = m.lm_head.register_forward_hook(lambda mod, i, o: caught.setdefault("logits", o))
  kwargs, _ = type(m).get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager")
  with torch.no_grad():
    m(torch.from_numpy(np.asarray(feats_1xTxnF, np.float32)),
      torch.from_numpy(np.asarray(tokens_1xT)).long(), torch.ones((1, t)),
      torch.zeros((1, t, m.config.transformer_layer_config.hidden_size)),
      torch.zeros((1, t), dtype=torch.long), **(kwargs | {"max_anchors": t - block}))  # fmt: skip
  hook.remove()
  return caught["logits"].numpy().reshape(t - block, block, -1), np.arange(t - block)


def _inputs(target, cfg, t=20, seed=1):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, size=(1, t))
  feats = rng.normal(size=(1, t, target.cfg.dim * len(cfg.feature_layers))).astype(np.float32)
  return tokens, feats


@pytest.mark.slow
def test_speculators_dflash_loads_and_matches_its_reference(target, tmp_path):
  """Aux ids [1, 3] are specjax's features (0, 2); every anchor's block logits within 1e-4; a
  transposed weight (k and v projections swapped) does not match."""
  block = 4
  m = _speculators(target, aux=[1, 3], block=block)
  m.save_pretrained(str(tmp_path / "d"))
  assert layouts.detect(tmp_path / "d") == "speculators"
  cfg, params, _ = dflash.load(tmp_path / "d", target)
  assert (cfg.feature_layers, cfg.block_size, cfg.num_layers, cfg.mask_id) == ((0, 2), 4, 2, 5)
  tokens, feats = _inputs(target, cfg)
  ref, anchors = _reference_logits(m, tokens, feats, block)
  ours = dmodel.anchored_logits(params, cfg, jnp.asarray(tokens), jnp.asarray(feats),
                                jnp.asarray(anchors))  # fmt: skip
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4)
  layer = dict(params["layers"][0])
  layer["wk"], layer["wv"] = layer["wv"], layer["wk"]
  broken = params | {"layers": (layer, *params["layers"][1:])}
  off = dmodel.anchored_logits(broken, cfg, jnp.asarray(tokens), jnp.asarray(feats),
                               jnp.asarray(anchors))  # fmt: skip
  assert np.abs(np.asarray(off) - ref).max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("reduced", [False, True], ids=["full_vocab", "reduced_vocab"])
def test_an_export_is_read_by_speculators_own_loader(target, tmp_path, reduced):
  """specjax's weights written in speculators' layout (the target's embedding and head rows
  among them) load with speculators' public ``from_pretrained`` alone and give specjax's block
  logits (over the draft vocabulary where it is reduced: d2t and t2d written); read back, the
  same drafter."""
  _speculators_installed()
  from speculators.models.dflash import DFlashSpeculatorConfig
  from speculators.models.dflash.core import DFlashDraftModel

  ids = np.sort(np.random.default_rng(2).choice(V, 24, replace=False)) if reduced else None
  cfg = dmodel.DFlashConfig(target.cfg, (1, 2), num_layers=1, block_size=3, mask_id=7,
                            vocab_size=24 if reduced else 0)  # fmt: skip
  trained = dmodel.init_params(cfg, jax.random.key(4)) | ({"vocab_ids": ids} if reduced else {})
  params = dmodel.decode_params(trained, target.params, target.cfg)
  formats.export(cfg, params, tmp_path / "x")
  config = DFlashSpeculatorConfig.from_pretrained(str(tmp_path / "x"))
  config.transformer_layer_config._attn_implementation = "eager"  # flex attention: GPU only
  m = DFlashDraftModel.from_pretrained(str(tmp_path / "x"), config=config).eval()
  tokens, feats = _inputs(target, cfg)
  ref, anchors = _reference_logits(m, tokens, feats, cfg.block_size)
  ours = dmodel.anchored_logits(params, cfg, jnp.asarray(tokens), jnp.asarray(feats),
                                jnp.asarray(anchors))  # fmt: skip
  np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4)
  back, back_params, _ = dflash.load(tmp_path / "x", target)
  assert back == cfg
  np.testing.assert_array_equal(np.asarray(back_params["fc"]), np.asarray(params["fc"]))
  if reduced:
    np.testing.assert_array_equal(np.asarray(back_params["vocab_ids"]), ids)


@pytest.mark.parametrize("tree", [None, Tree.from_spec((2, 1))], ids=["chain", "tree"])
def test_greedy_equals_ar_and_the_simulator_replays_it(target, tree):
  """A block of 4 (chain of 3, or a 2 x 1 tree) from random weights that copy the target's
  own prediction often enough to accept something: greedy output is AR's, and the simulator's
  calls equal decoding's row by row."""
  cfg = dmodel.DFlashConfig(target.cfg, (1, 3), num_layers=1, block_size=4, mask_id=0)
  params = dmodel.init_params(cfg, jax.random.key(1)) | dmodel.frozen_params(
    target.params, target.cfg
  )
  d = dflash.DFlash(cfg, tree or Tree.chain(3))
  prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 9, 11, 5, 9]]
  kw = dict(max_new_tokens=16, max_len=48)
  ar = generate(target.params, target.cfg, prompts, **kw)
  out = generate(target.params, target.cfg, prompts, drafter=d, drafter_params=params, **kw)
  assert out.tokens == ar.tokens
  rows = list(zip(prompts, ar.tokens, strict=True))
  assert [simulate.replay(target, d, params, [r]).calls for r in rows] == out.metrics["row_calls"]
  assert costmodel.step_work(d)[0] == costmodel.Forward("dflash", 4)
  parts = costmodel.drafter_seconds(d, params, target.cfg, context=16, repeats=1)
  assert parts["dflash"][4] > 0


class DrawsIgnoringTemperature(dflash.DFlash):
  """Wrong (dflash #74's bug): the candidates drawn at temperature 1 whatever the run's, while
  the verifier is handed q at the run's temperature."""

  def propose(self, params, state, ctx):
    hot = dataclasses.replace(ctx, sampling=ctx.sampling.replace(temperature=jnp.float32(1.0)))
    drawn, _ = super().propose(params, state, hot)
    told, state = super().propose(params, state, ctx)
    return told.replace(tokens=drawn.tokens), state


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True], ids=["right", "draws_ignoring_temperature"])
def test_sampled_q_follows_the_runs_temperature(broken):
  """Temperature 0.5 on a 5-token vocabulary, three new tokens enumerated, a 2 x 1 tree: the
  right drafter passes; one that draws ignoring the temperature fails."""
  t5 = tiny.random_model(seed=7, vocab_size=5)
  drafter, params = testing.dflash_drafter(t5, Tree.from_spec((2, 1)), block_size=3)
  if broken:
    drafter = DrawsIgnoringTemperature(drafter.cfg, drafter.tree, True)
  p = testing.exact_pvalues(t5, drafter, params, dict(temperature=0.5), prompts=[[1, 1, 2]],
                            rows=3000, calls=3)[0]  # fmt: skip
  assert (p < testing.P_FAIL) if broken else (p > testing.P_PASS)


def test_a_speculators_directory_of_another_shape_is_one_error(target, tmp_path):
  """No draft vocabulary, another model type, another hidden size, an unknown DSpark head: one
  error each, before the target loads (headers only); a dropped tensor: one error naming it."""
  cfg = dmodel.DFlashConfig(target.cfg, (1,), num_layers=1, block_size=3)
  params = dmodel.decode_params(dmodel.init_params(cfg, jax.random.key(0)), target.params,
                                target.cfg)  # fmt: skip
  formats.export(cfg, params, tmp_path / "x")
  config = json.loads((tmp_path / "x" / "config.json").read_text())
  for change, message in (
    ({"draft_vocab_size": 0}, "is not in \\[1, 64\\]"),
    ({"speculators_model_type": "mtp"}, "not a speculators DFlash or DSpark"),
    ({"aux_hidden_state_layer_ids": [0]}, "must name target layers"),
  ):
    # fmt: skip
    (tmp_path / "x" / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError, match=message):
      formats.peek(tmp_path / "x")
  layer = config["transformer_layer_config"] | {"hidden_size": 48}
  other = config | {"transformer_layer_config": layer}
  (tmp_path / "x" / "config.json").write_text(json.dumps(other))
  with pytest.raises(ValueError, match="trained for another target"):
    formats.config_for(formats.peek(tmp_path / "x"), target.cfg, "path")
  dspark = config | {"speculators_model_type": "dspark", "markov_head_type": "lstm"}
  (tmp_path / "x" / "config.json").write_text(json.dumps(dspark))
  with pytest.raises(ValueError, match="markov_head='lstm' is unknown"):
    formats.config_for(formats.peek(tmp_path / "x"), target.cfg, "path")
  # One tensor dropped from the weights: one error naming it, before any is used.
  (tmp_path / "x" / "config.json").write_text(json.dumps(config))
  from safetensors.numpy import load_file, save_file

  tensors = load_file(str(tmp_path / "x" / "model.safetensors"))
  del tensors["layers.0.self_attn.k_proj.weight"]
  save_file(tensors, str(tmp_path / "x" / "model.safetensors"))
  with pytest.raises(ValueError, match="lacks.*k_proj"):
    dflash.load(tmp_path / "x", target)


@pytest.mark.slow
def test_training_raises_tau_and_the_saved_drafter_decodes_the_same(tmp_path):
  """task=train with objective dflash on configs/train_tiny.py's random target: the trained
  block's τ is above the untrained one's, the simulator's τ on the curve equals the decode's,
  and the saved drafter, loaded through the config, decodes greedy = AR with that τ."""
  from configs import train_tiny
  from specjax import build, drafters
  from specjax.tasks import train
  from specjax.train import objectives

  c = train_tiny.get_config()
  c.objective = objectives.default_config("dflash")
  c.objective.dflash.update(feature_layers=(1, 3), block_size=4, anchors=8)
  c.drafter = drafters.default_config("dflash")
  c.workdir = str(tmp_path / "run")
  c.train.update(steps=300, progress=False, eval_every=300, checkpoint_every=300)
  c.optim.update(learning_rate=1e-2, decay_steps=290)
  c.evaluate.tau_every = 150
  record = train.run(c)
  init, final = record["decode"]["init"]["tau"], record["decode"]["final"]["tau"]
  assert final > init + 0.2, (init, final)
  assert record["tau_check"]["simulated"] == pytest.approx(record["tau_check"]["decoded"])
  c.task = "generate"
  c.drafter.dflash.path = str(tmp_path / "run" / "draft_final")
  build.check(c)
  model = build.target(c)
  d, params = build.drafter(c, model)
  assert d.cfg.block_size == 4 and d.cfg.feature_layers == (1, 3)
  prompts = build.request(c, model).batches()[0]
  kw = dict(max_new_tokens=c.max_new_tokens, max_len=c.max_len)
  ar = generate(model.params, model.cfg, prompts, **kw)
  out = generate(model.params, model.cfg, prompts, drafter=d, drafter_params=params, **kw)
  assert out.tokens == ar.tokens
  assert out.metrics["tau"] == pytest.approx(final)


def _saved_block_drafter(family: str, layout: str, model: Model, out, verifier) -> None:
  """A random DFlash or P-EAGLE drafter for ``model``, written to ``out`` in ``layout``."""
  from specjax.drafters.peagle import formats as peagle_formats
  from specjax.drafters.peagle import model as pmodel

  if family == "dflash":
    cfg = dmodel.DFlashConfig(model.cfg, (1,), num_layers=1, block_size=3)
    trained = dmodel.init_params(cfg, jax.random.key(0))
    if layout == "specjax":
      dmodel.save(out, cfg, trained, model)
    else:
      formats.export(cfg, dmodel.decode_params(trained, model.params, model.cfg), out)
    return
  d, params = testing.peagle_drafter((model.cfg, model.params), Tree.chain(3), 3,
                                     feature_layers=(1, 2), mask_id=5)  # fmt: skip
  if layout == "specjax":
    pmodel.save(out, d.cfg, params, model)
  else:
    peagle_formats.export(d.cfg, params, out, verifier=str(verifier))


@pytest.mark.parametrize("layout", ["specjax", "speculators"])
@pytest.mark.parametrize("family", ["dflash", "peagle"])
def test_a_drafter_for_another_target_fails_the_config_check(target, tmp_path, family, layout):
  """``build.check`` reads a block drafter's headers and the target's: a DFlash or P-EAGLE
  drafter of another hidden size is one error naming config.drafter.<name>.path before
  either's weights load (it came after the whole target had loaded); one of this target's
  sizes passes."""
  from configs import demo
  from specjax import build
  from specjax.models import export, source

  other_cfg, other_params = tiny.random_model(seed=5, vocab_size=V, dim=48, num_layers=4,
                                              num_heads=4, num_kv_heads=2, ffn_dim=64)  # fmt: skip
  other = Model(cfg=other_cfg, params=other_params, tokenizer=None)
  verifier = export.save_model(tmp_path / "hf", target.cfg, target.params)
  for name, model in (("mine", target), ("other", other)):
    _saved_block_drafter(family, layout, model, tmp_path / name, verifier)
  c = demo.base()
  c.target = source.config(source="safetensors", path=str(tmp_path / "hf"))
  c.prompts = ((1, 2, 3),)
  c.drafter.name = family
  c.drafter[family].path = str(tmp_path / "mine")
  build.check(c)
  c.drafter[family].path = str(tmp_path / "other")
  refused = rf"{family}\.path.*(cannot read this target|another target)"
  with pytest.raises(ValueError, match=refused):
    build.check(c)


@pytest.mark.parametrize("layout", ["specjax", "speculators"])
def test_a_shape_field_beside_a_saved_drafter_is_its_own_or_an_error(target, tmp_path, layout):
  """block_size, num_layers, feature_layers and mask_id shape random weights; beside a path
  the saved drafter's own shape decodes, so a field set to another value (it was ignored, exit
  0) is one error naming each such field and the saved value; the default, or the saved value
  itself, passes."""
  from configs import tiny as tiny_config

  _saved_block_drafter("dflash", layout, target, tmp_path / "saved", verifier=None)
  c = tiny_config.get_config()
  c.drafter.name = "dflash"
  c.drafter.dflash.path = str(tmp_path / "saved")
  d = c.drafter.dflash
  dflash.DFlash.check(d, c)  # every shape field at its default
  d.update(block_size=3, feature_layers=(1,))  # the saved drafter's own
  dflash.DFlash.check(d, c)
  for fields, message in (
    ({"block_size": 0}, r"config.drafter.dflash.block_size=0 is .* \(block_size=3, from"),
    ({"feature_layers": (99,), "num_layers": 2},
     r"num_layers=2, config.drafter.dflash.feature_layers=\[99\] are .* own \(num_layers=1, "
     r"feature_layers=\[1\], from its files\): remove the setting"),
    ({"mask_id": 7}, r"mask_id=7 is for random weights \(path = ''\)"),
  ):  # fmt: skip
    bad = c.copy_and_resolve_references()
    bad.drafter.dflash.update(fields)
    with pytest.raises(ValueError, match=message):
      dflash.DFlash.check(bad.drafter.dflash, bad)


def test_the_training_config_check_names_each_bad_shape_field():
  """The objective's check, run before the data and the target load, names the field of
  ``config.objective.dflash`` that is out of range."""
  from specjax.train import objectives

  cases = (("markov_rank", -1, "markov_rank must be an integer >= 0"),
           ("block_size", 1, "block_size must be an integer >= 2"),
           ("markov_head", "lstm", "markov_head='lstm' is unknown"))  # fmt: skip
  for field, value, message in cases:
    c = objectives.default_config("dflash").dflash
    c[field] = value
    with pytest.raises(ValueError, match=f"config.objective.dflash.{message}"):
      dflash.DFlashBlocks.check(c)
