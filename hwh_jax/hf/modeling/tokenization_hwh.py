"""A SentencePiece model as a ``transformers`` tokenizer that gives the ids SentencePiece itself
gives (remote code: ``AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)``).

transformers' own conversion of a ``.model`` into a fast tokenizer splits runs of spaces and
newlines otherwise than SentencePiece does, so a model trained on SentencePiece's ids would be
fed other ids. This class calls the ``sentencepiece`` library for every encode and decode.
Written by hwh-jax's ``launch.export_hf`` beside ``tokenizer.model``.
"""

import os
import shutil

from transformers import PreTrainedTokenizer


class HwhSentencePieceTokenizer(PreTrainedTokenizer):
    """Encode and decode with the SentencePiece model in ``vocab_file``; no BOS or EOS added."""

    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        import sentencepiece as spm

        self.vocab_file = vocab_file
        self.sp = spm.SentencePieceProcessor(model_file=vocab_file)
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def get_vocab(self) -> dict:
        return {self.sp.id_to_piece(i): i for i in range(self.vocab_size)}

    def _tokenize(self, text, **kwargs):
        return self.sp.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        return self.sp.piece_to_id(token)

    def _convert_id_to_token(self, index):
        return self.sp.id_to_piece(index)

    def convert_tokens_to_string(self, tokens) -> str:
        """SentencePiece's decoding, but the special tokens (SentencePiece's control pieces,
        which it decodes to nothing) kept as their text, as transformers' tokenizers keep them
        (lm-eval's ``hf`` model stops generating at the decoded end-of-text token: an empty one
        would stop every generation after its first token)."""
        out, run = [], []
        for token in tokens:
            if self.sp.is_control(self.sp.piece_to_id(token)):
                out.append(self.sp.decode_pieces(run) + token)
                run = []
            else:
                run.append(token)
        return "".join(out) + self.sp.decode_pieces(run)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        name = (filename_prefix + "-" if filename_prefix else "") + "tokenizer.model"
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
