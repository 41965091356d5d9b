"""Tokenizer built from a GGUF vs HF's tokenizers on hundreds of varied strings."""

import importlib.util
import json
import random
import re
import unicodedata

import pytest

from specjax.models import checkpoint, registry
from specjax.models.tokenizer import Tokenizer

_HF = importlib.util.find_spec("transformers") is not None

_SEEDS = [
  "Hello world",
  "hello, World!",
  "  leading spaces",
  "trailing spaces   ",
  "",
  " ",
  "   ",
  "\n",
  "\n\n\n",
  "\t\tindented\ttabs",
  "a\r\nb\rc",
  "x  \n  y",
  " \n \n",
  "    \n",
  "I'm you're they'll we'd she's it'd",
  "DON'T SHOUT",
  "I'M",
  "o'clock",
  "rock'n'roll",
  "3.14159",
  "1,000,000",
  "-42",
  "0x1F",
  "1e-9",
  "2024-11-29T12:00:00Z",
  "$19.99",
  "12345678901",
  "a  123",
  "x   4567 y",
  "\t 7",
  "\n\n 8",
  "v1.2.3",
  "ü1",
  "日本123",
  "naïve café résumé",
  "e\u0301 combining",
  "Å vs A\u030a",
  "ﬁ ligature",
  "Straße",
  "ǅ",
  "日本語のテキスト",
  "中文分词测试",
  "한국어 문장",
  "Русский текст",
  "Ελληνικά",
  "עברית",
  "العربية",
  "हिन्दी",
  "ไทย",
  "😀",
  "👍🏽",
  "👨‍👩‍👧‍👦 family",
  "🇫🇷🇯🇵",
  "emoji😀in😀words",
  "♥♦♣♠",
  "∑∫√∞≠",
  "def f(x):\n    return x ** 2  # square\n",
  "for (int i = 0; i < n; ++i) { sum += a[i]; }",
  "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
  "SELECT * FROM users WHERE id = 42;",
  '<div class="x">hi</div>',
  '{"key": [1, 2, {"a": null}]}',
  "https://example.com/path?q=1&r=two#frag",
  "user@example.com",
  "C:\\Users\\me\\file.txt",
  "#!/usr/bin/env bash\nset -euo pipefail\n",
  "λx. x + 1",
  "a\u200bb",
  "\u00a0nbsp\u00a0",
  "<|im_start|>user\nhi<|im_end|>\n",
  "<|endoftext|>",
  "text<|im_end|>more",
  "<tool_call>{}</tool_call>",
  "<|fim_prefix|>def <|fim_suffix|>\n<|fim_middle|>",
  "<repo_name>x",
  "<|im_start|",
  "ALLCAPS lowercase MiXeD",
  "snake_case camelCase PascalCase kebab-case",
  "...!!!???",
  "-- -- --",
  "''\"\"``",
  "a" * 50,
  "ab" * 30,
  " " * 17 + "x",
  "\t" * 5,
  "1" * 25,
]

_PIECES = [
  "the",
  " quick",
  " brown",
  "fox",
  "42",
  " 7",
  "  ",
  "   ",
  "\n",
  "\t",
  "😀",
  "日本",
  "é",
  "e\u0301",
  "'s",
  "'LL",
  "(",
  ")",
  "{",
  "}",
  "==",
  "->",
  " ",
  "x1",
  "2.5",
  "__init__",
  "ß",
  "Ω",
  "\r\n",
  "<|im_end|>",
  "über",
  "ñ",
  "  9",
  "#",
  "//",
  "**",
  "100",
  "·",
  "—",
  "…",
]


def _strings():
  rng = random.Random(0)
  generated = ["".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 12))) for _ in range(220)]
  return _SEEDS + generated


STRINGS = _strings()


def _installed_or_skip(name):
  if not registry.installed(name):
    pytest.skip(f"model package for {name} not installed: {registry.spec(name).pip_install}")


@pytest.fixture(scope="module")
def smollm2():
  _installed_or_skip("smollm2-135m-instruct")
  path = registry.resolve("smollm2-135m-instruct")
  return path, Tokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def qwen():
  _installed_or_skip("qwen2.5-coder-0.5b-instruct")
  path = registry.resolve("qwen2.5-coder-0.5b-instruct")
  return path, Tokenizer.from_gguf(path)


_HF_CACHE = {}


def _hf_from_gguf(path):
  """transformers' tokenizer built by its own GGUF reader; cached, so never mutate it."""
  if not _HF:
    pytest.skip("transformers absent: pip install torch==2.13.0 transformers accelerate")
  from transformers import AutoTokenizer

  if path not in _HF_CACHE:
    _HF_CACHE[path] = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  return _HF_CACHE[path]


def _copy(backend):
  import tokenizers

  return tokenizers.Tokenizer.from_str(backend.to_str())


# The pre-tokenizer in SmolLM2's own tokenizer.json (llama.cpp calls it "smollm").
_SMOLLM2_PRE = {
  "type": "Sequence",
  "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
  ],
}


def _mismatches(tok, backend, strings):
  return [s for s in strings if tok.encode(s) != backend.encode(s, add_special_tokens=False).ids]


