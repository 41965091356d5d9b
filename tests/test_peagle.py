"""P-EAGLE block drafters: speculators' own ``PEagleDraftModel`` (random weights, saved by its
``save_pretrained``) loads into specjax and gives the same logits for every row of its own
training forward; specjax's export reads back in speculators' ``from_pretrained``; decoding is
greedy = AR, replayed by the simulator call for call, priced by the cost model; training through
task=train raises τ. The exact-distribution cases across steps are in test_lossless.py (chain,
tree, lookup branch, and broken variants)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from specjax import costmodel, simulate, testing
from specjax.decode import generate
from specjax.drafters import peagle
from specjax.drafters.peagle import formats
from specjax.drafters.peagle import model as pmodel
from specjax.models import export, tiny
from specjax.models.source import Model
from specjax.trees import Tree

torch = pytest.importorskip("torch")

V, K, MASK = 64, 4, 5
IDS = np.sort(np.random.default_rng(2).choice(V, 24, replace=False))  # a reduced vocabulary


@pytest.fixture(scope="module")
def target():
  cfg, params = tiny.random_model(seed=3, vocab_size=V, dim=32, num_layers=4, num_heads=4,
                                  num_kv_heads=2, ffn_dim=64)  # fmt: skip
  return Model(cfg=cfg, params=params, tokenizer=None)


def _speculators():
  pytest.importorskip("speculators", reason="bash scripts/install_oracles.sh installs it")
  from speculators.models.peagle import PEagleSpeculatorConfig
  from speculators.models.peagle.core import PEagleDraftModel

  return PEagleSpeculatorConfig, PEagleDraftModel


def _reference(target, directory, aux=(1, 3), seed=0):
  """speculators' P-EAGLE for ``target``'s widths with random weights (the target's embedding,
  as its ``load_verifier_weights`` copies it; the reduced vocabulary ``IDS`` as d2t/t2d),
  eager attention, saved by its ``save_pretrained``."""
  import transformers
  from speculators.config import SpeculatorsConfig, VerifierConfig
  from speculators.proposals.greedy import GreedyTokenProposalConfig

  config_cls, model_cls = _speculators()
  t = target.cfg
  layer = transformers.LlamaConfig(
    hidden_size=t.dim, num_hidden_layers=1, intermediate_size=48, num_attention_heads=t.num_heads,
    num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim, rms_norm_eps=t.norm_eps,
    rope_theta=t.rope_theta, vocab_size=V, max_position_embeddings=256, tie_word_embeddings=False,
  )  # fmt: skip
  layer._attn_implementation = "eager"  # flex attention: GPU only
  spec = SpeculatorsConfig(
    algorithm="peagle", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=K)],
    default_proposal_method="greedy",
    verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
  )  # fmt: skip
  config = config_cls(transformer_layer_config=layer, speculators_config=spec,
                      draft_vocab_size=len(IDS), eagle_aux_hidden_state_layer_ids=list(aux),
                      mask_token_id=MASK)  # fmt: skip
  torch.manual_seed(seed)
  m = model_cls(config).eval()
  g = torch.Generator().manual_seed(seed)
  t2d = np.zeros(V, bool)
  t2d[IDS] = True
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.startswith(("embed_tokens", "verifier")):
        continue
      if name.endswith("norm.weight") or name == "mask_hidden":
        p.copy_((name.endswith("norm.weight")) + 0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)
    m.embed_tokens.weight.copy_(torch.from_numpy(np.asarray(target.params["embed"])))
    m.d2t.copy_(torch.from_numpy(IDS - np.arange(len(IDS))))
    m.t2d.copy_(torch.from_numpy(t2d))
  m.save_pretrained(str(directory))
  return m


def _inputs(width, t=20, seed=1):
  """Tokens ``[1, t + 1]`` and features ``[1, t + 1, width]``: t pairs (features i, token i+1)."""
  rng = np.random.default_rng(seed)
  return rng.integers(0, V, size=(1, t + 1)), rng.normal(size=(1, t + 1, width)).astype(np.float32)


def _reference_logits(m, tokens, feats):
  """speculators' own training forward (COD sampling, seeded) over the pairs; the logits of
  every sampled row caught by a hook on its head, with the rows' anchors and depths (the same
  seed drawn again through its public sampler)."""
  from speculators.models.peagle.data import generate_cod_sample_indices

  t = tokens.shape[1] - 1
  torch.manual_seed(7)
  anchor, depth = generate_cod_sample_indices(t, torch.ones((1, t)), num_depths=K)
  caught = {}
  hook = m.lm_head.register_forward_hook(lambda mod, i, o: caught.setdefault("logits", o))
  kwargs, _ = type(m).get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager",
                                         num_depths=K)  # fmt: skip
  torch.manual_seed(7)
  with torch.no_grad():
    m(torch.from_numpy(feats[:, :-1]), torch.from_numpy(tokens[:, 1:]).long(),
      torch.zeros((1, t), dtype=torch.long), loss_mask=torch.ones((1, t)),
      verifier_last_hidden_states=torch.zeros((1, t, m.hidden_size)), **kwargs)  # fmt: skip
  hook.remove()
  return caught["logits"].numpy()[0], anchor.numpy(), depth.numpy()


def _ours(params, cfg, tokens, feats, anchor, depth):
  t = tokens.shape[1] - 1
  all_rows = pmodel.anchored_logits(params, cfg, jnp.asarray(tokens), jnp.asarray(feats),
                                    jnp.arange(t))  # fmt: skip
  return np.asarray(all_rows)[anchor, depth]


@pytest.mark.slow
def test_speculators_peagle_loads_and_matches_its_reference(target, tmp_path):
  """Aux ids [1, 3] are specjax's features (0, 2); every row COD sampling drew (the anchor
  pairs and the masked rows of every depth) within 1e-4; with mask_hidden zeroed, the masked
  rows do not match."""
  m = _reference(target, tmp_path / "d")
  assert formats.is_speculators(tmp_path / "d")
  cfg, params, _ = peagle.load(tmp_path / "d", target)
  assert (cfg.num_depths, cfg.mask_id, cfg.eagle.feature_layers) == (K, MASK, (0, 2))
  np.testing.assert_array_equal(np.asarray(params["vocab_ids"]), IDS)
  tokens, feats = _inputs(cfg.feature_width)
  ref, anchor, depth = _reference_logits(m, tokens, feats)
  assert sorted(set(depth.tolist())) == list(range(K))
  np.testing.assert_allclose(_ours(params, cfg, tokens, feats, anchor, depth), ref, atol=1e-4)
  broken = params | {"mask_hidden": jnp.zeros_like(params["mask_hidden"])}
  off = _ours(broken, cfg, tokens, feats, anchor, depth)
  np.testing.assert_allclose(off[depth == 0], ref[depth == 0], atol=1e-4)
  assert np.abs(off[depth > 0] - ref[depth > 0]).max() > 1e-2


@pytest.mark.slow
def test_an_export_is_read_by_speculators_own_loader(target, tmp_path):
  """specjax's weights written in speculators' layout (the verifier named, an HF directory of
  the target) load with speculators' public ``from_pretrained`` and give specjax's logits;
  read back, the same drafter. Without mask_hidden, from_pretrained leaves it random: the
  masked rows differ."""
  config_cls, model_cls = _speculators()
  d, params = testing.peagle_drafter(
    (target.cfg, target.params), Tree.chain(K), K, seed=4, feature_layers=(1, 2), vocab_ids=IDS,
    mask_id=MASK,
  )  # fmt: skip
  verifier = export.save_model(tmp_path / "verifier", target.cfg, target.params)
  tokens, feats = _inputs(d.cfg.feature_width)
  for case in ("as written", "no mask_hidden"):
    out = tmp_path / case.replace(" ", "_")
    formats.export(d.cfg, params, out, verifier=str(verifier))
    if case != "as written":
      from safetensors.numpy import load_file, save_file

      tensors = load_file(str(out / "model.safetensors"))
      del tensors["mask_hidden"]
      save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "peagle" and config["mask_token_id"] == MASK
    spec = config_cls.from_pretrained(str(out))
    spec.transformer_layer_config._attn_implementation = "eager"  # flex attention: GPU only
    m = model_cls.from_pretrained(str(out), config=spec).eval()
    ref, anchor, depth = _reference_logits(m, tokens, feats)
    ours = _ours(params, d.cfg, tokens, feats, anchor, depth)
    same = np.allclose(ours, ref, atol=1e-4)
    assert same == (case == "as written"), case
  back, back_params, _ = peagle.load(tmp_path / "as_written", target)
  assert back == d.cfg
  np.testing.assert_array_equal(np.asarray(back_params["mask_hidden"]), params["mask_hidden"])
  np.testing.assert_array_equal(np.asarray(back_params["vocab_ids"]), IDS)


@pytest.mark.slow  # the quick tier decodes DFlash's twin case through the same static tree
@pytest.mark.parametrize("tree", [None, Tree.from_spec((2, 1))], ids=["chain", "tree"])
def test_greedy_equals_ar_and_the_simulator_replays_it(target, tree):
  """Blocks of 3 (a chain of 3, or a 2 x 1 tree), random weights: greedy output is AR's on
  ragged prompts, the simulator's calls equal decoding's row by row, and the cost model prices
  one block forward through the family's own timer."""
  d, params = testing.peagle_drafter((target.cfg, target.params), tree or Tree.chain(3), 3,
                                     sampled=False, vocab_ids=IDS)  # fmt: skip
  prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 9, 11, 5, 9]]
  kw = dict(max_new_tokens=16, max_len=48)
  ar = generate(target.params, target.cfg, prompts, **kw)
  out = generate(target.params, target.cfg, prompts, drafter=d, drafter_params=params, **kw)
  assert out.tokens == ar.tokens
  rows = list(zip(prompts, ar.tokens, strict=True))
  assert [simulate.replay(target, d, params, [r]).calls for r in rows] == out.metrics["row_calls"]
  assert costmodel.step_work(d)[0] == costmodel.Forward("peagle", 3)
  parts = costmodel.drafter_seconds(d, params, target.cfg, context=16, repeats=1)
  assert parts["peagle"][3] > 0


