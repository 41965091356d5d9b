"""task=peers: specjax next to HF transformers on the same model, prompts and draft, one process.

    python -m specjax.run --config=experiments/peers/config.py          # SmolLM2-135M
    python -m specjax.run --config=experiments/peers/config.py:qwen     # Qwen2.5-Coder 1.5B + 0.5B

Six greedy modes, batch 1, the same chat-formatted prompt ids, timed with interleaved passes
(``timing.run_modes``): specjax AR, prompt lookup and draft-model speculative decoding (K =
``peers.num_draft``), and HF transformers' ``generate`` plain, with ``prompt_lookup_num_tokens``
= K, and assisted generation with the same draft model (its first ``num_layers`` layers, or
the draft GGUF) drafting exactly K per step (set on the assistant's generation config, where HF
reads it: constant schedule, no confidence cut-off). For every mode:
tokens/s, target calls per token (HF's counted by a forward hook on the target), τ, and whether
each row equals specjax AR's (greedy rows agree until two logits tie within float error).
``peers.modes`` runs a subset (specjax AR, the reference of every row, always runs). Needs the
``oracle`` extra (torch, transformers). Writes ``peers.json`` and prints a table.
"""

import dataclasses
import functools
import time

import ml_collections

from specjax import build, results
from specjax.decode import generate
from specjax.measure import timing
from specjax.measure.machine import machine
from specjax.models import registry

MODES = (
  "specjax_ar", "specjax_prompt_lookup", "specjax_draft_model",
  "hf_greedy", "hf_prompt_lookup", "hf_assisted",
)  # fmt: skip
COLUMNS = ("mode", "tokens", "tokens_per_s", "calls_per_token", "tau", "speedup", "equal_rows")


@dataclasses.dataclass
class Rows:
  """What one mode produced for one batch: new ids per row and target forwards."""

  tokens: list[list[int]]
  calls: int


def chosen_modes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The modes to run, in ``MODES``' order: ``peers.modes`` (default all) and specjax AR."""
  chosen = set(config.peers.get("modes", MODES)) | {"specjax_ar"}
  return tuple(m for m in MODES if m in chosen)


def check(config: ml_collections.ConfigDict) -> None:
  d, k = config.drafter.draft_model, config.peers.num_draft
  build.check_integer(k, "config.peers.num_draft", 1, "K, the tokens every drafting mode drafts")
  if k > config.drafter.max_depth:
    raise ValueError(
      f"config.peers.num_draft={k} is more than config.drafter.max_depth="
      f"{config.drafter.max_depth} (the most draft tokens a step may accept): lower num_draft "
      "or raise max_depth."
    )
  unknown = set(config.peers.get("modes", MODES)) - set(MODES)
  if unknown:
    raise ValueError(
      f"config.peers.modes has unknown modes {sorted(unknown)}: choose from {', '.join(MODES)}."
    )
  if config.target.source != "registry":
    raise ValueError(
      "task=peers loads the same GGUF into HF: config.target.source must be 'registry'."
    )
  if d.source == "model" and d.model.source != "registry":
    raise ValueError("task=peers: config.drafter.draft_model.model.source must be 'registry'.")
  if config.batch_size != 1 or config.temperature != 0:
    raise ValueError(
      "task=peers compares greedy batch-1 decoding: batch_size = 1, temperature = 0."
    )
  try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
  except ImportError:
    raise ValueError(
      "task=peers needs torch and transformers: pip install -e '.[oracle]'."
    ) from None


@functools.lru_cache(maxsize=1)
def _hf_model(name: str):
  """HF's model, read from the registry's GGUF by transformers' own loader (tens of seconds
  here); kept for the next run in this process, as HF only reads it (eval mode, no gradients;
  a truncated draft is a copy)."""
  import torch
  import transformers

  path = registry.resolve(name)
  return transformers.AutoModelForCausalLM.from_pretrained(
    path.parent, gguf_file=path.name, dtype=torch.float32
  ).eval()


def _hf_truncated(model, num_layers: int):
  """``model``'s first ``num_layers`` layers with its embedding, final norm and head: the same
  weights HF would read from the GGUF with ``num_hidden_layers=num_layers``, without parsing it
  again."""
  import copy

  import torch
  import transformers

  cfg = copy.deepcopy(model.config)
  cfg.num_hidden_layers = num_layers
  if getattr(cfg, "layer_types", None):
    cfg.layer_types = cfg.layer_types[:num_layers]
  small = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  missing, _ = small.load_state_dict(model.state_dict(), strict=False)  # later layers unread
  if missing:
    raise RuntimeError(f"truncating the HF model left weights unset: {missing}")
  return small.eval()


