"""task=specbench: Spec-Bench's question file in, its answer files, a JSON and a table out."""

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from configs import specbench as specbench_config
from configs import tiny
from specjax import build
from specjax.tasks import specbench

# Six questions in Spec-Bench's layout: two MT-bench ones with two turns, two translation, two
# summarization. Short turns (a random model's prompt is its bytes): every prompt, second turns
# included (4 + 8 answer tokens + 4), fits the narrowest padded width (16), so the tests compile
# AR and the drafter once each.
QUESTIONS = [
  {"question_id": 81, "category": "writing", "turns": ["Poem", "More"]},
  {"question_id": 82, "category": "writing", "turns": ["Joke", "Redo"]},
  {"question_id": 201, "category": "translation", "turns": ["Hallo Welt!"]},
  {"question_id": 202, "category": "translation", "turns": ["Guten Tag."]},
  {"question_id": 281, "category": "summarization", "turns": ["a b a b a b"]},
  {"question_id": 282, "category": "summarization", "turns": ["x y z x y z"]},
]
ANSWER_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}


def _write(path, questions):
  path.write_text("".join(json.dumps(q) + "\n" for q in questions))
  return str(path)


@pytest.fixture
def config(tmp_path):
  c = tiny.get_config()
  c.target.update(vocab_size=64, dim=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_dim=64)
  c.drafter.draft_model.num_draft = 2
  c.update(task="specbench", output_dir=str(tmp_path / "out"), batch_size=1)
  c.update(max_new_tokens=8, max_len=24)
  c.specbench = specbench.default_config()
  c.specbench.question_file = _write(tmp_path / "question.jsonl", QUESTIONS)
  return c