def test_a_bad_directory_is_one_clear_error(target, tmp_path):
  """No mask_token_id; another hidden size; a dropped tensor: one error each, naming it. An
  EAGLE reader pointed at a P-EAGLE directory says which drafter reads it."""
  from specjax.drafters import eagle

  d, params = testing.peagle_drafter((target.cfg, target.params), Tree.chain(K), K,
                                     feature_layers=(1, 2), vocab_ids=IDS)  # fmt: skip
  verifier = export.save_model(tmp_path / "verifier", target.cfg, target.params)
  formats.export(d.cfg, params, tmp_path / "x", verifier=str(verifier))
  config = json.loads((tmp_path / "x" / "config.json").read_text())
  with pytest.raises(ValueError, match="drafter.name=peagle"):
    eagle.load(tmp_path / "x", target)
  (tmp_path / "x" / "config.json").write_text(json.dumps({**config, "mask_token_id": None}))
  with pytest.raises(ValueError, match="no mask_token_id"):
    peagle.load(tmp_path / "x", target)
  layer = config["transformer_layer_config"] | {"hidden_size": 48}
  (tmp_path / "x" / "config.json").write_text(json.dumps(config | {"transformer_layer_config":
                                                                   layer}))  # fmt: skip
  with pytest.raises(ValueError, match="peagle.path.*drafter 48"):
    peagle.load(tmp_path / "x", target)
  (tmp_path / "x" / "config.json").write_text(json.dumps(config))
  from safetensors.numpy import load_file, save_file

  tensors = load_file(str(tmp_path / "x" / "model.safetensors"))
  del tensors["mask_hidden"]
  save_file(tensors, str(tmp_path / "x" / "model.safetensors"))
  with pytest.raises(ValueError, match="missing mask_hidden"):
    peagle.load(tmp_path / "x", target)


