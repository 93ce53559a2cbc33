"""Data: tables and their loaders, the builtin corpus, splits, the split manifest, check-split and
the data order. Never imports torch."""
