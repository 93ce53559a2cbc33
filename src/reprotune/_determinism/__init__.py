"""Randomness and determinism: derived seeds, RNG state capture and restore, torch's determinism
flags, and the one place a device name is resolved."""
