"""task=self_distill: the target's own replies to corpus prompts or yours, written as shards.

Prompts are cut from ``config.distill.sources``; or taken from the user turns of your own files
(``config.distill.prompts_from``, ``format``, ``turns``, ``on_error``: docs/data.md); or, with
``config.distill.requests``, made from the templates of ``config.distill.request_set`` in
``train/prompt_templates.json``; all with the target's tokenizer (a random target, which has
none, gets seeded random token prompts instead). They are generated in batches of
``config.batch_size`` with the config's sampling knobs and written under ``config.output_dir``
(see specjax/train/distill.py). Training reads the directory back with
``specjax.train.data.load_dataset``.
"""

import ml_collections
import numpy as np

from specjax import build
from specjax.models import source
from specjax.train import conversations, corpora, data, distill, distill_prompts


def check(config: ml_collections.ConfigDict) -> None:
  """The distill fields' cheap checks, run before the model is loaded."""
  d = config.distill
  if d.get("prompts_from"):
    _check_files(config)
    return
  if config.target.source == "random":
    if d.sources:
      raise ValueError(
        "config.distill.sources needs a target with a tokenizer; a random target takes "
        "distill.sources=() and gets random token prompts."
      )
    if d.requests:
      raise ValueError(
        "config.distill.requests=True needs a target with a tokenizer and a chat template; a "
        "random target gets random token prompts: set distill.requests=False."
      )
  elif d.requests:
    if d.sources:
      raise ValueError(
        "config.distill.requests=True makes prompts from templates and reads no corpus: set "
        "config.distill.sources=()."
      )
    if d.request_set not in distill_prompts.REQUEST_SETS:
      raise ValueError(
        f"config.distill.request_set={d.request_set!r} is not a request set: choose one of "
        f"{', '.join(distill_prompts.REQUEST_SETS)} (specjax/train/prompt_templates.json)."
      )
    distinct = len(distill_prompts.all_requests(d.request_set))
    if d.num_prompts > distinct:
      raise ValueError(
        f"config.distill.num_prompts={d.num_prompts}: the {d.request_set!r} request templates "
        f"make {distinct} distinct requests; set num_prompts <= {distinct}, choose a larger "
        "config.distill.request_set, or add a set to specjax/train/prompt_templates.json "
        "(editing a set changes the prompts of data already made from it)."
      )
  elif not d.sources:
    raise ValueError(
      f"config.distill.sources is empty: name corpora from {', '.join(corpora.CORPORA)}."
    )
  for name in d.sources:
    try:
      corpora.corpus_path(name)
    except ValueError as e:
      raise ValueError(f"config.distill.sources: {e}") from None
  for flag in ("tasks", "requests"):
    if d[flag] and not config.chat:
      raise ValueError(f"config.distill.{flag}=True writes user messages: set config.chat=True.")
  if d.tasks and d.requests:
    raise ValueError(
      "config.distill.tasks and config.distill.requests are both True: choose one prompt kind."
    )
  if d.num_prompts < 1:
    raise ValueError(f"config.distill.num_prompts must be >= 1, got {d.num_prompts}.")
  if not 1 <= d.prompt_min_tokens <= d.prompt_max_tokens:
    raise ValueError(
      "config.distill needs 1 <= prompt_min_tokens <= prompt_max_tokens, got "
      f"{d.prompt_min_tokens} and {d.prompt_max_tokens}."
    )
  if d.shard_size < 1 or d.shard_size % config.batch_size:
    raise ValueError(
      f"config.distill.shard_size={d.shard_size} must be a positive multiple of "
      f"config.batch_size={config.batch_size}."
    )
  # A random target's prompts are random tokens, at most prompt_max_tokens of them: whether they
  # fit in max_len is known before any is made (text prompts are measured once tokenized).
  if (
    config.target.source == "random"
    and d.prompt_max_tokens + config.max_new_tokens > config.max_len
  ):
    raise ValueError(
      f"config.distill.prompt_max_tokens={d.prompt_max_tokens} + config.max_new_tokens="
      f"{config.max_new_tokens} > config.max_len={config.max_len}: a prompt of the longest "
      "length would not fit with its reply; raise max_len, or lower prompt_max_tokens or "
      "max_new_tokens."
    )
  _check_capture_layers(config)


def _check_capture_layers(config: ml_collections.ConfigDict) -> None:
  """``distill.capture_layers`` are layers of the target (its header's count)."""
  layers = tuple(config.distill.capture_layers)
  if not layers:
    return
  n = source.header_config(config.target).num_layers
  bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
  if bad:
    raise ValueError(
      f"config.distill.capture_layers={layers!r} has {bad}, outside the target's layers [0, "
      f"{n}): name layer indices in that range (the residual stream after each), or () for none."
    )


