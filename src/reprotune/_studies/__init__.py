"""Seed studies: many runs of one config that differ only in their seeds, and what they say.

``plan`` (the seed rule), ``layout`` (the study directory's files), ``directory`` (opening it, and
putting it back when refused), ``execute`` (runs, resumes, verifies), ``metrics`` (what the runs
measured, named across them), ``stats`` (summaries, bootstrap intervals, variance shares),
``studyfile`` (``study.json``), ``study`` (a study's life), ``significance`` (two studies:
beyond seed noise or not), ``tracking`` (MLflow parent and child runs), ``report`` and ``svg``
(the HTML). Only ``execute`` and ``study`` import the training code (and so torch).
"""
