"""Evaluation: generate a response for each row of a run's test (or validation) split, score it,
and write an eval directory that another process reproduces byte for byte (docs/eval.md).

Modules: ``layout`` (file names, eval ids), ``settings`` (the generation settings and what makes
an eval's identity), ``inputs`` (the run, its rows and data, checked; a capped eval's seeded
sample of rows), ``prompts`` (prompts encoded as training encoded them, and the rows cut to fit),
``evalfile`` (the format of
``eval.json`` and ``predictions.jsonl``: writer and reader), ``metrics`` (sacreBLEU, rouge-score),
``decode`` (batch-invariant generation), ``model`` (base model + adapter, checked against the
record), ``evaluate`` (one eval's life), ``compare`` (two evals), ``html`` (the report's tables),
``at_end`` (``eval.generate_at_end`` after a run, metrics to its MLflow run).

Importing this package never imports torch: ``compare`` and ``report`` read evals without it.
"""
