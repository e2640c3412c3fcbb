"""Configuration of hwh-jax's language models in PyTorch (``transformers``, remote code).

One layer holds ``num_fa`` softmax-attention heads (RoPE or NoPE, an optional sliding window)
beside ``num_la`` linear-attention heads of one kind (``la_kind``); ``layers`` lists every
layer's allocation, so a Transformer, a pure linear-attention model, a layer-wise hybrid and a
head-wise hybrid (HwH) are one class. Written by ``python -m launch.export_hf`` of hwh-jax
beside ``modeling_hwh.py``; the fields are the JAX model's ``ModelConfig``'s.
"""

from transformers import PretrainedConfig

LA_KINDS = ("gdn", "deltanet", "lightning", "retnet")


class HwhConfig(PretrainedConfig):
    """Sizes and the per-layer head allocation of an hwh-jax model.

    ``layers``: one dict a layer, ``{"num_fa": int, "num_la": int, "fa_rope": bool, "window":
    int or None}``. ``intermediate_size`` 0: blocks without an MLP. ``rope_base`` and
    ``rope_freq_scaling`` (Llama 3.1's "llama3" scaling or None) set the RoPE frequencies;
    ``rope_pairing`` "half" rotates dims (r, r + D/2), "interleaved" (2r, 2r + 1).
    ``abs_positions`` > 0: learned absolute positions for that many tokens. ``la_backend``
    "auto" runs the linear heads' sequences through fla's kernels on a CUDA device where fla is
    installed (``pip install flash-linear-attention``), "torch" always through the pure-PyTorch
    chunked form.
    """

    model_type = "hwh"

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        head_dim: int = 64,
        layers: list | None = None,
        q_per_kv: int = 1,
        qk_norm: bool = False,
        rope_base: float = 10000.0,
        rope_pairing: str = "half",
        rope_freq_scaling: dict | None = None,
        la_kind: str = "gdn",
        la_key_dim: int = 64,
        la_value_dim: int = 64,
        la_short_conv: bool = False,
        conv_size: int = 4,
        la_chunk_size: int = 64,
        la_backend: str = "auto",
        rms_norm_eps: float = 1e-6,
        abs_positions: int = 0,
        max_position_embeddings: int = 2048,
        tie_word_embeddings: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.head_dim = head_dim
        self.layers = [dict(layer) for layer in (layers or [])]
        self.num_hidden_layers = len(self.layers)
        self.q_per_kv = q_per_kv
        self.qk_norm = qk_norm
        self.rope_base = rope_base
        self.rope_pairing = rope_pairing
        self.rope_freq_scaling = rope_freq_scaling
        self.la_kind = la_kind
        self.la_key_dim = la_key_dim
        self.la_value_dim = la_value_dim
        self.la_short_conv = la_short_conv
        self.conv_size = conv_size
        self.la_chunk_size = la_chunk_size
        self.la_backend = la_backend
        self.rms_norm_eps = rms_norm_eps
        self.abs_positions = abs_positions
        self.max_position_embeddings = max_position_embeddings
        if la_kind not in LA_KINDS:
            raise ValueError(f"la_kind={la_kind!r}: this modeling file has {LA_KINDS}")
        if la_backend not in ("auto", "torch"):
            raise ValueError(f"la_backend={la_backend!r}: 'auto' (fla on CUDA where installed) or 'torch'")
        if rope_pairing not in ("half", "interleaved"):
            raise ValueError(f"rope_pairing={rope_pairing!r}: 'half' or 'interleaved'")
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
