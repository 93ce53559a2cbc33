"""Integrations: reprotune's record, ledger and proof for training code reprotune did not write.

- :mod:`reprotune.integrations.transformers`: ``ReprotuneCallback``, for a Hugging Face
  ``Trainer`` or a TRL trainer (``SFTTrainer``): the run directory ``reprotune run`` writes
  (record, ledger, adapter, split manifest), so that ``compare``, ``report`` and
  ``verify --command`` read it unchanged. See docs/integrations.md.

Importing this package imports nothing heavy; importing ``reprotune.integrations.transformers``
imports transformers and torch, but none of reprotune's own training code.
"""