def _answers(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_specbench_samples_without_the_equality_check(config):
  """At temperature > 0 the two methods draw their own samples: no equality check, and the
  record says so. (First in the file: it compiles the first-turn programs the next test
  reuses, temperature being traced; tests that monkeypatch drop the compiled programs.)"""
  config.temperature = 1.0
  config.specbench.categories = ("translation",)
  record = specbench.run(config)
  assert record["greedy_outputs_identical"] is None and record["questions"] == 2
  assert all(m["model_id"].endswith("-temp-1.0") for m in record["methods"].values())


@pytest.mark.slow
def test_specbench_writes_answers_json_and_table_and_resumes(config, tmp_path, monkeypatch):
  """Both turns of the MT-bench questions, first turns of the rest: answer lines in Spec-Bench's
  layout (what its speed.py reads: tokens, wall times, accept lengths; AR's all 1), per-column
  numbers equal to speed.py's arithmetic over those files, the leaderboard table; a rerun
  decodes nothing (no model loads), and an answer cut by an interrupt is made again alone."""
  c = config
  c.specbench.turns = 2
  record = specbench.run(c)
  out = tmp_path / "out"
  saved = json.loads((out / "specbench.json").read_text())
  assert saved["questions"] == 6 and saved["greedy_outputs_identical"] is True
  assert set(saved["categories"]) == {"writing", "translation", "summarization"}
  assert list(saved["columns"]) == ["mt_bench", "translation", "summarization", "overall"]
  files = {m: out / "model_answer" / f"{v['model_id']}.jsonl" for m, v in saved["methods"].items()}
  assert list(files) == ["vanilla", "draft_model"]
  lines = {m: {a["question_id"]: a for a in _answers(f)} for m, f in files.items()}
  for m, by_id in lines.items():
    assert sorted(by_id) == [q["question_id"] for q in QUESTIONS]
    for q in QUESTIONS:
      a = by_id[q["question_id"]]
      assert set(a) == ANSWER_KEYS and a["category"] == q["category"]
      assert a["model_id"] == saved["methods"][m]["model_id"]
      (choice,) = a["choices"]
      assert set(choice) == CHOICE_KEYS and choice["index"] == 0
      n = len(q["turns"])  # the writing questions' second turns were asked too
      assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == n
      assert choice["new_tokens"] == [8] * n and all(t > 0 for t in choice["wall_time"])
      assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
      assert len(choice["accept_lengths"]) == sum(choice["decoding_steps"])
      if m == "vanilla":
        assert set(choice["accept_lengths"]) == {1}
    # Greedy: the drafter's answers are AR's, turn for turn.
  for qid in lines["vanilla"]:
    assert (
      lines["vanilla"][qid]["choices"][0]["turns"]
      == lines["draft_model"][qid]["choices"][0]["turns"]
    )

  # speed.py's arithmetic over the answer files, column by column.
  def speed(m, cats):
    sel = [a["choices"][0] for a in lines[m].values() if a["category"] in cats]
    tps = statistics.mean(sum(s["new_tokens"]) / sum(s["wall_time"]) for s in sel)
    return tps, statistics.mean(n for s in sel for n in s["accept_lengths"])

  cats = {"mt_bench": ["writing"], "overall": ["writing", "translation", "summarization"]}
  for key, cs in cats.items():
    for m in files:
      tps, tau = speed(m, cs)
      got = saved["columns"][key][m]
      assert got["tokens_per_s"] == pytest.approx(tps) and got["tau"] == pytest.approx(tau)
      assert got["speedup"] == pytest.approx(tps / speed("vanilla", cs)[0])
  assert saved["columns"]["overall"]["vanilla"]["tau"] == 1.0
  assert saved["columns"]["overall"]["draft_model"]["tau"] > 1.0
  assert record["columns"] == saved["columns"]

  table = (out / "specbench.md").read_text()
  assert (
    "| Method | Multi-turn Conversation | Translation | Summa-rization | #Mean Accepted Tokens "
    "| Overall |" in table
  )
  assert "| vanilla (AR) | 1.00x | 1.00x | 1.00x | 1.00 | 1.00x |" in table
  assert "| draft_model |" in table

  # A rerun: nothing to decode, no model loads, the same answers.
  before = {m: f.read_text() for m, f in files.items()}
  with monkeypatch.context() as mp:
    mp.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
    again = specbench.run(c)
  assert {m: f.read_text() for m, f in files.items()} == before
  assert again["columns"] == saved["columns"]

  # Killed while writing the drafter's answer to the last question (AR's was written).
  text = files["draft_model"].read_text().splitlines(keepends=True)
  files["draft_model"].write_text("".join(text[:-1]) + text[-1][:40])
  redone = json.loads(text[-1])["question_id"]
  asked = []
  monkeypatch.setattr(specbench, "answer", _spy(specbench.answer, asked))
  specbench.run(c)
  assert asked == [redone, redone]  # AR and the drafter, that question only
  after = {m: {a["question_id"]: a for a in _answers(f)} for m, f in files.items()}
  assert sorted(after["vanilla"]) == sorted(after["draft_model"]) == sorted(lines["vanilla"])
  assert after["vanilla"][redone]["answer_id"] != lines["vanilla"][redone]["answer_id"]

  # Another decoding config over these answers: refused before any model loads.
  c.max_new_tokens = 6
  monkeypatch.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
  with pytest.raises(ValueError, match=r"specbench.resume: .*config.max_new_tokens"):
    specbench.run(c)


def test_specbench_variants_share_one_ar_run(config, tmp_path):
  """``specbench.variants``: every drafter beside one AR run, an answer file and a table row
  each, every greedy answer checked against AR's; AR's own name is refused."""
  config.specbench.categories = ("translation",)
  config.specbench.variants = {"draft": {}, "lookup": {"name": "prompt_lookup"}}
  record = specbench.run(config)
  assert list(record["methods"]) == ["vanilla", "draft", "lookup"]
  files = [tmp_path / "out" / "model_answer" / f"{m['model_id']}.jsonl"
           for m in record["methods"].values()]  # fmt: skip
  turns = [[a["choices"][0]["turns"] for a in _answers(f)] for f in files]
  assert len(turns[0]) == 2 and turns[0] == turns[1] == turns[2]
  assert record["columns"]["overall"]["draft"]["tau"] > 1.0
  assert "| lookup |" in (tmp_path / "out" / "specbench.md").read_text()
  # Another drafter under a kept name: its answers are not reused, before any model loads.
  k2 = {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 2}}
  config.specbench.variants = {"draft": {}, "lookup": k2}
  with pytest.raises(ValueError, match=r"specbench.resume: .*config.specbench.variants"):
    specbench.run(config)
  config.specbench.variants = {"vanilla": {}}
  with pytest.raises(ValueError, match=r"variants names a variant 'vanilla'"):
    specbench.check(config)


def test_accept_lengths_number_the_forwards_and_sum_to_the_tokens():
  """Prefill 1, then n + 1 per step that accepted n (grouped by n); a step cut short by the
  budget trims the largest."""
  counts = lambda hist, tokens: {"accept_hist": hist, "tokens": np.asarray([tokens])}  # noqa: E731
  assert specbench.accept_lengths(counts([2, 0, 1], 6)) == [1, 1, 1, 3]
  assert specbench.accept_lengths(counts([2, 0, 1], 4)) == [1, 1, 1, 1]
  assert specbench.accept_lengths(counts([5], 6)) == [1] * 6  # AR


def test_greedy_answers_that_differ_from_ar_stop_the_run():
  """The check every greedy question passes: the first differing turn and token, named."""
  q = QUESTIONS[0]
  specbench._check_equal(q, [[1, 2], [3]], [[1, 2], [3]], "lookup")
  with pytest.raises(RuntimeError, match=r"question 81, turn 2: lookup's .* at new token 1 "):
    specbench._check_equal(q, [[1, 2], [3, 4]], [[1, 2], [3, 5]], "lookup")


