"""Hugging Face checkpoints, both ways: ``load`` reads Qwen3 / Llama 3.x safetensors folders
into ``HybridLM``; ``export`` writes a trained run as a folder ``transformers`` loads (Llama
form, or the project's own with ``modeling/``'s PyTorch code as remote code) and reads such a
folder back. ``modeling/`` is PyTorch, copied into an exported folder, never imported here."""
