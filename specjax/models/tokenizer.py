"""Tokenizer: byte-level BPE rebuilt from a GGUF's own vocab/merges, or from an HF tokenizer.json.

    tok = Tokenizer.from_gguf("model.gguf")          # or Tokenizer.from_directory(hf_dir)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    text = tok.decode(ids)

Draft/target pairs must share a tokenizer; compare ``fingerprint()`` before pairing them.
"""

import functools
import hashlib
import json
import weakref
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# llama.cpp token types (tokenizer.ggml.token_type).
_CONTROL, _USER_DEFINED = 3, 4

# The split regexes the models' own tokenizer.json files declare (llama.cpp's
# tokenizer.ggml.pre names them).
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _smollm_pre():
  # SmolLM2 (StarCoder-style): every digit is its own piece, then GPT-2's regex on the rest.
  return None, pre_tokenizers.Sequence(
    [
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]
  )


def _qwen2_pre():
  # Qwen2's tokenizer.json NFC-normalizes before splitting; llama.cpp skips that step, HF doesn't.
  return normalizers.NFC(), pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
  )


def _gpt2_pre():
  return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# tokenizer.ggml.pre -> (normalizer, pre-tokenizer). Same groupings as llama.cpp's llama-vocab.
_PRE_TOKENIZERS = {
  "smollm": _smollm_pre,
  "starcoder": _smollm_pre,
  "refact": _smollm_pre,
  "codeshell": _smollm_pre,
  "qwen2": _qwen2_pre,
  "deepseek-r1-qwen": _qwen2_pre,
  "gpt2": _gpt2_pre,
  "default": _gpt2_pre,
}

_FROM_READER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # reader -> Tokenizer
_CHATML_STOPS = ("<|im_end|>", "<|endoftext|>")