def _second_answer_token_flipped(generate):
  """``generate`` whose drafted answers get another second token: a stand-in for a bfloat16
  rounding that flips one greedy token (AR's answers are left as they are)."""

  def wrapped(params, cfg, prompts, **kw):
    out = generate(params, cfg, prompts, **kw)
    if kw.get("drafter") is not None and len(out.tokens[0]) > 1:
      row = list(out.tokens[0])
      row[1] = (row[1] + 1) % cfg.vocab_size
      out = dataclasses.replace(out, tokens=[row])
    return out

  return wrapped


@pytest.mark.parametrize(
  "dtype, rows", [("bfloat16", 0), ("float32", "auto"), ("bfloat16", "auto")]
)
def test_a_greedy_difference_is_reported_where_rounding_may_part_and_stops_an_exact_run(
  config, monkeypatch, dtype, rows
):
  """In bfloat16 with each forward at its own rows (``forward_rows = 0``: rounding may part
  them) a drafted greedy answer that leaves AR's is recorded, with the turn, the token and the
  target's logit gap there, and the run answers every question; in float32, and in bfloat16 at
  the default forward_rows (every forward at the drafter's rows, compared with AR at those
  rows), it is a bug, and the run stops on it."""
  config.dtype, config.forward_rows = dtype, rows
  config.specbench.categories = ("translation",)
  monkeypatch.setattr(specbench, "generate", _second_answer_token_flipped(specbench.generate))
  if rows == "auto":
    with pytest.raises(RuntimeError, match="question 201, turn 1: .* at new token 1 "):
      specbench.run(config)
    return
  record = specbench.run(config)
  assert record["questions"] == 2 and record["greedy_outputs_identical"] is False
  assert record["forward_rows"] and set(record["forward_rows"].values()) == {0}
  found = record["greedy_differences"]
  where = [(d["question_id"], d["turn"], d["new_token"]) for d in found]
  assert where == [(201, 1, 1), (202, 1, 1)]
  for d in found:
    assert d["token"] == (d["ar_token"] + 1) % config.target.vocab_size
    assert d["logit_gap"] > 0  # AR's token is the target's argmax there
  saved = [json.loads(x) for x in (Path(config.output_dir) / specbench.DIFFERENCES).open()]
  assert saved == found


@pytest.mark.slow
def test_bfloat16_greedy_runs_each_drafter_at_its_rows_and_records_them(config):
  """In bfloat16 at the default forward_rows a greedy drafter decodes at its rows per step
  (a 2-chain: 3), every answer equal to AR's at those rows, and the record names the rows."""
  config.dtype = "bfloat16"
  config.specbench.categories = ("translation",)
  record = specbench.run(config)
  assert record["greedy_outputs_identical"] is True
  assert record["forward_rows"] == {"draft_model": 3}


def _spy(fn, calls):
  def wrapped(question, *a, **kw):
    calls.append(question["question_id"])
    return fn(question, *a, **kw)

  return wrapped


def test_specbench_subset_by_category_and_count(config):
  """``categories`` and ``per_category`` pick the first N questions of the named categories."""
  config.specbench.categories = ("summarization", "writing")
  config.specbench.per_category = 1
  questions = specbench.check(config)
  assert [q["question_id"] for q in questions] == [81, 281]


def test_specbench_config_tiny_variant_passes_its_checks(config):
  """configs/specbench.py:tiny (the CLI smoke run) over this file: its writing, translation
  and the qa it lacks, named in the error."""
  c = specbench_config.get_config("tiny")
  c.specbench.question_file = config.specbench.question_file
  with pytest.raises(ValueError, match=r"categories has 'qa', which"):
    specbench.check(c)
  c.specbench.categories = ("writing", "translation")
  assert [q["question_id"] for q in specbench.check(c)] == [81, 201]


@pytest.mark.parametrize(
  "case, message",
  [
    ("missing", r"question_file='.*nope.jsonl' does not exist: download Spec-Bench"),
    ("directory", r"question_file='.*' is a directory: name the question.jsonl file itself"),
    ("no_turns", r"line 2 has no 'turns': every line needs"),
    ("category", r"specbench.categories has 'poetry', which .* lacks; its categories are"),
    ("per_category", r"specbench.per_category=0 must be an integer >= 1"),
    ("turns", r"specbench.turns=3 must be 1"),
    ("max_len", r"question 201 \(translation\) is 11 prompt tokens .*max_len to at least 19"),
  ],
)
def test_specbench_bad_input_fails_before_the_model_loads(config, tmp_path, monkeypatch, case,
                                                          message):  # fmt: skip
  s = config.specbench
  if case == "missing":
    s.question_file = str(tmp_path / "nope.jsonl")
  elif case == "directory":
    s.question_file = str(tmp_path)
  elif case == "no_turns":
    s.question_file = _write(
      tmp_path / "q.jsonl", [QUESTIONS[0], {"question_id": 1, "category": "qa"}]
    )
  elif case == "category":
    s.categories = ("writing", "poetry")
  elif case == "per_category":
    s.per_category = 0
  elif case == "turns":
    s.turns = 3
  else:
    config.max_len = 18
  monkeypatch.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
  with pytest.raises(ValueError, match=message):
    specbench.run(config)