def test_strings_are_varied():
  assert len(STRINGS) >= 300
  assert len(set(STRINGS)) > 250


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_ids_match_hf(smollm2):
  import tokenizers

  path, tok = smollm2
  backend = _copy(_hf_from_gguf(path).backend_tokenizer)
  # transformers' GGUF converter gives SmolLM2 plain GPT-2 splitting; SmolLM2's own
  # tokenizer.json (and llama.cpp's "smollm" pre-tokenizer) splits digits first. The two differ
  # only where a run of 2+ whitespace characters precedes a digit.
  digit_after_ws = re.compile(r"\s\s\d")
  plain = [s for s in STRINGS if not digit_after_ws.search(s)]
  assert _mismatches(tok, backend, plain) == []
  as_json = json.loads(backend.to_str())
  backend = tokenizers.Tokenizer.from_str(json.dumps({**as_json, "pre_tokenizer": _SMOLLM2_PRE}))
  assert _mismatches(tok, backend, STRINGS) == []
  print(
    f"\nsmollm2: {len(STRINGS)}/{len(STRINGS)} identical to HF with SmolLM2's pre-tokenizer; "
    f"{len(plain)}/{len(plain)} identical to transformers' GGUF tokenizer on strings without "
    f"whitespace runs before digits"
  )


@pytest.mark.slow
@pytest.mark.real_model
def test_qwen_ids_match_hf(qwen):
  import tokenizers

  path, tok = qwen
  backend = _copy(_hf_from_gguf(path).backend_tokenizer)
  # transformers' GGUF converter leaves out the NFC normalizer that Qwen2's tokenizer.json and
  # transformers' own Qwen2Tokenizer have; on NFC text the two agree.
  nfc = [s for s in STRINGS if unicodedata.normalize("NFC", s) == s]
  assert _mismatches(tok, backend, nfc) == []
  backend.normalizer = tokenizers.normalizers.NFC()
  assert _mismatches(tok, backend, STRINGS) == []
  print(
    f"\nqwen: {len(STRINGS)}/{len(STRINGS)} identical to HF with Qwen2's NFC normalizer; "
    f"{len(nfc)}/{len(nfc)} identical to transformers' GGUF tokenizer on NFC strings"
  )


@pytest.mark.real_model
@pytest.mark.slow
def test_decode_round_trip(smollm2, qwen):
  for (_, tok), normalize in (
    (smollm2, lambda s: s),
    (qwen, lambda s: unicodedata.normalize("NFC", s)),
  ):
    bad = [s for s in STRINGS if tok.decode(tok.encode(s)) != normalize(s)]
    assert bad == []


@pytest.mark.real_model
def test_special_ids(smollm2, qwen):
  _, small = smollm2
  assert (small.eos_id, small.bos_id, small.vocab_size) == (2, 1, 49152)
  assert small.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
  assert small.decode([1, 4093, 2], skip_special_tokens=True) == "user"
  _, q = qwen
  assert (q.eos_id, q.vocab_size) == (151645, 151936)
  assert q.stop_ids == {151643, 151645}
  assert q.encode("<tool_call>") == [151657]  # User-defined: whole, but not skipped on decode.
  assert q.decode([151657, 151645], skip_special_tokens=True) == "<tool_call>"


_CONVERSATIONS = [
  [{"role": "user", "content": "Write a haiku about JAX."}],
  [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
  ],
]


@pytest.mark.real_model
@pytest.mark.parametrize("which", ["smollm2", "qwen"])
@pytest.mark.slow
def test_chat_template_matches_hf(which, request):
  path, tok = request.getfixturevalue(which)
  hf = _hf_from_gguf(path)
  for messages in _CONVERSATIONS:
    for gen in (True, False):
      want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
      assert tok.apply_chat_template(messages, add_generation_prompt=gen) == want


@pytest.mark.real_model
def test_chatml_fallback_without_template(smollm2):
  _, tok = smollm2
  bare = Tokenizer(tok.backend, eos_id=tok.eos_id, fingerprint=tok.fingerprint())
  assert bare.apply_chat_template([{"role": "user", "content": "hi"}]) == (
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  )


@pytest.mark.real_model
@pytest.mark.slow
def test_fingerprints(smollm2, qwen):
  assert smollm2[1].fingerprint() != qwen[1].fingerprint()
  assert len(qwen[1].fingerprint()) == 64
  if registry.installed("qwen2.5-coder-1.5b-instruct"):
    # The draft/target pair: byte-identical tokenizers in two different files.
    big = Tokenizer.from_gguf(checkpoint.open_gguf(registry.resolve("qwen2.5-coder-1.5b-instruct")))
    assert big.fingerprint() == qwen[1].fingerprint()


@pytest.mark.real_model
@pytest.mark.slow
def test_from_directory_matches_gguf(smollm2, tmp_path):
  """An HF tokenizer directory (tokenizer.json) gives the same ids, special ids and fingerprint."""
  path, tok = smollm2
  _hf_from_gguf(path).save_pretrained(tmp_path)
  # Make the saved tokenizer.json what SmolLM2's own checkpoint ships.
  tok_json = json.loads((tmp_path / "tokenizer.json").read_text())
  (tmp_path / "tokenizer.json").write_text(json.dumps({**tok_json, "pre_tokenizer": _SMOLLM2_PRE}))
  loaded = Tokenizer.from_directory(tmp_path)
  assert _mismatches(loaded, tok.backend, STRINGS) == []
  special = lambda t: (t.eos_id, t.bos_id, t.vocab_size)
  assert special(loaded) == special(tok)
  assert loaded.fingerprint() == tok.fingerprint()
  messages = _CONVERSATIONS[1]
  assert loaded.apply_chat_template(messages) == tok.apply_chat_template(messages)
