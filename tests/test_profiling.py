"""``config.profile``: task=generate and task=train write a jax.profiler trace of warmed work
(an ``.xplane.pb`` that TensorBoard's profile plugin and XProf open); a task that does not
trace, or a directory that cannot be written, is one error before anything loads."""

import pytest

from configs import tiny, train_tiny
from specjax.tasks import generate, train


def _traces(directory):
  return sorted(directory.glob("plugins/profile/*/*.xplane.pb"))


def test_a_decode_is_traced(tmp_path, capsys):
  c = tiny.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, ffn_dim=64, num_heads=2, num_kv_heads=1)
  c.prompts, c.max_new_tokens, c.profile = ((1, 2, 3),), 8, str(tmp_path / "p")
  generate.run(c)
  (found,) = _traces(tmp_path / "p")
  assert found.stat().st_size > 0
  assert "profile of one warmed decode of the first batch" in capsys.readouterr().out


@pytest.mark.slow
def test_train_steps_after_the_first_are_traced(tmp_path, capsys):
  c = train_tiny.get_config()
  c.workdir, c.profile, c.profile_steps = str(tmp_path / "w"), str(tmp_path / "p"), 2
  c.data.max_examples, c.data.eval_examples = 32, 8
  c.train.update(progress=False, steps=4, global_batch=8, eval_batches=1)
  train.run(c)
  (found,) = _traces(tmp_path / "p")
  assert found.stat().st_size > 0
  assert "profile of train steps 2..3" in capsys.readouterr().out


@pytest.mark.parametrize("task", ["specbench", "sweep"])
def test_a_task_that_does_not_trace_is_refused(tmp_path, task):
  c = tiny.get_config()
  c.task, c.profile = task, str(tmp_path / "p")
  from specjax import profiling

  with pytest.raises(ValueError, match=f"config.profile=.*task='{task}' does not trace"):
    profiling.check(c)


def test_an_unwritable_profile_directory_is_refused(tmp_path):
  (tmp_path / "a_file").write_text("")
  c = tiny.get_config()
  c.profile = str(tmp_path / "a_file")
  with pytest.raises(ValueError, match="config.profile=.* is a file"):
    generate.run(c)
