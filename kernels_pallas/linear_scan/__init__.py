"""The chunked scan that gated linear recurrences share, as Pallas kernels (no op of its own).

  scan.py     sequential over chunks, forward and backward, and the per-chunk gradients through
              the state: Gated DeltaNet's inter-chunk pass, and with w = 0, u = v the whole of
              linear attention with a scalar decay (Lightning, RetNet, Mamba-2)
  common.py   launch settings and layouts ("triton", "tpu"), matmul helpers, the per-chunk
              launcher, padding, chunk-local cumulative sums

Used by ``kernels_pallas.gdn`` and ``kernels_pallas.decay_attention``, which stay independent
of each other.
"""
