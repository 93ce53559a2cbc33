"""Base models: loading (local, HF cache, builtin), the builtin GGUF conversion, file identity,
LoRA through PEFT, and the tiny test model."""
