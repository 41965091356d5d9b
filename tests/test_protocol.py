"""A drafter written only here, against the protocol in drafters/base.py, with its family record
(drafters/family.py) registered with one call: the config, generate (greedy equals AR; sampled
rows follow the target's distribution), the cost model's step pricing and the tau simulator all
take it with no edit elsewhere. (tests/test_family_record.py does the same for a trained one.)"""

import dataclasses

import jax.numpy as jnp
import ml_collections
import pytest

from configs import tiny as tiny_config
from specjax import build, costmodel, drafters, simulate, testing
from specjax.decode import generate
from specjax.drafters import family
from specjax.drafters.base import Draft, Forward, TokensOnly, verify_forward
from specjax.models import tiny
from specjax.models.cache import gather_rows


@dataclasses.dataclass(frozen=True)
class RepeatNewest(TokensOnly):
  """Guesses that the newest token repeats, ``num_draft`` times (deterministic candidates)."""

  num_draft: int = 2
  name: str = "repeat_newest"

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"num_draft": 2})

  @classmethod
  def build(cls, c, config, target):
    return cls(c.num_draft), None

  def propose(self, params, state, ctx):
    newest_Bx1 = gather_rows(ctx.tokens, ctx.lengths[:, None])
    return Draft(tokens=jnp.tile(newest_Bx1, (1, self.num_draft))), state

  def step_forwards(self):
    return (Forward("lookup", 1), verify_forward(self))


FAMILY = family.Family(
  name="repeat_newest",
  drafter=RepeatNewest,
  price=family.Price(
    forwards=RepeatNewest.step_forwards,
    timers={"lookup": family.time_propose},
    sizes=lambda d, params: {"lookup": (0, 0)},
  ),
  replay=family.Replay(drafts=RepeatNewest.teacher_forced_drafts),
)


@pytest.fixture
def registered():
  family.register(FAMILY)  # the one call
  yield
  family.unregister(FAMILY.name)


def test_a_drafter_defined_here_runs_everywhere(registered):
  c = tiny_config.get_config()
  c.drafter = drafters.default_config("repeat_newest")
  c.drafter.repeat_newest.num_draft = 3
  build.check(c)
  target = build.target(c)
  d, dparams = build.drafter(c, target)
  assert d == RepeatNewest(3)
  cfg, params = target.cfg, target.params
  prompts = build.request(c, target).batches()[0]  # the config's seeded prompts
  kw = dict(max_new_tokens=16, max_len=64)
  ar = generate(params, cfg, prompts, **kw)
  out = generate(params, cfg, prompts, drafter=d, drafter_params=dparams, **kw)
  assert out.tokens == ar.tokens  # greedy: the target's own continuation
  assert out.metrics["row_calls"][0] < ar.metrics["row_calls"][0]  # its row 0 repeats a token
  # The simulator replays each row from its text alone: the calls decoding made, row by row.
  rows = list(zip(prompts, ar.tokens, strict=True))
  replayed = [simulate.replay(target, d, dparams, [row]).calls for row in rows]
  assert replayed == out.metrics["row_calls"]
  # The cost model prices the step it lists: the guess, then a 4-token verify.
  assert costmodel.step_work(d) == (Forward("lookup", 1), Forward("target", 4))
  profile = costmodel.roofline("H200", costmodel.model_sizes(cfg, d, dparams))
  assert profile.step_seconds(d) > profile.step_seconds(None)


@pytest.mark.slow
def test_its_sampled_rows_follow_the_targets_distribution(registered):
  """Temperature 1 on a 5-token vocabulary, three tokens enumerated; a verifier that accepts
  with the target's probability instead of the rejection rule fails the same check."""
  target = tiny.random_model(seed=7, vocab_size=5)
  knobs = dict(temperature=1.0)
  kw = dict(prompts=[[1, 1, 2]], rows=2000, calls=3)
  assert testing.exact_pvalues(target, RepeatNewest(2), None, knobs, **kw)[0] > testing.P_PASS
  broken = testing.exact_pvalues(
    target, RepeatNewest(2), None, knobs, verifier=testing.accept_with_target_prob, **kw
  )
  assert broken[0] < testing.P_FAIL
