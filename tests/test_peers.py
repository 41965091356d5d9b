"""task=peers runs specjax and HF transformers side by side on the real SmolLM2 (short).

Three tests, each a subset of the six modes (``peers.modes``) beside specjax AR, the reference
of every row, on the demo's first prompt (a text to copy: lookup drafts pay): HF's greedy
decoding, then prompt lookup in both libraries, then HF's assisted generation with the config's
draft model (the target's first 8 layers). On one prompt, the later tests' specjax AR is the
first's compiled program, and their HF model the first's (the task keeps the model it read).
specjax's own draft-model mode is the prompt-lookup mode's path with another drafter name; that
drafter decoding SmolLM2 equal to AR is test_real_models' (batch 4, a program of its own)."""

import json

import pytest

from configs import demo
from experiments.peers import config as peers_config
from specjax.models import registry

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def _run(tmp_path, modes):
  pytest.importorskip("transformers")  # the oracle extra, which README's test command installs
  registry.resolve("smollm2-135m-instruct")  # installed by scripts/install_models.sh
  from specjax.tasks import peers

  c = peers_config.get_config()
  c.prompts = demo.base().prompts[:1]
  c.max_new_tokens = 16
  c.output_dir = str(tmp_path)
  c.peers.modes = modes
  record = peers.run(c)
  saved = json.loads((tmp_path / "peers.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(record["rows"]))
  rows = {r["mode"]: r for r in saved["rows"]}
  assert set(rows) == {"specjax_ar", *modes}
  assert rows["specjax_ar"]["calls_per_token"] == rows["hf_greedy"]["calls_per_token"] == 1
  for r in rows.values():  # K = 4 drafts per step: at most 5 tokens per target call
    assert r["tau"] <= 5, r["mode"]
  return c, rows


def test_hf_greedy_is_specjax_ar_on_smollm2(tmp_path):
  """HF's greedy decoding of the GGUF it reads itself gives specjax AR's tokens, one target call
  per token each (the first test of the file: it carries HF's read of the GGUF, which the task
  keeps for the two after it)."""
  _, rows = _run(tmp_path, ("hf_greedy",))
  assert rows["hf_greedy"]["equal_rows"] == "1/1"
  assert rows["specjax_ar"]["speedup"] == rows["hf_greedy"]["speedup"] == 1


def test_prompt_lookup_side_by_side_on_smollm2(tmp_path):
  """Both libraries' prompt lookup: lossless (specjax's rows equal its AR, HF's equal HF's
  greedy), HF's greedy equals specjax AR, and both need < 0.9 target calls per token."""
  _, rows = _run(tmp_path, ("specjax_prompt_lookup", "hf_greedy", "hf_prompt_lookup"))
  for mode in ("specjax_prompt_lookup", "hf_greedy"):
    assert rows[mode]["equal_rows"] == "1/1", mode  # lossless, and HF's greedy is ours
  for mode in ("specjax_prompt_lookup", "hf_prompt_lookup"):  # fewer target forwards, counted
    assert rows[mode]["calls_per_token"] < 0.9, mode
  assert rows["hf_prompt_lookup"]["tokens"] == rows["hf_greedy"]["tokens"]
  assert rows["specjax_ar"]["speedup"] == rows["hf_greedy"]["speedup"] == 1


def test_hf_assisted_generation_with_the_draft_model_on_smollm2(tmp_path):
  """HF's assisted generation with the config's draft model (the target's first 8 layers, copied
  from HF's own read): its rows equal HF's greedy (which equals specjax AR), at most one target
  call per token; greedy batch 1 only, and unknown modes are refused."""
  from specjax.tasks import peers

  c, rows = _run(tmp_path, ("hf_greedy", "hf_assisted"))
  assert rows["hf_greedy"]["equal_rows"] == "1/1"
  assert rows["hf_assisted"]["calls_per_token"] <= 1
  assert rows["hf_assisted"]["tokens"] == rows["hf_greedy"]["tokens"]
  c.temperature = 1.0
  with pytest.raises(ValueError, match="greedy batch-1"):
    peers.run(c)
  c.temperature = 0.0
  c.peers.modes = ("hf_beam",)
  with pytest.raises(ValueError, match=r"peers.modes .*hf_beam"):
    peers.run(c)