@pytest.mark.real_model
def test_second_turn_is_asked_after_the_first_answer_in_the_chat_template():
  """SmolLM2's template: the answer cut at its stop token and stripped, as Spec-Bench writes
  it, stands as the assistant's message before the second question (the header alone)."""
  from specjax.models import source

  model = source.peek(source.config("smollm2-135m-instruct"))
  tok, encoder = model.tokenizer, specbench.Encoder(model, model.cfg.vocab_size)
  answer = tok.encode(" Paris. ") + [tok.eos_id] + tok.encode("more")
  assert encoder.text(answer) == "Paris."
  text = tok.decode(encoder.prompt(["Capital of France?", "And of Spain?"], [answer]))
  assert text.startswith(tok.decode(encoder.prompt(["Capital of France?"], [])))
  assert text.endswith(
    "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd of Spain?<|im_end|>\n"
    "<|im_start|>assistant\n"
  )


def test_a_new_prompt_width_is_compiled_by_a_one_token_call_before_the_timed_one():
  """The timed call of a width never compiles: a width not seen before is compiled by a
  one-token call first, once per width (a stand-in for generate that counts a trace the first
  time it meets a width, as the decode loop does)."""
  import functools

  from specjax import decode, loop

  calls, compiled = [], set()

  def fake_generate(prompts, max_new_tokens, max_len):
    width = decode.prompt_width(len(prompts[0]), max_len)
    if width not in compiled:
      compiled.add(width)
      loop.TRACES["generate"] += 1
    calls.append((width, max_new_tokens, loop.TRACES["generate"]))
    return max_new_tokens

  fn = functools.partial(fake_generate, max_new_tokens=256, max_len=1024)
  warmed = set()
  for n in (20, 30, 100, 20):
    specbench._timed(fn, list(range(n)), warmed)
  # widths 32, 32, 128, 32: one-token calls for 32 and 128 only, and one timed call per prompt.
  assert [(w, k) for w, k, _ in calls] == [(32, 1), (32, 256), (32, 256), (128, 1), (128, 256),
                                           (32, 256)]  # fmt: skip
  assert warmed == {32, 128}


@pytest.mark.parametrize(
  "line, message",
  [
    ("{not json", r"line 2 is not JSON"),
    ('{"question_id": 9, "category": "qa"}', r"line 2 has no 'turns'"),
    ('{"question_id": 9, "category": "qa", "turns": []}', r"'turns' must be a non-empty list"),
    ('{"question_id": 1, "category": "qa", "turns": ["b"]}', r"repeats question_id 1"),
    # was a TypeError (unhashable type: 'list') traceback
    ('{"question_id": [9], "category": "qa", "turns": ["b"]}', r"'question_id' must be a num"),
  ],
)
def test_a_bad_question_line_is_one_error_naming_the_file_and_line(tmp_path, line, message):
  path = tmp_path / "question.jsonl"
  path.write_text('{"question_id": 1, "category": "qa", "turns": ["a"]}\n' + line + "\n")
  with pytest.raises(ValueError, match=r"config.specbench.question_file=.*" + message):
    specbench.read_questions(str(path))


def test_a_resume_over_answers_to_other_questions_is_refused(config, tmp_path, monkeypatch):
  """The answers depend on the questions, not on the file's name: the same questions in
  another file resume; the same ids with other turns or categories are refused before any model
  loads; a damaged specbench.json is one error naming it."""
  config.specbench.categories = ("translation",)
  specbench.run(config)
  monkeypatch.setattr(build, "target", lambda config: pytest.fail("loaded a model"))
  config.specbench.question_file = _write(tmp_path / "copy.jsonl", QUESTIONS)
  specbench.run(config)
  changed = [q | {"turns": ["Bonjour."]} if q["question_id"] == 202 else q for q in QUESTIONS]
  config.specbench.question_file = _write(tmp_path / "q2.jsonl", changed)
  with pytest.raises(ValueError, match=r"specbench.resume: .* other questions \(202\) than "
                     r"config.specbench.question_file=.*q2.jsonl.*resume=False"):  # fmt: skip
    specbench.run(config)
  record = tmp_path / "out" / "specbench.json"
  record.write_text(record.read_text()[:100])
  with pytest.raises(ValueError, match=r"specbench.resume: .*specbench.json is not valid JSON"):
    specbench.run(config)