def _hf_mode(model, eos, max_new: int, **kw):
  """A ``run_modes`` function: HF greedy ``generate`` per prompt, target forwards counted."""
  import torch

  calls = [0]
  model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

  def fn(batch):
    out, n0 = [], calls[0]
    with torch.inference_mode():
      for ids in batch:
        x = torch.tensor([ids])
        y = model.generate(
          x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
          eos_token_id=list(eos), pad_token_id=eos[0], **kw,
        )  # fmt: skip
        out.append(y[0, len(ids) :].tolist())
    return Rows(out, calls[0] - n0)

  return fn


def run(config: ml_collections.ConfigDict) -> dict:
  check(config)
  build.check(config)
  k = config.peers.num_draft
  wanted = chosen_modes(config)
  target = build.target(config)
  req = build.request(config, target)
  kw = req.generate_kwargs()
  verifier = build.verifier(config)

  def ours(name=None):
    d, dp = None, None
    if name is not None:  # the config's drafter of that name, drafting exactly K per step
      c = config.copy_and_resolve_references()
      with c.unlocked():
        c.drafter.name = name
        c.drafter[name].update(num_draft=k)
      d, dp = build.drafter(c, target)

    def fn(batch):
      spec = {"drafter": d, "drafter_params": dp, "verifier": verifier} if d else {}
      g = generate(target.params, target.cfg, batch, **spec, **kw)
      return Rows(g.tokens, int(g.counts["row_calls"].sum()))

    return fn

  eos, n = tuple(req.eos_id or ()), req.max_new_tokens
  runs = {
    "specjax_ar": lambda: ours(),
    "specjax_prompt_lookup": lambda: ours("prompt_lookup"),
    "specjax_draft_model": lambda: ours("draft_model"),
  }
  if any(m.startswith("hf_") for m in wanted):
    t0 = time.perf_counter()
    hf = _hf_model(config.target.name)
    runs["hf_greedy"] = lambda: _hf_mode(hf, eos, n)
    runs["hf_prompt_lookup"] = lambda: _hf_mode(hf, eos, n, prompt_lookup_num_tokens=k)
    if "hf_assisted" in wanted:
      d = config.drafter.draft_model
      truncated = d.source == "truncate"
      assistant = _hf_truncated(hf, d.num_layers) if truncated else _hf_model(d.model.name)
      # HF reads the drafting knobs from the assistant's own generation config: exactly K
      # drafts per step (no growing schedule, no early stop on low draft confidence), as
      # specjax drafts.
      assistant.generation_config.update(
        num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
      )  # fmt: skip
      runs["hf_assisted"] = lambda: _hf_mode(hf, eos, n, assistant_model=assistant)
    print(f"loaded the HF models in {time.perf_counter() - t0:.0f} s")
  modes = {m: runs[m]() for m in wanted}
  timed = timing.run_modes(modes, req.batches(), config.benchmark.repeats, "peers")
  reference = [row for out in timed["specjax_ar"]["outs"] for row in out.tokens]
  rows = []
  for mode, t in timed.items():
    outs = t.pop("outs")
    got = [row for out in outs for row in out.tokens]
    tokens, calls = sum(map(len, got)), sum(out.calls for out in outs)
    rows.append(
      {
        "mode": mode,
        "tokens": tokens,
        "tokens_per_s": tokens / t["steady_s"],
        "calls_per_token": calls / tokens,
        "tau": tokens / calls,
        "equal_rows": f"{sum(a == b for a, b in zip(got, reference, strict=True))}/{len(got)}",
        "first_difference": [_first_difference(a, b) for a, b in zip(got, reference, strict=True)],
      }
      | t
    )
  base = {
    r["mode"][: r["mode"].index("_")]: r["tokens_per_s"]
    for r in rows
    if r["mode"].endswith(("_ar", "_greedy"))
  }
  for r in rows:  # against its library's plain greedy mode, where that ran
    library = r["mode"][: r["mode"].index("_")]
    r["speedup"] = r["tokens_per_s"] / base[library] if library in base else None
  import torch
  import transformers

  record = {
    "config": config.to_dict(),
    "machine": machine() | {"torch": torch.__version__, "transformers": transformers.__version__},
    "rows": rows,
  }
  print(results.table(rows, COLUMNS))
  print(f"wrote {results.write_json(f'{config.output_dir}/peers.json', record)}")
  return record


def _first_difference(a: list[int], b: list[int]) -> int | None:
  """Index of the first token where two rows differ (None if equal)."""
  for i, (x, y) in enumerate(zip(a, b, strict=False)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))