class Tokenizer:
  """A ``tokenizers.Tokenizer`` plus the ids and chat template a decode loop needs."""

  def __init__(
    self,
    backend: tokenizers.Tokenizer,
    *,
    eos_id: int,
    bos_id: int | None = None,
    add_bos: bool = False,
    chat_template: str | None = None,
    fingerprint: str,
  ):
    self.backend = backend
    self.eos_id = eos_id
    self.bos_id = bos_id
    self.add_bos = add_bos
    self.chat_template = chat_template
    self._fingerprint = fingerprint

  # -- construction -----------------------------------------------------------------------------

  @classmethod
  def from_gguf(cls, path_or_reader) -> "Tokenizer":
    """From the vocab, merges, token types and special ids stored in a GGUF's metadata.

    Building the BPE takes seconds for a large vocabulary (Qwen's: ~3 s here), so the tokenizer
    is kept with its reader: the same file opened again (``checkpoint.open_gguf`` keeps the last
    few readers) gives the same tokenizer, which nothing in specjax changes once built."""
    from specjax.models.checkpoint import as_gguf_reader

    reader = as_gguf_reader(path_or_reader)
    if cls is Tokenizer:
      if (built := _FROM_READER.get(reader)) is None:
        built = _FROM_READER[reader] = cls._build_from_gguf(reader)
      return built
    return cls._build_from_gguf(reader)

  @classmethod
  def _build_from_gguf(cls, reader) -> "Tokenizer":
    from specjax.models.checkpoint import gguf_field

    model = gguf_field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
      raise ValueError(
        f"Unsupported GGUF tokenizer model {model!r}: only byte-level BPE ('gpt2') is supported."
      )
    pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
      known = ", ".join(sorted(_PRE_TOKENIZERS))
      raise ValueError(f"Unsupported GGUF pre-tokenizer {pre!r}; supported: {known}.")
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    merges = gguf_field(reader, "tokenizer.ggml.merges")
    types = gguf_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    backend = _build_bpe(tokens, merges, types, *_PRE_TOKENIZERS[pre]())
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    return cls(
      backend,
      eos_id=int(gguf_field(reader, "tokenizer.ggml.eos_token_id")),
      bos_id=None if bos is None else int(bos),
      add_bos=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
      chat_template=gguf_field(reader, "tokenizer.chat_template"),
      fingerprint=_fingerprint(tokens, merges),
    )

  @classmethod
  def from_directory(cls, directory) -> "Tokenizer":
    """From an HF directory: tokenizer.json, tokenizer_config.json (+ chat_template.jinja)."""
    directory = Path(directory)
    backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok_cfg = _read_json(directory / "tokenizer_config.json")
    model_cfg = _read_json(directory / "config.json")
    template = tok_cfg.get("chat_template")
    if template is None and (directory / "chat_template.jinja").is_file():
      template = (directory / "chat_template.jinja").read_text()
    eos = _special_id(backend, tok_cfg.get("eos_token"))
    if eos is None:
      eos = model_cfg.get("eos_token_id")
      eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
      raise ValueError(f"No eos token in {directory}/tokenizer_config.json or config.json.")
    model = json.loads(backend.to_str())["model"]
    id_to_token = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    tokens = [id_to_token.get(i, "") for i in range(max(id_to_token) + 1)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return cls(
      backend,
      eos_id=int(eos),
      bos_id=_special_id(backend, tok_cfg.get("bos_token")),
      add_bos=bool(tok_cfg.get("add_bos_token", False)),
      chat_template=template,
      fingerprint=_fingerprint(tokens, merges),
    )

  # -- use --------------------------------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size(with_added_tokens=True)

  @property
  def stop_ids(self) -> frozenset[int]:
    """eos plus ChatML's end markers: an instruct model may end a turn with either."""
    ids = {self.token_to_id(t) for t in _CHATML_STOPS}
    return frozenset({self.eos_id} | {i for i in ids if i is not None})

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  def encode(self, text: str) -> list[int]:
    """Ids of ``text``; special tokens written in the text (``<|im_start|>``) stay whole."""
    ids = self.backend.encode(text, add_special_tokens=False).ids
    if self.add_bos and self.bos_id is not None:
      ids = [self.bos_id, *ids]
    return ids

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def fingerprint(self) -> str:
    """sha256 over the vocab (in id order) and merges: equal iff ids mean the same strings."""
    return self._fingerprint

  def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` ([{"role", "content"}]) in the model's chat format."""
    if self.chat_template is None:
      return _chatml(messages, add_generation_prompt)
    try:
      template = _compile_template(self.chat_template)
    except ImportError:
      return _chatml(messages, add_generation_prompt)
    return template.render(
      messages=messages,
      add_generation_prompt=add_generation_prompt,
      bos_token=self._token_text(self.bos_id),
      eos_token=self._token_text(self.eos_id),
    )

  def _token_text(self, token_id):
    return "" if token_id is None else self.backend.id_to_token(token_id)


def _build_bpe(tokens, merges, types, normalizer, pre_tokenizer) -> tokenizers.Tokenizer:
  vocab = {tok: i for i, tok in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError("GGUF vocab has duplicate tokens; cannot build a BPE tokenizer from it.")
  pairs = [tuple(m.split(" ", 1)) for m in merges]
  bpe = BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
  backend = tokenizers.Tokenizer(bpe)
  if normalizer is not None:
    backend.normalizer = normalizer
  backend.pre_tokenizer = pre_tokenizer
  backend.decoder = decoders.ByteLevel()
  # Control tokens (<|im_end|>) and user-defined ones (<tool_call>) must match whole in text;
  # otherwise BPE would spell them out of bytes. Only control tokens are skipped on decode.
  added = [
    AddedToken(tok, special=kind == _CONTROL, normalized=False)
    for tok, kind in zip(tokens, types, strict=True)
    if kind in (_CONTROL, _USER_DEFINED)
  ]
  backend.add_special_tokens([t for t in added if t.special])
  backend.add_tokens([t for t in added if not t.special])
  return backend


def _fingerprint(tokens, merges) -> str:
  h = hashlib.sha256()
  h.update(f"vocab {len(tokens)}\n".encode())
  h.update("\x00".join(tokens).encode())
  h.update(f"\nmerges {len(merges)}\n".encode())
  h.update("\x00".join(merges).encode())
  return h.hexdigest()


def _read_json(path):
  return json.loads(path.read_text()) if path.is_file() else {}


def _special_id(backend, token):
  if isinstance(token, dict):  # Older tokenizer_config.json writes AddedToken dicts.
    token = token.get("content")
  return None if token is None else backend.token_to_id(token)


@functools.lru_cache(maxsize=8)
def _compile_template(source):
  """Compiles a chat template the way HF renders them (sandboxed, trimmed blocks)."""
  import jinja2
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  env = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
  )
  # HF's tojson keeps non-ASCII as is; jinja2's built-in filter would HTML-escape.
  env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
  env.globals["raise_exception"] = raise_exception
  return env.from_string(source)


def _chatml(messages, add_generation_prompt):
  """ChatML, the format SmolLM2 and Qwen2 share (without either's default system prompt)."""
  text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
