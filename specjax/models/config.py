"""ModelConfig: the static, hashable description of a Llama-family decoder."""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a Llama-family decoder (Llama 2/3.x, SmolLM2, Qwen2, Qwen3, Mistral).

  Frozen and hashable: it is a static argument of every jitted function. ``rope_inv_freq``
  holds a scaled RoPE's inverse frequencies (``models/rope.py`` computes them once, at load,
  as transformers does); empty means the plain ``rope_theta`` ones.
  """

  vocab_size: int
  dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  ffn_dim: int
  head_dim: int = 0  # 0 means dim // num_heads.
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  qkv_bias: bool = False  # Qwen2 has biases on the q/k/v projections.
  name: str = "model"
  out_bias: bool = False  # Llama attention_bias=True: a bias on o_proj too.
  mlp_bias: bool = False  # Llama mlp_bias=True: biases on gate, up and down.
  qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k (weights [head_dim]) before RoPE.
  # Scaled RoPE (llama3, linear, yarn): the [head_dim // 2] inverse frequencies, and the factor
  # on cos and sin (yarn's attention factor). Empty: theta ** (-2i / head_dim), factor 1.
  rope_inv_freq: tuple[float, ...] = dataclasses.field(default=(), repr=False)
  rope_attention_factor: float = 1.0
  # The HF rope_scaling those came from, as sorted (key, value) pairs: what an export writes.
  rope_scaling: tuple[tuple[str, Any], ...] = ()
  # Mistral's sliding window (0: none). specjax attends causally over the whole context, which
  # is the window's result only while every sequence fits in it: ``llama.check_context``.
  sliding_window: int = 0

  def __post_init__(self):
    for field in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "ffn_dim"):
      if getattr(self, field) <= 0:
        raise ValueError(f"ModelConfig.{field} must be > 0, got {getattr(self, field)}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
        f"({self.num_kv_heads}) for grouped-query attention."
      )
    if self.head_dim == 0:
      if self.dim % self.num_heads:
        raise ValueError(
          f"ModelConfig.dim ({self.dim}) is not divisible by num_heads ({self.num_heads}); "
          "set head_dim explicitly."
        )
      object.__setattr__(self, "head_dim", self.dim // self.num_heads)
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}.")
    # A config read back from JSON (an EAGLE head's metadata) holds a list: keep it hashable.
    object.__setattr__(self, "rope_inv_freq", tuple(float(f) for f in self.rope_inv_freq))
    object.__setattr__(self, "rope_scaling", tuple((str(k), v) for k, v in self.rope_scaling))
    if self.rope_inv_freq and len(self.rope_inv_freq) != self.head_dim // 2:
      raise ValueError(
        f"ModelConfig.rope_inv_freq has {len(self.rope_inv_freq)} frequencies; head_dim "
        f"{self.head_dim} needs {self.head_dim // 2}."
      )

  @property
  def groups(self) -> int:
    """Query heads per kv head."""
    return self.num_heads // self.num_kv_heads

  def num_params(self) -> int:
    d, f, hd = self.dim, self.ffn_dim, self.head_dim
    attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
    attn += self.out_bias * d
    mlp = 3 * d * f + self.mlp_bias * (2 * f + d)
    per_layer = attn + mlp + 2 * d + self.qk_norm * 2 * hd
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * per_layer + d + head
