"""Packing documents into fixed-length training sequences.

Documents are tokenised and concatenated into one stream with EOS after each document. The
stream is cut into consecutive, non-overlapping windows of ``seq_len + 1`` tokens, so every
token of an epoch lands in exactly one window; the last, partial window is padded (segment id 0,
loss-masked) rather than dropped. A window gives inputs = w[:-1], targets = w[1:], and for the
inputs a segment id (1, 2, ... for each document in the window; a new document starts after an
EOS) and the in-document position (restarting at 0 with each document).
"""

from __future__ import annotations

import numpy as np


def concat_documents(docs, eos_id: int) -> np.ndarray:
    """Token-id documents -> one uint32 stream with EOS after every document."""
    parts = []
    for d in docs:
        parts.append(np.asarray(d, np.uint32))
        parts.append(np.array([eos_id], np.uint32))
    return np.concatenate(parts) if parts else np.zeros((0,), np.uint32)


def segments_and_positions(window: np.ndarray, eos_id: int, valid: int):
    """Segment ids (1-based, 0 = padding) and in-document positions of a window's tokens."""
    is_eos = window == eos_id
    starts = np.concatenate([[0], is_eos[:-1].astype(np.int32)])
    seg = 1 + np.cumsum(starts)
    seg[valid:] = 0
    idx = np.arange(len(window))
    first = np.maximum.accumulate(np.where(np.concatenate([[True], starts[1:] > 0]), idx, 0))
    pos = idx - first
    pos[valid:] = 0
    return seg.astype(np.int32), pos.astype(np.int32)


class PackedSequences:
    """Random-access windows over a token stream (a Grain ``RandomAccessDataSource``)."""

    def __init__(self, stream: np.ndarray, seq_len: int, *, eos_id: int, pad_id: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if len(stream) < 2:
            raise ValueError(f"token stream too short ({len(stream)} tokens) to make a sequence")
        self.stream, self.seq_len, self.eos_id, self.pad_id = stream, seq_len, eos_id, pad_id
        self.window = seq_len + 1

    def __len__(self) -> int:
        return -(-len(self.stream) // self.window)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range [0, {len(self)})")
        w = self.stream[i * self.window : (i + 1) * self.window].astype(np.int32)
        valid = len(w)
        if valid < self.window:
            w = np.concatenate([w, np.full(self.window - valid, self.pad_id, np.int32)])
        seg, pos = segments_and_positions(w, self.eos_id, valid)
        return {
            "inputs": w[:-1],
            "targets": w[1:],
            "segment_ids": seg[:-1],
            "positions": pos[:-1],
            "loss_mask": (seg[1:] > 0).astype(np.float32),
            "index": np.int32(i),
        }

    def __repr__(self):
        return f"PackedSequences({len(self)} x {self.seq_len}, {len(self.stream)} tokens)"