def _check_files(config: ml_collections.ConfigDict) -> None:
  """``distill.prompts_from``: the other prompt kinds off, the fields, every record checked."""
  d = config.distill
  if config.target.source == "random":
    raise ValueError(
      "config.distill.prompts_from needs a target with a tokenizer and a chat template; a "
      "random target gets random token prompts: set distill.prompts_from=()."
    )
  if d.sources or d.requests or d.tasks:
    raise ValueError(
      "config.distill.prompts_from takes the prompts from your files: set "
      "config.distill.sources=(), requests=False and tasks=False."
    )
  if d.get("turns", "first") not in distill_prompts.PROMPT_TURNS:
    raise ValueError(
      f"config.distill.turns={d.turns!r} is not a choice: "
      f"{', '.join(distill_prompts.PROMPT_TURNS)}."
    )
  if d.num_prompts < 0:
    raise ValueError(f"config.distill.num_prompts must be >= 0 (0 = all), got {d.num_prompts}.")
  if d.shard_size < 1 or d.shard_size % config.batch_size:
    raise ValueError(
      f"config.distill.shard_size={d.shard_size} must be a positive multiple of "
      f"config.batch_size={config.batch_size}."
    )
  _check_capture_layers(config)
  paths = conversations.expand(d.prompts_from, field="config.distill.prompts_from")
  conversations.scan(
    paths,
    d.get("format", "sharegpt"),
    on_error=d.get("on_error", "stop"),
    field="config.distill",
    files_field="config.distill.prompts_from",
  )


def _prompts(config, tok):
  d = config.distill
  if d.get("prompts_from"):
    prompts = distill_prompts.file_prompts(
      tuple(d.prompts_from),
      tok,
      fmt=d.get("format", "sharegpt"),
      num_prompts=d.num_prompts,
      turns=d.get("turns", "first"),
      max_tokens=config.max_len - config.max_new_tokens,
      seed=config.seed,
      chat=config.chat,
      on_error=d.get("on_error", "stop"),
    )
    print(
      f"{len(prompts.ids)} prompts from {', '.join(map(str, d.prompts_from))}"
      + (
        f"; left out {prompts.skipped} longer than max_len - max_new_tokens"
        if prompts.skipped
        else ""
      )  # fmt: skip
    )
    return prompts
  if d.requests:
    return distill_prompts.request_prompts(
      tok, num_prompts=d.num_prompts, seed=config.seed, name=d.request_set
    )
  return distill_prompts.corpus_prompts(
    tuple(d.sources),
    tok,
    num_prompts=d.num_prompts,
    min_tokens=d.prompt_min_tokens,
    max_tokens=d.prompt_max_tokens,
    seed=config.seed,
    chat=config.chat,
    tasks=d.tasks,
  )


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  check(config)
  try:  # before the target loads
    distill.check_output_dir(config.output_dir)
  except ValueError as e:
    raise ValueError(f"config.output_dir: {e}") from None
  d = config.distill
  target = build.target(config)
  tok = target.tokenizer
  if tok is None:
    rng = np.random.default_rng(config.seed)
    lengths = rng.integers(d.prompt_min_tokens, d.prompt_max_tokens + 1, size=d.num_prompts)
    prompt_ids = [rng.integers(0, target.cfg.vocab_size, size=n).tolist() for n in lengths]
    sources, texts = None, None
  else:
    prompts = _prompts(config, tok)
    prompt_ids, sources, texts = prompts.ids, prompts.sources, prompts.texts
  manifest = distill.self_distill(
    target.params,
    target.cfg,
    prompt_ids,
    config.output_dir,
    max_new_tokens=config.max_new_tokens,
    max_len=config.max_len,
    batch_size=config.batch_size,
    shard_size=d.shard_size,
    temperature=config.temperature,
    top_k=config.top_k,
    top_p=config.top_p,
    seed=config.seed,
    eos_id=sorted(tok.stop_ids) if tok is not None and config.stop_at_eos else None,
    sources=sources,
    capture_layers=tuple(d.capture_layers),
    capture_final=d.capture_final,
    tokenizer_fingerprint=tok.fingerprint() if tok is not None else None,
    metadata={"config": config.to_dict()},
  )
  _, arrays = data.read_shards(config.output_dir, keys=("tokens", "lengths", "prompt_lengths"))
  for i in range(min(2, len(prompt_ids))):
    new = arrays["tokens"][i, arrays["prompt_lengths"][i] : arrays["lengths"][i]].tolist()
    if tok is None:
      print(f"[{i}] prompt ids {prompt_ids[i]}\n    -> {new}")
    else:
      print(f"[{i}] {texts[i]!r}\n    -> {tok.decode(new)!r}")
  s = manifest["stats"]
  new_tokens = int((arrays["lengths"] - arrays["prompt_lengths"]).sum())
  rate = f"{s['tokens_per_s']:.1f}" if s["tokens_per_s"] else "n/a"
  print(
    f"wrote {manifest['num_examples']} examples ({new_tokens} new tokens) in "
    f"{len(manifest['shards'])} shards to {config.output_dir}; this run: "
    f"{s['new_tokens_this_run']} tokens in {s['seconds_this_run']:.1f} s = {rate} tok/s"
  )
  return manifest
