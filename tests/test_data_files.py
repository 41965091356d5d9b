"""Your own data files: the three formats, assistant-only masks against the chat template,
bad records, streaming (order, shards, memory, resume), self-distillation from your prompts."""

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from specjax.models import registry
from specjax.models.tokenizer import Tokenizer
from specjax.train import conversations as cv
from specjax.train import data

ROOT = Path(__file__).resolve().parents[1]
# SmolLM2's template with a shorter default system prompt.
TEMPLATE = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\nYou are a test.<|im_end|>\n' }}{% endif %}"
  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_chat_tokenizer() -> Tokenizer:
  """Byte-level ids (256) plus <|endoftext|>, <|im_start|>, <|im_end|>, and a jinja chat
  template: a real specjax Tokenizer that loads in milliseconds (vocabulary 259)."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  hf = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  hf.decoder = decoders.ByteLevel()
  specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
  hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
  return Tokenizer(
    hf, eos_id=hf.token_to_id("<|im_end|>"), chat_template=TEMPLATE, fingerprint="bytes"
  )


@pytest.fixture(scope="module")
def tok():
  return byte_chat_tokenizer()


def conversation(i: int, turns: int = 2, system: bool = False) -> list[dict]:
  msgs = [{"role": "system", "content": f"sys {i}"}] if system else []
  for t in range(turns):
    msgs.append({"role": "user", "content": f"question {i}.{t} " * (1 + (i + t) % 3)})
    msgs.append({"role": "assistant", "content": f"reply {i}.{t} " * (1 + (i * t) % 4)})
  return msgs


def sharegpt(msgs):
  back = {"user": "human", "assistant": "gpt", "system": "system"}
  return {"conversations": [{"from": back[m["role"]], "value": m["content"]} for m in msgs]}


def write_jsonl(path: Path, records, bad: dict[int, str] | None = None) -> Path:
  """Records one per line; ``bad``: line number (1-based) -> raw text put there instead."""
  lines = [json.dumps(r) for r in records]
  for lineno, raw in sorted((bad or {}).items()):
    lines.insert(lineno - 1, raw)
  path.write_text("".join(line + "\n" for line in lines))
  return path


def files_config(path, **kw) -> dict:
  return {"files": [str(path)], "format": "sharegpt", "seq_len": 64} | kw


# -- formats ---------------------------------------------------------------------------------------


def test_each_format_parses_to_messages_or_text(tmp_path):
  msgs = conversation(1, system=True)
  share = write_jsonl(tmp_path / "s.jsonl", [sharegpt(msgs)] * 2)
  (tmp_path / "s.json").write_text(json.dumps([sharegpt(msgs), sharegpt(msgs)], indent=2))
  parts = [
    {**m, "content": [{"type": "text", "text": m["content"][:3]}, {"type": "text", "text": m[
      "content"][3:]}]} for m in msgs
  ]  # fmt: skip
  oai = write_jsonl(tmp_path / "m.jsonl", [{"messages": msgs}, {"messages": parts}])
  text = write_jsonl(tmp_path / "t.jsonl", [{"text": "one document"}, {"text": "another é"}])
  for path, fmt, want in [
    (share, "sharegpt", [msgs, msgs]),
    (tmp_path / "s.json", "sharegpt", [msgs, msgs]),
    (oai, "messages", [msgs, msgs]),
    (text, "text", ["one document", "another é"]),
  ]:
    index = cv.scan([path], fmt)
    reader = cv.Reader(index, fmt)
    assert [reader[i] for i in range(len(reader))] == want, path
  starts = [
    i + 1 for i, x in enumerate((tmp_path / "s.json").read_text().splitlines()) if x == "  {"
  ]
  assert cv.scan([tmp_path / "s.json"], "sharegpt").line.tolist() == starts


def test_globs_expand_sorted_and_a_trailing_user_turn_is_dropped(tmp_path):
  for name in ("b", "a"):
    write_jsonl(tmp_path / f"{name}.jsonl", [{"messages": conversation(0) + [{"role": "user",
                "content": "more?"}]}])  # fmt: skip
  assert [p.name for p in cv.expand([str(tmp_path / "*.jsonl")])] == ["a.jsonl", "b.jsonl"]
  index = cv.scan(cv.expand([str(tmp_path / "*.jsonl")]), "messages")
  assert cv.Reader(index, "messages")[0] == conversation(0)


# -- masks ----------------------------------------------------------------------------------------


def _check_mask_against_template(tokenizer, msgs):
  """Every assistant turn's tokens, and nothing else, are targets; the tokens before turn k
  are exactly the prompt the template gives the model for it, token for token."""
  tokens, target = cv.render(msgs, tokenizer)
  template = tokenizer.apply_chat_template
  assert tokenizer.decode(tokens) == template(msgs, add_generation_prompt=False)
  want = np.zeros(len(tokens), bool)
  for k, m in enumerate(msgs):
    if m["role"] != "assistant":
      continue
    prompt = tokenizer.encode(template(msgs[:k], add_generation_prompt=True))
    through = tokenizer.encode(template(msgs[: k + 1], add_generation_prompt=False))
    assert tokens[: len(prompt)].tolist() == prompt
    assert tokens[: len(through)].tolist() == through
    want[len(prompt) : len(through)] = True
    assert tokenizer.decode(tokens[len(prompt) : len(through)]).startswith(m["content"])
  np.testing.assert_array_equal(target, want)


@pytest.mark.parametrize("system", [False, True])
def test_assistant_only_mask_is_exact_against_the_chat_template(tok, system):
  for i in range(6):
    _check_mask_against_template(tok, conversation(i, turns=1 + i % 3, system=system))


@pytest.mark.real_model
def test_assistant_only_mask_with_smollm2s_tokenizer():
  smol = Tokenizer.from_gguf(registry.resolve("smollm2-135m-instruct"))
  for i in range(6):
    _check_mask_against_template(smol, conversation(i, turns=1 + i % 3, system=i % 2 == 0))
  msgs = [
    {"role": "user", "content": "Écris  un poème\n\n sur la mer 🌊"},
    {"role": "assistant", "content": " Voici :\n  la mer\tbleue...  "},
  ]
  _check_mask_against_template(smol, msgs)


def test_packed_rows_mask_the_next_token_of_assistant_tokens(tok, tmp_path):
  records = [sharegpt(conversation(i)) for i in range(40)]
  path = write_jsonl(tmp_path / "c.jsonl", records)
  train, _ = data.load_files(files_config(path, seq_len=256), tok)
  b = train.batch(0, 8)
  sep = data.separator_id(tok)
  for tokens, mask in zip(b["tokens"], b["mask"], strict=True):
    assert mask[-1] == 0
    text = tok.decode(tokens[1:][mask[:-1] > 0])  # the learned next tokens
    assert "question" not in text and "system" not in text and "reply" in text
    ends = np.flatnonzero(tokens == sep)
    assert ends.size and (mask[ends] == 0).all()  # nothing is learned past a conversation


def test_long_records_split_or_truncate(tok, tmp_path):
  long = sharegpt([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * 200}])
  path = write_jsonl(tmp_path / "l.jsonl", [long] * 4)
  split, _ = data.load_files(files_config(path, long="split"), tok)
  trunc, _ = data.load_files(files_config(path, long="truncate"), tok)
  rows_split = split.batch(0, 16)
  rows_trunc = trunc.batch(0, 4)
  # ~240 tokens: split into 4 rows of 64 (the last partly filled), truncated into 1.
  learned = lambda rows: int(rows["mask"].sum())
  assert learned(trunc.batch(0, 4)) < learned(split.batch(0, 16)) // 3
  assert (rows_trunc["tokens"][:, 0] == rows_trunc["tokens"][0, 0]).all()
  assert rows_split["tokens"].shape == (16, 64)


# -- bad input ------------------------------------------------------------------------------------


def test_stop_names_the_file_and_line_and_skip_counts(tok, tmp_path):
  records = [sharegpt(conversation(i)) for i in range(10)]
  path = write_jsonl(
    tmp_path / "c.jsonl", records, bad={3: "{not json", 7: '{"conversations": []}'}
  )
  with pytest.raises(ValueError, match=rf"{path}:3: not JSON.*on_error='skip'"):
    data.check_files(files_config(path))
  index = data.check_files(files_config(path, on_error="skip"))
  assert len(index) == 10 and index.problems == 2
  assert [p.split(": ")[0] for p in index.first_problems] == [f"{path}:3", f"{path}:7"]
  assert "skipped 2 bad record(s)" in index.report()


@pytest.mark.parametrize(
  "write, cfg, message",
  [
    (lambda p: p.write_text("nothing\n\n"), {"on_error": "skip"}, "nothing usable"),
    (lambda p: write_jsonl(p, [{"text": "x"}]), {}, r"\.jsonl:1: no 'conversations' list"),
    (lambda p: None, {"files": ["/nonexistent/*.jsonl"]}, "config.data.files.*matches no file"),
    (lambda p: None, {"format": "alpaca"}, "config.data.format='alpaca'.*sharegpt"),
    (lambda p: None, {"long": "wrap"}, "config.data.long='wrap'"),
    (lambda p: None, {"on_error": "ignore"}, "config.data.on_error='ignore'"),
    (lambda p: None, {"sources": ["kjv"]}, "both sources and files"),
  ],
  ids=["nothing-usable", "wrong-format", "missing", "format", "long", "on_error", "sources"],
)
def test_bad_configs_and_files_are_one_clear_error(tmp_path, write, cfg, message):
  path = tmp_path / "c.jsonl"
  write_jsonl(path, [sharegpt(conversation(0))])
  write(path)
  with pytest.raises(ValueError, match=message):
    data.check_files(files_config(path) | cfg)


def test_a_template_that_renders_nothing_is_refused_before_loading(tmp_path):
  class NoPrefix:  # a template whose prompt is not a prefix of the rendered conversation
    eos_id = 0

    def encode(self, text):
      return list(text.encode())

    def apply_chat_template(self, messages, add_generation_prompt=True):
      return ("GEN " if add_generation_prompt else "") + "|".join(m["content"] for m in messages)

  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(0))])
  with pytest.raises(ValueError, match="renders none of the first 1 record.*prefix by prefix"):
    data.check_files(files_config(path), NoPrefix())


# -- streaming ------------------------------------------------------------------------------------


def _ids(tok, batch) -> list[str]:
  """Which conversations a batch holds (their 'question i.' markers), row by row."""
  out = []
  for row in batch["tokens"]:
    text = tok.decode(row)
    out.append(sorted({w.split(".")[0] for w in text.split("question ")[1:]}))
  return out


def test_order_is_deterministic_for_a_seed_and_each_epoch_differs(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(24)])
  cfg = files_config(path, seq_len=128)
  a, _ = data.load_files(cfg, tok)
  b, _ = data.load_files(cfg, tok)
  run = lambda ds, seed: [ds.batch(s, 4, seed=seed)["tokens"] for s in range(12)]
  first, again, other = run(a, 0), run(b, 0), run(b, 1)
  assert all((x == y).all() for x, y in zip(first, again, strict=True))
  assert any((x != y).any() for x, y in zip(first, other, strict=True))
  seen = [c for s in range(12) for row in _ids(tok, {"tokens": first[s]}) for c in row]
  epoch = sorted(seen[:24], key=int)
  assert epoch == [str(i) for i in range(24)]  # every record once per epoch, then again
  assert seen[:24] != seen[24:48]


def test_each_process_reads_only_its_shard(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(21)])
  shards = [cv.scan([path], "sharegpt", process_index=p, process_count=2) for p in (0, 1)]
  assert [s.records for s in shards] == [11, 10]
  lines = [set(s.line.tolist()) for s in shards]
  assert not lines[0] & lines[1] and lines[0] | lines[1] == set(range(1, 22))
  ds, _ = data.load_files(files_config(path, seq_len=128), tok, process_index=1, process_count=2)
  got = {c for s in range(6) for row in _ids(tok, ds.batch(s, 4, process_index=1,
         process_count=2)) for c in row}  # fmt: skip
  assert got == {str(i) for i in range(1, 21, 2)}
  with pytest.raises(ValueError, match="process 1 of 2, asked for process 0"):
    ds.batch(0, 4, process_index=0, process_count=2)


def test_eval_rows_are_held_out_records(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i, turns=1)) for i in range(30)])
  train, ev = data.load_files(files_config(path, seq_len=128, eval_examples=3), tok)
  assert len(ev) == 3 and ev.tokens.shape == (3, 128)
  held = {c for row in _ids(tok, {"tokens": ev.tokens}) for c in row}
  seen = {c for s in range(10) for row in _ids(tok, train.batch(s, 4)) for c in row}
  assert held and not held & seen and len(held | seen) == 30
  with pytest.raises(ValueError, match="eval_examples=50.*leave none to train"):
    data.load_files(files_config(path, seq_len=128, eval_examples=50), tok)


def test_resume_at_a_step_gives_the_same_rows(tok, tmp_path):
  path = write_jsonl(tmp_path / "c.jsonl", [sharegpt(conversation(i)) for i in range(50)])
  cfg = files_config(path, seq_len=80)
  straight, _ = data.load_files(cfg, tok, state_dir=tmp_path / "w")
  want = [straight.batch(s, 4, seed=3) for s in range(25)]
  for state_dir, skipped in ((tmp_path / "w", 4 * 3), (None, 4 * 23)):
    resumed, _ = data.load_files(cfg, tok, state_dir=state_dir)
    for s in (23, 24):
      got = resumed.batch(s, 4, seed=3)
      np.testing.assert_array_equal(got["tokens"], want[s]["tokens"])
      np.testing.assert_array_equal(got["mask"], want[s]["mask"])
    assert resumed.skipped_rows == skipped  # from the position saved at step 20, or from 0
