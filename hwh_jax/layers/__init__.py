"""Flax NNX layers: norms, RoPE, SwiGLU, FA heads, GDN heads and the head-wise mixer."""
