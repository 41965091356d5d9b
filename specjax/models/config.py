"""ModelConfig: the static, hashable description of a Llama-family decoder."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a Llama-family decoder (Llama, SmolLM2, Qwen2).

  Frozen and hashable: it is a static argument of every jitted function.
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

  @property
  def groups(self) -> int:
    """Query heads per kv head."""
    return self.num_heads // self.num_kv_heads

  def num_params(self) -> int:
    d, f, hd = self.dim, self.ffn_dim, self.head_dim
    attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
    per_layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * per_layer + d + head
