"""A *trained* drafter written only here: its class, its training objective and its family
record (config, placement, price, tune, replay, objective, one export layout), registered with
one call. With no edit to any other file it trains through ``task=train``, is saved and loaded
back, decodes greedy = AR and exactly at temperature 1, is priced by the cost model from its own
timer, picks its chain length with ``auto``, is replayed by the simulator call for call, and is
exported through ``task=export_drafter`` and read back bit-identical.

The drafter is a bigram table: ``table[t]`` is the logits of the token after ``t``, trained by
KL(target || table) over the target's own text, drafting a chain of K tokens."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from ml_collections import config_dict

from configs import export_drafter as export_config
from configs import train_tiny
from specjax import build, costmodel, drafters, losses, sampling, simulate, testing
from specjax.decode import generate
from specjax.drafters import artifact, family
from specjax.drafters.base import Draft, DraftContext, Forward, TokensOnly, verify_forward
from specjax.models import llama, tiny
from specjax.models.cache import gather_rows
from specjax.tasks import export_drafter
from specjax.tasks import train as train_task
from specjax.train import objectives

NAME, FIELD = "bigram", "config.drafter.bigram"
META, TENSORS = "bigram.json", "bigram.safetensors"


@dataclasses.dataclass(frozen=True)
class Bigram(TokensOnly):
  """A chain of ``num_draft`` tokens, each drawn from ``table`` at the one before (sampled
  candidates: q is what the verifier needs)."""

  num_draft: int = 2
  name: str = NAME

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # a directory task=train wrote (draft_final)
    c.num_draft = config_dict.FieldReference(2, field_type=object)  # K, or "auto"
    c.auto_from = ""  # num_draft = "auto": a JSON of {target, tau_by_k}
    return c

  @classmethod
  def check(cls, c, config):
    if c.path and not (Path(c.path) / META).is_file():  # empty: task=train makes one
      raise ValueError(f"{FIELD}.path={c.path!r} holds no {META}: train one first.")
    if c.num_draft == "auto" and not Path(c.auto_from).is_file():
      raise ValueError(f"{FIELD}.auto_from={c.auto_from!r} is not a file.")

  @classmethod
  def build(cls, c, config, target):
    _, params, _ = FAMILY.saved.load(c.path, target, f"{FIELD}.path")
    return cls(1 if c.num_draft == "auto" else c.num_draft), params

  def propose(self, params, state, ctx: DraftContext):
    token_B = gather_rows(ctx.tokens, ctx.lengths[:, None])[:, 0]
    tokens, qs = [], []
    for key in jax.random.split(ctx.key, self.num_draft):
      q_BxV = sampling.probs(params["table"][token_B], ctx.sampling)
      token_B = sampling.sample(key, q_BxV, ctx.sampling)
      tokens.append(token_B)
      qs.append(q_BxV)
    return Draft(tokens=jnp.stack(tokens, 1), probs=jnp.stack(qs, 1)), state

  def step_forwards(self):
    return (Forward(NAME, 1), verify_forward(self))


@dataclasses.dataclass(frozen=True)
class BigramDistill:
  """The table trained by KL(target || table) at every position of the training text."""

  target_cfg: object
  name: str = NAME
  rules: tuple = ()
  frozen_rules: tuple = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"loss": "kl"})

  @classmethod
  def check(cls, c) -> None:
    losses.check_token_loss(c.loss, f"config.objective.{NAME}.loss")

  @classmethod
  def build(cls, c, target_cfg):
    return cls(target_cfg)

  def init(self, key, frozen):
    v = self.target_cfg.vocab_size
    return {"table": jnp.zeros((v, v), jnp.float32)}

  def loss(self, params, frozen, batch, key):
    teacher = llama.logits_of(frozen, self.target_cfg, batch["tokens"])[0]
    return losses.distill_kl(teacher, params["table"][batch["tokens"]], batch["mask"])

  def model_params(self, params, frozen):
    return params

  def signature(self) -> dict:
    return {"objective": NAME, "vocab": self.target_cfg.vocab_size}

  def describe(self) -> str:
    return f"bigram table {self.target_cfg.vocab_size} x {self.target_cfg.vocab_size}"

  def drafter(self, config) -> Bigram:
    return Bigram(config.drafter.bigram.num_draft)

  def export(self, directory, params, target):
    meta = {"format": 1, "target": artifact.target_meta(target)}
    return artifact.save(directory, {"table": params["table"]}, TENSORS, meta, META)

  def with_data(self, dataset, tokenizer):
    return self

  def cached_features(self) -> tuple:
    return ()


def _load(directory, target, field):
  meta = artifact.read_meta(directory, META, 1, field, "train one", TENSORS)
  if meta["target"]["fingerprint"] != artifact.fingerprint(target):
    raise ValueError(f"{field}: trained for another target.")
  table = artifact.read_tensors(directory, TENSORS)["table"]
  return table.shape, {"table": jnp.asarray(table)}, meta


def _export(cfg, params, out, fmt, dtype):
  """The one published layout: ``table.npy`` and a config.json."""
  with artifact.atomic_directory(out, WRITES) as tmp:
    np.save(tmp / "table.npy", np.asarray(params["table"]).astype(dtype))
    (tmp / "config.json").write_text(json.dumps({"vocab_size": int(cfg[0])}))
  return Path(out)


WRITES = ("table.npy", "config.json")
TIMED = []  # the cost model asked this drafter's own timer


def _time_own(drafter, dparams, target_cfg, context, sizes, repeats):
  TIMED.append(sizes)
  return family.time_propose(drafter, dparams, target_cfg, context, sizes, repeats)


def _tau_by_k(config, target_name):
  record = json.loads(Path(config.drafter.bigram.auto_from).read_text())
  assert record["target"] == target_name
  return [{"num_draft": int(k), "tau": t} for k, t in record["tau_by_k"].items()]


def _check_params(drafter, params):
  if params is None or params["table"].ndim != 2:
    raise ValueError("bigram drafter_params need a [V, V] table.")


FAMILY = family.Family(
  name=NAME,
  drafter=Bigram,
  placement=family.Placement(check_params=_check_params),
  price=family.Price(forwards=Bigram.step_forwards, timers={NAME: _time_own}),
  tune=family.Tune(
    field="num_draft",
    grid=_tau_by_k,
    label=lambda g: f"K={g['num_draft']}",
    prefer=lambda g: (-g["num_draft"],),
  ),
  replay=family.Replay(drafts=Bigram.teacher_forced_drafts),
  objective=BigramDistill,
  saved=family.Saved(META, _load, _export, formats=("bigram_npy",), writes=WRITES),
)


@pytest.fixture
def registered():
  family.register(FAMILY)  # the one call
  yield
  family.unregister(NAME)


def _train_config(workdir) -> ml_collections.ConfigDict:
  c = train_tiny.get_config()
  c.objective = objectives.default_config(NAME)
  c.drafter = drafters.default_config(NAME)
  c.drafter.bigram.num_draft = 3
  c.workdir = str(workdir)
  c.data.max_examples = 96
  c.data.eval_examples = 16
  c.train.update(steps=40, log_every=20, eval_every=40, checkpoint_every=40, eval_batches=1,
                 progress=False)  # fmt: skip
  c.optim.update(learning_rate=0.3, warmup_steps=0, decay_steps=0)
  c.evaluate.tau_every = 20  # the simulator replays it during training
  return c


@pytest.mark.slow
def test_a_trained_drafter_defined_here_runs_everywhere(registered, tmp_path, capsys):
  c = _train_config(tmp_path / "run")
  record = train_task.run(c)
  decode = record["decode"]
  assert decode["final"]["tau"] > decode["init"]["tau"] + 0.2  # training raised acceptance
  check = record["tau_check"]  # the simulator's τ on the curve against the real decode
  assert check["simulated"] == pytest.approx(check["decoded"], rel=1e-6)

  # Saved and loaded back through the config: it decodes as it did at the end of training.
  c.drafter.bigram.path = str(tmp_path / "run" / "draft_final")
  c.task = "generate"
  build.check(c)
  target = build.target(c)
  d, dparams = build.drafter(c, target)
  prompts = build.request(c, target).batches()[0]
  kw = dict(max_new_tokens=c.max_new_tokens, max_len=c.max_len)
  ar = generate(target.params, target.cfg, prompts, **kw)
  out = generate(target.params, target.cfg, prompts, drafter=d, drafter_params=dparams, **kw)
  assert out.tokens == ar.tokens  # greedy: the target's own continuation
  assert out.metrics["tau"] == pytest.approx(decode["final"]["tau"])

  # The simulator replays each row from its text alone: the calls decoding made, row by row.
  rows = list(zip(prompts, ar.tokens, strict=True))
  assert [simulate.replay(target, d, dparams, [r]).calls for r in rows] == out.metrics["row_calls"]

  # The cost model prices its step from its own timer.
  TIMED.clear()
  parts = costmodel.drafter_seconds(d, dparams, target.cfg, context=16, repeats=1)
  assert TIMED == [[1]] and parts[NAME][1] > 0
  profile = costmodel.measured("here", {"target": {1: 1e-3, 4: 2e-3}}, parts, 0.0)
  assert profile.step_seconds(d) > profile.step_seconds(None)

  # auto: τ for every K from the simulator, the step costs timed here, one K chosen.
  tau_by_k = simulate.tau_by_chain_length(target, d, dparams, rows, 4)
  curve = tmp_path / "tau_by_k.json"
  curve.write_text(json.dumps({"target": target.cfg.name, "tau_by_k": tau_by_k}))
  c.drafter.bigram.update(num_draft="auto", auto_from=str(curve))
  build.check(c)
  chosen, _ = build.drafter(c, target)
  assert 1 <= chosen.num_draft <= 4 and f"chose K={chosen.num_draft}" in capsys.readouterr().out

  # Exported through task=export_drafter in its layout, read back bit for bit.
  e = export_config.get_config("tiny")
  e.target = c.target
  e.export.update(path=c.drafter.bigram.path, format="bigram_npy", out=str(tmp_path / "exp"))
  export_drafter.run(e)
  back = np.load(tmp_path / "exp" / "table.npy")
  saved = artifact.read_tensors(c.drafter.bigram.path, TENSORS)["table"]
  assert back.dtype == saved.dtype and back.tobytes() == saved.tobytes()


@pytest.mark.slow
def test_its_sampled_rows_follow_the_targets_distribution(registered):
  """Temperature 1 on a 5-token vocabulary, three tokens enumerated; a verifier that accepts
  with the target's probability instead of the rejection rule fails the same check."""
  target = tiny.random_model(seed=7, vocab_size=5)
  table = {"table": jax.random.normal(jax.random.key(3), (5, 5)) * 2}
  knobs = dict(temperature=1.0)
  kw = dict(prompts=[[1, 1, 2]], rows=2000, calls=3)
  assert testing.exact_pvalues(target, Bigram(2), table, knobs, **kw)[0] > testing.P_PASS
  broken = testing.exact_pvalues(
    target, Bigram(2), table, knobs, verifier=testing.accept_with_target_prob, **kw
  )
  assert broken[0] < testing.P_FAIL


def test_a_family_without_a_group_says_so(registered):
  bare = dataclasses.replace(FAMILY, name="bare", price=None, replay=None)
  family.register(bare)
  try:
    d = dataclasses.replace(Bigram(2), name="bare")
    with pytest.raises(ValueError, match="'bare' has no price"):
      costmodel.step_work(d)
    with pytest.raises(ValueError, match="offline acceptance is simulated for"):
      simulate.check_supported(d)
  finally:
    family.unregister("bare")
