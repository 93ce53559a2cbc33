"""Training: the setup, the loop and its step hooks, batches, the loss, the optimizer, and the
life of a run from ``reprotune run`` to ``record.json``."""
