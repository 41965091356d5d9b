"""Turns a ConfigDict into the frozen objects the library takes, checking it on the way.

Config never crosses a jit boundary: this module is the edge. ``check`` raises a ValueError
naming the config field and the fix before any model is loaded or compiled.

The target comes from ``config.target`` (a model source: random, registry, gguf, safetensors;
see models/source.py); the drafter from ``config.drafter`` by name through the registry in
``specjax.drafters``, each drafter reading its own subsection.
"""

import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from specjax import decode, drafters, parallel, placement, precision, results, sampling, verify
from specjax.drafters.base import check_integer, check_seed, is_integer
from specjax.models import llama, source
from specjax.models.source import Model

VERIFIERS = ("rejection", "typical")

__all__ = ["Model", "Request", "check", "drafter", "request", "target", "verifier"]


@dataclasses.dataclass(frozen=True)
class Request:
  """What to generate: prompts as token ids (and their text, if any), plus the knobs."""

  prompts: list[list[int]]
  prompt_texts: list[str] | None
  max_new_tokens: int
  max_len: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  eos_id: tuple[int, ...] | None

  batch_size: int = 1
  forward_rows: int = 0  # > 0: every target forward at this many rows (generate's docstring)

  def batches(self) -> list[list[list[int]]]:
    """Prompts in batches of ``batch_size``; the last is filled by cycling from the start."""
    n = -(-len(self.prompts) // self.batch_size) * self.batch_size
    cycled = [self.prompts[i % len(self.prompts)] for i in range(n)]
    return [cycled[i : i + self.batch_size] for i in range(0, n, self.batch_size)]

  def generate_kwargs(self) -> dict[str, Any]:
    """``generate``'s keyword arguments; every batch is padded like the longest prompt, so the
    whole request compiles once per mode."""
    keys = ("max_new_tokens", "max_len", "temperature", "top_k", "top_p", "seed", "eos_id")
    keys += ("forward_rows",)
    return {k: getattr(self, k) for k in keys} | {"pad_to": max(map(len, self.prompts))}


def check(config: ml_collections.ConfigDict) -> None:
  """All cheap checks, run before anything is loaded."""
  source.check(config.target, "target")
  drafter = drafters.check(config)
  source.choice(config.verifier, VERIFIERS, "verifier")
  source.choice(config.get("dtype", "auto"), DTYPES, "dtype")  # resolved once the target is known
  verifier(config)
  sampling.validate(config.temperature, config.top_k, config.top_p)
  if config.batch_size < 1:
    raise ValueError(f"config.batch_size must be >= 1, got {config.batch_size}.")
  rows = config.get("forward_rows", "auto")
  if rows != "auto" and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
    raise ValueError(f"config.forward_rows must be auto or an integer >= 0 (0: off), got {rows!r}.")
  most = config.drafter.max_nodes + 1  # the root and a step's nodes and extras at most
  if rows != "auto" and rows > most:
    raise ValueError(
      f"config.forward_rows={rows} is more than the most rows a step's target forward verifies, "
      f"config.drafter.max_nodes + 1 = {most} (root, nodes, extras): rows past those are only "
      f"padding. Use at most {most} (or raise config.drafter.max_nodes), 0, or auto."
    )
  if rows != "auto" and drafter is not None:  # other drafters: once built, before compiling
    _check_forward_rows(rows, drafter)
  for i, p in enumerate(config.get("prompts", ())):
    if not isinstance(p, (str, int, float, list, tuple)):  # e.g. --config.prompts='(None,)'
      raise ValueError(
        f"config.prompts[{i}] is {p!r}: each prompt is a text or a list of token ids, e.g. "
        "--config.prompts='(\"Hello\",)' or --config.prompts='((1, 2, 3),)'."
      )
    if isinstance(p, (int, float)):  # --config.prompts=(1,2,3): three "prompts" of one id
      raise ValueError(
        f"config.prompts[{i}] is the number {p!r}: each prompt is a text or a list of token "
        f"ids, so one prompt of ids is a tuple inside the tuple, e.g. --config.prompts='(({p}, "
        "2, 3),)'."
      )
    bad = [] if isinstance(p, str) else [t for t in p if not is_integer(t)]
    if bad:
      raise ValueError(
        f"config.prompts[{i}] has an entry {bad[0]!r} that is not a token id: a prompt of ids "
        "lists integers, e.g. --config.prompts='((1, 2, 3),)'."
      )
    if isinstance(p, str):
      try:
        p.encode("utf-8")
      except UnicodeEncodeError as e:
        raise ValueError(
          f"config.prompts[{i}] is not valid Unicode text ({e.reason} at {e.start}): fix the "
          "string."
        ) from None
  check_seed(config.seed, "config.seed")
  if "benchmark" in config and not config.benchmark.repeats >= 1:
    raise ValueError(
      f"config.benchmark.repeats must be >= 1 (timed runs after the compile run), got "
      f"{config.benchmark.repeats}."
    )
  out = "workdir" if config.get("task") == "train" else "output_dir"
  if config.get("task") != "generate" and out in config:
    results.check_writable(config[out], f"config.{out}")
  if config.get("task") == "train" and config.get("record_to"):
    results.check_writable(config.record_to, "config.record_to")
  _check_text_prompts_have_a_tokenizer(config)
  check_request(config)
  if config.get("task") == "generate" and config.get("output_dir") and mesh(config) is not None:
    results.check_writable(config.output_dir, "config.output_dir")  # its rows go there


OWN_PROMPTS = ("self_distill", "specbench")  # tasks with prompts of their own, not config.prompts


def _check_text_prompts_have_a_tokenizer(config: ml_collections.ConfigDict) -> None:
  """Text prompts need the target's tokenizer: a random target has none, and an HF directory
  without tokenizer.json has none (its prompts must be token-id lists)."""
  texts = [i for i, p in enumerate(config.get("prompts", ())) if isinstance(p, str)]
  t = config.target
  if not texts or config.get("task") in OWN_PROMPTS:
    return
  if t.source == "random":
    why = "config.target.source='random' has no tokenizer"
  elif t.source == "safetensors" and not (Path(t.path) / "tokenizer.json").is_file():
    why = f"config.target.path={t.path!r} has no tokenizer.json"
  else:
    return
  raise ValueError(
    f"{why}, so prompts are token-id lists, but config.prompts[{texts[0]}] is text: copy the "
    "checkpoint's tokenizer.json there, or give the prompts as token ids."
  )


def check_request(config: ml_collections.ConfigDict) -> None:
  """The prompts against ``max_len`` and the vocabulary, the mesh against the model's sizes,
  and the weights and KV cache against a device's memory, from the target's header and
  tokenizer: before its weights load."""
  model = source.peek(config.target)
  cfg = source.header_config(config.target) if model is None else model.cfg
  try:
    llama.check_context(cfg, config.max_len)  # a sliding window shorter than max_len
  except ValueError as e:
    raise ValueError(f"{e} (config.max_len)") from None
  if decodes_on_mesh(config):  # the sizes the config states, before they meet the devices
    stated = {k: v for k, v in dataclasses.asdict(mesh_config(config)).items() if v != -1}
    placement.check_model(stated, cfg)
    placement.check_batch(stated, config.batch_size)
  note_top_k(config.get("top_k", 0), cfg.vocab_size)
  m = mesh(config)
  shape = {"data": 1, "fsdp": 1, "tensor": 1} if m is None else dict(m.shape)
  placement.check_batch(shape, config.batch_size)
  placement.check_model(shape, cfg)
  if "max_new_tokens" in config and config.get("task") not in OWN_PROMPTS:
    check_lengths(config)
  _check_fits(config, cfg, shape)  # before the prompts: a huge batch_size makes many random ones
  if "max_new_tokens" in config and "prompts" in config and config.get("task") not in OWN_PROMPTS:
    # A random target has no tokenizer: its prompts are token ids (or seeded random ones).
    req = request(config, model or Model(cfg=cfg, params=None, tokenizer=None))
    budgets = [req.max_new_tokens] * len(req.prompts)
    try:
      decode.check_prompts(req.prompts, budgets, req.max_len, cfg.vocab_size)
    except ValueError as e:
      if str(e).startswith("prompts["):  # the row's own fault: name its field
        raise ValueError(f"config.{e}") from None
      raise ValueError(f"{e} (config.max_len, config.max_new_tokens, config.prompts)") from None


def _check_fits(config: ml_collections.ConfigDict, cfg, shape: dict) -> None:
  """The weights and an AR KV cache of ``batch_size`` x ``max_len`` against a device's memory."""
  limit = config.get("device_memory_gib", 0.0)
  placement.check_fits(None, limit)  # the limit itself, before the dtype is timed
  weights = llama.param_shapes(cfg, dtype(config))
  fp = decode.footprint(cfg, weights, decode.AUTOREGRESSIVE, None, config.batch_size,
                        config.max_len, shape)  # fmt: skip
  try:
    placement.check_fits(fp, limit)
  except ValueError as e:
    raise ValueError(f"{e} (config.max_len, config.batch_size, config.mesh)") from None


_NOTED: set = set()


def note_top_k(top_k: int, vocab_size: int) -> None:
  """A ``top_k`` above the vocabulary is harmless (sampling clips it) but says so, once."""
  if top_k > vocab_size and (top_k, vocab_size) not in _NOTED:
    _NOTED.add((top_k, vocab_size))
    print(
      f"note: config.top_k={top_k} is more than the target's vocabulary ({vocab_size} tokens): "
      f"it is clipped to {vocab_size}, which keeps every token (as top_k=0 does).",
      file=sys.stderr,
    )


def check_lengths(config: ml_collections.ConfigDict) -> None:
  """``max_new_tokens`` and ``max_len``, which fix the compiled shapes, are positive integers."""
  for name, what in (("max_new_tokens", "new tokens per row"), ("max_len", "prompt + new "
                     "tokens per row, the KV cache's slots")):  # fmt: skip
    check_integer(config[name], f"config.{name}", 1, what)


def mesh(config: ml_collections.ConfigDict):
  """The decoding mesh of ``config.mesh`` (placement.py), or None for one device (no section,
  or a 1 x 1 mesh). Join a multi-process run (``distributed``) before calling this."""
  if not decodes_on_mesh(config):
    return None
  return placement.mesh_for(mesh_config(config))


MESH_TASKS = ("generate", "benchmark", "device_bench")


def decodes_on_mesh(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.mesh`` is a decoding mesh: tasks that decode on one device refuse a mesh
  they would ignore (sizes > 1); training reads ``config.mesh`` itself (specjax/train)."""
  if "mesh" not in config or config.get("task") == "train":
    return False
  if config.get("task") in MESH_TASKS:
    return True
  if any(n > 1 for n in config.mesh.values()):  # -1 ("every device"): a training mesh's
    raise ValueError(
      f"config.mesh={dict(config.mesh)}: task={config.get('task')} decodes on one device; "
      f"a mesh applies to task={', '.join(MESH_TASKS)}. Leave config.mesh at 1 x 1 x 1."
    )
  return False


def mesh_config(config: ml_collections.ConfigDict) -> parallel.MeshConfig:
  try:
    cfg = parallel.MeshConfig(**config.mesh)
  except TypeError as e:
    raise ValueError(f"config.mesh: {e}; its fields are data, fsdp, tensor.") from None
  placement.check_decoding(cfg)
  return cfg


def distributed(config: ml_collections.ConfigDict) -> parallel.DistributedConfig:
  """``config.distributed`` (absent: one process)."""
  if "distributed" not in config:
    return parallel.DistributedConfig()
  return parallel.DistributedConfig(**config.distributed)


DTYPES = ("auto", "measure", "float32", "bfloat16")


def dtype(config: ml_collections.ConfigDict) -> str:
  """``config.dtype`` of weights and caches. ``auto`` is bfloat16 on an accelerator (half the
  bytes every step reads); on a CPU it is whichever dtype this machine runs the target's forward
  faster in, timed once per machine and model (``specjax/precision.py``): bfloat16 pays on some
  CPUs and not on others. ``measure`` is ``auto``'s former name."""
  return dtype_choice(config)["dtype"]


def dtype_choice(config: ml_collections.ConfigDict) -> dict:
  """``{"dtype", "how", "ratios"}`` (``precision.choice``): the dtype and why; benchmarks
  record it."""
  name = source.choice(config.get("dtype", "auto"), DTYPES, "dtype")
  if name in ("auto", "measure"):
    speculative, greedy = config.drafter.name != "none", config.temperature == 0
    return precision.choice(source.header_config(config.target), speculative, greedy)
  return {"dtype": name, "how": "config.dtype", "ratios": {}}


def forward_rows(config: ml_collections.ConfigDict, drafter=None, temperature=None) -> int:
  """``config.forward_rows`` as ``generate`` takes it. ``auto``: a greedy speculative run in
  bfloat16 on a CPU runs every target forward at the drafter's rows per step (root, nodes,
  extras), so its text equals AR's at those rows bit for bit (``decode.generate``); else 0
  (each forward its own rows: float32, sampling, AR alone, accelerators). ``temperature``:
  the run's, when not ``config.temperature`` (a sweep's job)."""
  rows = config.get("forward_rows", "auto")
  if rows != "auto":
    return rows
  greedy = (config.temperature if temperature is None else temperature) == 0
  if drafter is None or drafter.name == "none" or not greedy or jax.default_backend() != "cpu":
    return 0
  return drafter.num_nodes + drafter.num_extra + 1 if dtype(config) == "bfloat16" else 0


def target(config: ml_collections.ConfigDict, mesh=None) -> Model:
  """The target, its weights in ``dtype(config)``; an HF directory is read straight into its
  placement on ``mesh`` when one is given (``placed`` then moves nothing)."""
  model = source.load(config.target, dtype(config), mesh)
  if dtype(config) == "float32" or config.target.source == "safetensors":
    return model  # an HF directory loads in the dtype asked for
  return dataclasses.replace(model, params=llama.cast(model.params, dtype(config)))


def drafter(config: ml_collections.ConfigDict, target: Model):
  """Returns ``(drafter, drafter_params)``: ``config.drafter.name`` from the registry, its
  weights in the target's dtype."""
  d, params = drafters.build(config, target)
  if params is not None and dtype(config) != "float32":
    params = llama.cast(params, dtype(config))
  tune = drafters.FAMILIES[config.drafter.name].tune
  if tune is not None and config.drafter[config.drafter.name][tune.field] == "auto":
    from specjax import costmodel  # times forwards on this machine

    d = costmodel.auto(config, target, d, params, forward_rows=lambda o: forward_rows(config, o))
  rows = config.get("forward_rows", "auto")
  _check_forward_rows(0 if rows == "auto" else rows, d)
  return d, params


def _check_forward_rows(rows: int, drafter) -> None:
  """``decode.check_forward_rows`` named as the config's field."""
  try:
    decode.check_forward_rows(rows, drafter)
  except ValueError as e:
    raise ValueError(f"config.{e}") from None


def placed(config: ml_collections.ConfigDict, target: Model, drafter, dparams):
  """``(mesh, target params, drafter params)``: the weights placed once on ``mesh(config)``
  (unchanged for one device), after the per-device bytes are printed and checked."""
  m = mesh(config)
  tparams = target.params
  rules = drafters.family.placement_of(drafter).partition_rules(drafter)
  if m is not None:
    tparams = placement.place(tparams, llama.RULES, m)
    dparams = placement.place(dparams, rules, m)
  shape = dict(m.shape) if m is not None else {"data": 1, "fsdp": 1, "tensor": 1}
  fp = decode.footprint(
    target.cfg, tparams, drafter, dparams, config.batch_size, config.max_len, shape, rules
  )
  placement.check_fits(fp, config.get("device_memory_gib", 0.0))
  where = "" if m is None else f", mesh {dict(m.shape)} over {jax.process_count()} process(es)"
  tqdm.write(f"memory {fp.describe()}{where}")
  return m, tparams, dparams


def verifier(config: ml_collections.ConfigDict):
  """The lossless rule, or Medusa's typical acceptance (lossy, opt-in)."""
  if config.verifier == "typical":
    return verify.TypicalAcceptance(config.typical.epsilon, config.typical.delta)
  return verify.verify


def _shown(tok, ids) -> str:
  """A prompt of token ids as text; ids outside the vocabulary as they are (the prompt check
  names them)."""
  return tok.decode(ids) if all(0 <= i < tok.vocab_size for i in ids) else str(list(ids))


def request(config: ml_collections.ConfigDict, model: Model, drafter=None) -> Request:
  """Prompts: text through the tokenizer (and chat template), or token-id lists as given; the
  forward rows for ``drafter``'s speculative run (``forward_rows``; AR's when it is None)."""
  texts = None
  if model.tokenizer is not None:
    tok = model.tokenizer
    if not config.prompts:
      raise ValueError("config.prompts is empty: give at least one prompt string.")
    wrap = (
      (lambda t: tok.apply_chat_template([{"role": "user", "content": t}]))
      if config.chat
      else (lambda t: t)
    )
    # A text goes through the chat template and the tokenizer; token ids are used as given.
    prompts = [tok.encode(wrap(p)) if isinstance(p, str) else list(p) for p in config.prompts]
    texts = [p if isinstance(p, str) else _shown(tok, p) for p in config.prompts]
    stop = tuple(sorted(tok.stop_ids)) if config.stop_at_eos else None
  else:
    rng = np.random.default_rng(config.seed)
    prompts = [list(p) for p in config.prompts] or [
      rng.integers(0, model.cfg.vocab_size, size=rng.integers(4, 17)).tolist()
      for _ in range(config.batch_size)
    ]
    stop = None
  return Request(
    prompts=prompts,
    prompt_texts=texts,
    max_new_tokens=config.max_new_tokens,
    max_len=config.max_len,
    temperature=config.temperature,
    top_k=config.top_k,
    top_p=config.top_p,
    seed=config.seed,
    eos_id=stop,
    batch_size=config.batch_size,
    forward_rows=forward_rows(config, drafter),
  )