@pytest.mark.slow
def test_training_raises_tau_and_the_saved_drafter_decodes_the_same(tmp_path):
  """task=train with objective peagle on configs/train_tiny.py's random target: the trained
  drafter's τ is above the untrained one's, the simulator's τ on the curve equals the
  decode's, and the saved drafter, loaded through the config, decodes greedy = AR with it."""
  from configs import train_tiny
  from specjax import build, drafters
  from specjax.tasks import train
  from specjax.train import objectives

  c = train_tiny.get_config()
  c.objective = objectives.default_config("peagle")
  c.objective.peagle.update(feature_layers=(1, 3), num_depths=3, anchors=8)
  c.drafter = drafters.default_config("peagle")
  c.workdir = str(tmp_path / "run")
  c.train.update(steps=300, progress=False, eval_every=300, checkpoint_every=300)
  c.optim.update(learning_rate=1e-2, decay_steps=290)
  c.evaluate.tau_every = 150
  record = train.run(c)
  init, final = record["decode"]["init"]["tau"], record["decode"]["final"]["tau"]
  assert final > init + 0.2, (init, final)
  assert record["tau_check"]["simulated"] == pytest.approx(record["tau_check"]["decoded"])
  c.task = "generate"
  c.drafter.peagle.path = str(tmp_path / "run" / "draft_final")
  build.check(c)
  model = build.target(c)
  d, params = build.drafter(c, model)
  assert d.cfg.num_depths == 3 and d.feature_layers == (1, 3)
  prompts = build.request(c, model).batches()[0]
  kw = dict(max_new_tokens=c.max_new_tokens, max_len=c.max_len)
  ar = generate(model.params, model.cfg, prompts, **kw)
  out = generate(model.params, model.cfg, prompts, drafter=d, drafter_params=params, **kw)
  assert out.tokens == ar.tokens
  assert out.metrics["tau"] == pytest.approx(final)
