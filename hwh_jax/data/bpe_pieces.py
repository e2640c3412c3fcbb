r"""GPT-2's pre-tokenizer as array operations, and a table of the pieces' ids: the fast path of
``tokenizers.GPT2BPE``.

GPT-2 splits text into pieces with one regex,
``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``, and encodes
each piece by BPE on its own. Read left to right, the regex's pieces are:

- the runs of one class (letters, numbers, white space, anything else), each a piece;
- but a white-space run that other text follows leaves its last character to the next piece:
  a space (U+0020) joins the text after it (" word"), any other white space is a piece alone;
- an apostrophe that starts a piece and is followed by ``s t m d`` or ``re ve ll`` is a piece
  with those letters ("'s", "'ll"); the letters after them start a new piece.

``piece_starts`` finds where every piece starts with a few passes of NumPy over the code
points (the classes read from tiktoken's own regex engine, so both agree on every character),
and ``PieceTable`` keeps the ids of every piece seen before, keyed by its UTF-8 bytes (pieces
of up to 15 bytes: nearly all of them in prose), in an open-addressing hash table looked up for
all pieces of a text at once. Pieces not in the table are encoded by tiktoken itself (all of
a batch's new pieces in one call, a newline between each), so the ids are tiktoken's by
construction; tests compare both on random text over every class and on the shipped corpora.
"""

from __future__ import annotations

import functools

import numpy as np

_OTHER, _LETTER, _NUMBER, _SPACE = 0, 1, 2, 3
_APOSTROPHE, _BLANK = 0x27, 0x20
_TWO = np.zeros(128, bool)  # 's 't 'm 'd
_TWO[[ord(c) for c in "stmd"]] = True
_MAX_BYTES = 15  # a key: 15 bytes of piece and its length
_MUL1, _MUL2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
_LOW = np.array([(1 << (8 * n)) - 1 if n < 8 else (1 << 64) - 1 for n in range(16)], np.uint64)
_ID_BITS, _ID_MASK = 20, (1 << 20) - 1  # a table value: id | count << 20 | offset << 24
_HIGH = np.array([0 if n <= 8 else (1 << (8 * (n - 8))) - 1 for n in range(16)], np.uint64)


