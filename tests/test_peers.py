"""task=peers runs specjax and HF transformers side by side on the real SmolLM2 (short)."""

import json

import pytest

from configs import demo
from experiments.peers import config as peers_config
from specjax.models import registry


@pytest.mark.slow
@pytest.mark.real_model
def test_peers_side_by_side_on_smollm2(tmp_path):
  pytest.importorskip("transformers")  # the oracle extra, which README's test command installs
  registry.resolve("smollm2-135m-instruct")  # installed by scripts/install_models.sh
  from specjax.tasks import peers

  c = peers_config.get_config()
  c.prompts = demo.base().prompts[:2]  # a text to copy: lookup drafts get accepted
  c.max_new_tokens = 16
  c.output_dir = str(tmp_path)
  record = peers.run(c)
  saved = json.loads((tmp_path / "peers.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(record["rows"]))
  rows = {r["mode"]: r for r in saved["rows"]}
  assert set(rows) == {
    "specjax_ar", "specjax_prompt_lookup", "specjax_draft_model",
    "hf_greedy", "hf_prompt_lookup", "hf_assisted",
  }  # fmt: skip
  for mode in ("specjax_prompt_lookup", "specjax_draft_model", "hf_greedy"):
    assert rows[mode]["equal_rows"] == "2/2", mode  # lossless, and HF's greedy is ours
  assert rows["specjax_ar"]["calls_per_token"] == rows["hf_greedy"]["calls_per_token"] == 1
  for mode in ("specjax_prompt_lookup", "hf_prompt_lookup"):  # fewer target forwards, counted
    assert rows[mode]["calls_per_token"] < 0.9, mode
  assert rows["hf_assisted"]["calls_per_token"] <= 1
  for r in rows.values():  # K = 4 drafts per step: at most 5 tokens per target call
    assert r["tau"] <= 5, r["mode"]
  for mode in ("hf_prompt_lookup", "hf_assisted"):
    assert rows[mode]["tokens"] == rows["hf_greedy"]["tokens"]
  c.temperature = 1.0
  with pytest.raises(ValueError, match="greedy batch-1"):
    peers.run(c)
