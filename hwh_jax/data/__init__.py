"""Input pipeline: text sources, tokenizers, packing into fixed-length sequences, Grain."""