@functools.cache
def character_classes() -> np.ndarray:
    r"""[0x110000] uint8: each code point's class under tiktoken's regex engine (letter \p{L},
    number \p{N}, white space \s, other), read off the engine itself (about 0.5 s, once a
    process)."""
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)}
    chars = "".join(map(chr, (*range(0xD800), *range(0xE000, 0x110000))))
    table = np.zeros(0x110000, np.uint8)
    for cls, pattern in ((_LETTER, r"\p{L}"), (_NUMBER, r"\p{N}"), (_SPACE, r"\s")):
        enc = tiktoken.Encoding(
            f"class_{cls}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
        hits = enc.decode_bytes(enc.encode_ordinary(chars)).decode("utf-8")
        table[np.frombuffer(hits.encode("utf-32-le"), np.uint32)] = cls
    return table


def piece_starts(code: np.ndarray, doc_starts: np.ndarray) -> np.ndarray:
    """[n] bool: where GPT-2's regex starts a piece in the code points ``code`` of documents
    laid end to end (``doc_starts``: each non-empty document's first index; a piece never
    crosses from one document to the next)."""
    n = len(code)
    cls = np.take(character_classes(), code)
    start = np.empty(n, bool)
    start[0] = True
    np.not_equal(cls[1:], cls[:-1], out=start[1:])
    start[doc_starts] = True
    new_doc = np.zeros(n + 2, bool)  # [i]: i starts a document or is past the end
    new_doc[doc_starts] = True
    new_doc[n:] = True
    # a white-space run that other text of its document follows: its last character starts a
    # piece, and a space there joins the text after it
    space = cls == _SPACE
    run_end = space[:-1] & ~space[1:] & ~new_doc[1:n]  # [i]: i ends such a run
    start[:-1] |= run_end
    start[1:] &= ~(run_end & (code[:-1] == _BLANK))
    # contractions: an apostrophe that starts a piece, then s t m d, or re ve ll
    p = np.flatnonzero(code == _APOSTROPHE)
    p = p[start[p] & ~new_doc[p + 1]]
    if len(p):
        c1 = code[p + 1]
        has2 = ~new_doc[p + 2]
        c2 = np.where(has2, code[np.minimum(p + 2, n - 1)], 0)
        two = (c1 < 128) & _TWO[np.minimum(c1, 127)]
        three = has2 & (
            (((c1 == ord("r")) | (c1 == ord("v"))) & (c2 == ord("e")))
            | ((c1 == ord("l")) & (c2 == ord("l")))
        )
        k = np.where(two, 2, np.where(three, 3, 0))
        p, k = p[k > 0], k[k > 0]
        start[p + 1] = False
        start[p[k == 3] + 2] = False
        after = p + k
        start[after[after < n]] = True
    return start


class PieceTable:
    """Piece bytes (up to 15) -> their BPE ids, for every piece of a text at once.

    An open-addressing hash table over two uint64 keys (the piece's bytes, zero-padded, with
    its length in the last byte: exact, no two pieces share a key), linear probing, all
    lookups of a text as one vectorised probe loop. A slot is one row of 32 bytes (key, value
    and a scratch word), so a probe touches one cache line. New pieces are encoded by the
    tiktoken Encoding ``enc`` (GPT-2's regex): all pieces holding more than white space in one
    call, a newline between each (a newline is a piece of its own there and no such piece's ids
    hold its id), white-space pieces one by one. Cleared when it would hold more than
    ``max_entries`` pieces (memory stays bounded on any corpus)."""

    def __init__(self, enc, *, max_entries: int = 1 << 20, min_bits: int = 16):
        self.enc = enc
        (self.newline,) = enc.encode_ordinary("\n")
        self.max_entries, self.min_bits = max_entries, min_bits
        self._reset()

    def _reset(self):
        self.bits, self.used = self.min_bits, 0
        self._alloc()
        self.ids = np.zeros(0, np.uint32)  # every entry's ids, laid end to end

    def _alloc(self):
        # each slot: k1, k2 (never 0 in a key: 0 marks an empty slot), the value (first id |
        # count << 20 | offset << 24), and a scratch word for insertion
        self.rows = np.zeros((1 << self.bits, 4), np.uint64)

    def _slots(self, k1, k2):
        return ((k1 * _MUL1 ^ k2 * _MUL2) >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(self, k1, k2):
        """Each key's (slot, value, found): its own slot and value, or the empty slot where it
        would go (value 0, found False)."""
        slots, mask = self._slots(k1, k2), (1 << self.bits) - 1
        r = np.take(self.rows, slots, axis=0)
        found = (r[:, 1] == k2) & (r[:, 0] == k1)
        vals = r[:, 2].copy()
        todo = np.flatnonzero(~found & (r[:, 1] != 0))
        while len(todo):
            slots[todo] = s = (slots[todo] + 1) & mask
            r = np.take(self.rows, s, axis=0)
            hit = (r[:, 1] == k2[todo]) & (r[:, 0] == k1[todo])
            found[todo], vals[todo] = hit, r[:, 2]
            todo = todo[~hit & (r[:, 1] != 0)]
        return slots, vals, found

    def _put(self, k1, k2, vals):
        """Insert distinct keys not in the table."""
        slots, mask = self._slots(k1, k2), (1 << self.bits) - 1
        todo = np.arange(len(k1))
        placed = np.zeros(len(k1), bool)
        tag = np.arange(1, len(k1) + 1, dtype=np.uint64)
        while len(todo):
            free = todo[np.take(self.rows, slots[todo], axis=0)[:, 1] == 0]
            s = slots[free]
            self.rows[s, 3] = tag[free]  # keys that meet at a slot: one tag stays
            won = free[self.rows[s, 3] == tag[free]]
            self.rows[slots[won], :3] = np.stack([k1[won], k2[won], vals[won]], 1)
            placed[won] = True
            todo = todo[~placed[todo]]
            slots[todo] = (slots[todo] + 1) & mask

    @staticmethod
    def fields(vals):
        """(first id, count, offset into ``ids``) of table values."""
        vals = vals.view(np.int64)
        return vals & _ID_MASK, (vals >> _ID_BITS) & 15, vals >> (_ID_BITS + 4)

    def make_room(self, count: int) -> bool:
        """Clear the table if ``count`` more entries would pass ``max_entries``; whether it
        did (slots found before are then void)."""
        if self.used + count <= self.max_entries or not self.used:
            return False
        self._reset()
        return True

    def encode_piece(self, piece: bytes) -> list[int]:
        return self.enc._core_bpe.encode_single_piece(piece)

    def _encode(self, rows: np.ndarray, spacey: np.ndarray):
        """Each piece's ids (tiktoken's BPE of one piece) from its key ``rows`` ([n, 16] uint8:
        the bytes, zero-padded, the length last): [n] counts, and their ids laid end to end."""
        lengths = rows[:, 15].astype(np.int64)
        words = np.flatnonzero(~spacey)
        text = rows[words].copy()  # each piece then a newline, laid end to end
        text[np.arange(len(words)), lengths[words]] = ord("\n")
        keep = np.arange(16) <= lengths[words, None]
        joined = self.enc.encode_to_numpy(
            text[keep].tobytes().decode("utf-8"), disallowed_special=()
        )
        cuts = np.flatnonzero(joined == self.newline)
        alone = np.flatnonzero(spacey)
        if len(cuts) != len(words):  # not expected (see the class): one by one
            alone, words = np.arange(len(rows)), words[:0]
        counts = np.zeros(len(rows), np.int64)
        if len(words):
            counts[words] = np.diff(cuts, prepend=-1) - 1
        by_one = {i: self.encode_piece(rows[i, : lengths[i]].tobytes()) for i in alone.tolist()}
        for i, got in by_one.items():
            counts[i] = len(got)
        ends = np.cumsum(counts)
        flat = np.empty(int(ends[-1]) if len(ends) else 0, np.uint32)
        if len(words):
            is_word = np.zeros(len(rows), bool)
            is_word[words] = True
            flat[np.repeat(is_word, counts)] = joined[joined != self.newline]
        for i, got in by_one.items():
            flat[ends[i] - len(got) : ends[i]] = got
        return counts, flat

    def add(self, k1: np.ndarray, k2: np.ndarray, spacey: np.ndarray):
        """Encode and insert pieces by their keys (distinct, not in the table; ``spacey``: which
        are white space only)."""
        cnt, flat = self._encode(np.stack([k1, k2], 1).view(np.uint8), spacey)
        off = len(self.ids) + np.cumsum(cnt) - cnt
        if len(flat) and flat.max() > _ID_MASK:
            raise ValueError(f"bpe_pieces: token id {flat.max()} needs more than {_ID_BITS} bits")
        vals = (
            flat[np.minimum(off - len(self.ids), len(flat) - 1)].astype(np.int64)
            | (cnt << _ID_BITS)
            | (off << (_ID_BITS + 4))
        ).astype(np.uint64)
        self.ids = np.concatenate([self.ids, flat])
        if (self.used + len(k1)) * 2 > (1 << self.bits):  # keep the load under a half
            old = self.rows[self.rows[:, 1] != 0]
            kept = old[:, 0], old[:, 1], old[:, 2]
            while (self.used + len(k1)) * 2 > (1 << self.bits):
                self.bits += 1
            self._alloc()
            self._put(*kept)
        self._put(k1, k2, vals)
        self.used += len(k1)


def _distinct(k1: np.ndarray, k2: np.ndarray) -> np.ndarray:
    """The index of one occurrence of each distinct key (k1, k2): keys sorted by a 64-bit mix
    of both words (one integer sort), their equality checked after; should two keys share a mix,
    by a sort of both words."""
    mix = k1 * _MUL1 ^ k2 * _MUL2
    order = np.argsort(mix)
    sorted_mix = mix[order]
    head = np.empty(len(mix), bool)
    head[:1] = True
    np.not_equal(sorted_mix[1:], sorted_mix[:-1], out=head[1:])
    rep = order[head][np.cumsum(head) - 1]  # each key's group's first key
    if (k1[rep] == k1[order]).all() and (k2[rep] == k2[order]).all():
        return order[head]
    return np.unique(np.stack([k1, k2], 1).view("V16").ravel(), return_index=True)[1]


def _widen(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    out = np.zeros(len(where), values.dtype)
    out[where] = values
    return out


def keys_of(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """The table keys (k1, k2) of the pieces buf[starts : starts + lengths] (lengths <= 15;
    ``buf`` uint8 with 16 bytes of padding at its end)."""
    windows = np.ndarray((len(buf) - 15,), "V16", buffer=buf, strides=(1,))  # 16 bytes from each
    keys = windows[starts].view(np.uint64).reshape(-1, 2)
    k1 = keys[:, 0] & _LOW[lengths]
    k2 = (keys[:, 1] & _HIGH[lengths]) | (lengths.astype(np.uint64) << np.uint64(56))
    return k1, k2


def encode_documents(
    texts: list[str], table: PieceTable, *, group_chars: int = 1 << 18
) -> list[np.ndarray]:
    """Each text's GPT-2 BPE ids (uint32). Texts are encoded in groups of about
    ``group_chars`` characters laid end to end (arrays that stay in the CPU's caches); a longer
    text is cut where no piece crosses the cut (``_cuts``). Texts must hold no lone surrogates
    (``str.encode`` refuses them)."""
    parts, owner = [], []  # the groups' texts and the text each came from
    for i, text in enumerate(texts):
        prev = 0
        for cut in _cuts(text, group_chars):
            parts.append(text[prev:cut])
            owner.append(i)
            prev = cut
        parts.append(text[prev:])
        owner.append(i)
    encoded, group, size = [], [], 0
    for part in parts:
        group.append(part)
        size += len(part)
        if size >= group_chars:
            encoded += _encode_group(group, table)
            group, size = [], 0
    encoded += _encode_group(group, table)
    out = [[] for _ in texts]
    for i, ids in zip(owner, encoded):
        out[i].append(ids)
    return [ids[0] if len(ids) == 1 else np.concatenate(ids) for ids in out]


def _cuts(text: str, every: int) -> list[int]:
    """Places about ``every`` characters apart where ``text`` can be cut without changing its
    pieces: before a newline that follows a character neither white space nor an apostrophe
    (a piece starts there, no white-space run or contraction reaches across it)."""
    cuts, at = [], every
    while at < len(text):
        at = text.find("\n", at)
        if at < 0:
            break
        if not (text[at - 1] == "'" or _is_space(text[at - 1])):
            cuts.append(at)
            at += every
        else:
            at += 1
    return cuts


def _is_space(char: str) -> bool:
    return character_classes()[ord(char)] == _SPACE


def _encode_group(texts: list[str], table: PieceTable) -> list[np.ndarray]:
    """``encode_documents`` of texts that together are one group."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    joined = "".join(texts)
    out = [np.zeros(0, np.uint32)] * len(texts)
    if not joined:
        return out
    code = np.frombuffer(joined.encode("utf-32-le"), np.uint32)
    first = np.cumsum(lengths) - lengths
    full = np.flatnonzero(lengths)
    a = np.flatnonzero(piece_starts(code, first[full]))  # pieces' first characters
    raw = joined.encode("utf-8")
    buf = np.frombuffer(raw + bytes(16), np.uint8)
    ba = a  # ... as byte offsets in raw
    if not joined.isascii():  # after each character of 2, 3 or 4 UTF-8 bytes: 1, 2, 3 more
        wide = np.flatnonzero(code >= 0x80)
        cw = code[wide]
        more = np.zeros(len(a) + 1, np.int64)
        np.add.at(more, np.searchsorted(a, wide, side="right"), 1 + (cw >= 0x800) + (cw >= 0x10000))
        ba = a + np.cumsum(more[:-1])
    blen = np.diff(ba, append=len(raw))
    short = blen <= _MAX_BYTES
    every = short.all()
    sa, sl = (ba, blen) if every else (ba[short], blen[short])
    k1, k2 = keys_of(buf, sa, sl)
    _, vals, found = table.find(k1, k2)
    for _ in range(2):  # a second round only if the table was cleared to make room
        m = np.flatnonzero(~found)
        if not len(m):
            break
        one = _distinct(k1[m], k2[m])
        if table.make_room(len(one)):
            _, vals, found = table.find(k1, k2)
            continue
        new = m[one]
        piece_end = np.append(a[1:], len(code))[new if every else np.flatnonzero(short)[new]] - 1
        spacey = character_classes()[code[piece_end]] == _SPACE
        table.add(k1[new], k2[new], spacey)
        _, vals[m], found[m] = table.find(k1[m], k2[m])
    if not every:
        vals = _widen(vals, short)
    first_id, cnt, off = table.fields(vals)
    more = np.flatnonzero(cnt > 1)  # pieces of the table with further ids
    long_ids = {}
    for j in np.flatnonzero(~short).tolist():  # pieces over 15 bytes
        long_ids[j] = table.encode_piece(raw[ba[j] : ba[j] + blen[j]])
        cnt[j] = len(long_ids[j])
    ends = np.cumsum(cnt)
    ids = np.repeat(first_id.astype(np.uint32), cnt)  # then the further ids of longer ones
    if len(more):
        extra = cnt[more] - 1  # each further id: its piece and rank
        piece = np.repeat(more, extra)
        rank = np.arange(len(piece)) - np.repeat(np.cumsum(extra) - extra, extra) + 1
        at = ends[piece] - cnt[piece] + rank
        ids[at] = table.ids[off[piece] + rank]
    for j, got in long_ids.items():
        ids[ends[j] - len(got) : ends[j]] = got
    # each text's tokens: from its first piece's on (a text's first character starts a piece)
    bounds = np.concatenate([[0], ends])[np.searchsorted(a, first[full])]
    for d, part in zip(full.tolist(), np.split(ids, bounds[1:])):
        out[d] = part
    return out
