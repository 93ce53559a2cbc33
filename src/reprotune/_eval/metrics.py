"""Scores from well-kept libraries: sacreBLEU (BLEU, chrF) and rouge-score (ROUGE-1/2/L), plus
exact match and output length. Nothing here is hand-written scoring.

- Corpus BLEU and chrF: sacreBLEU's defaults (BLEU: 13a tokenizer, exp smoothing, mixed case;
  chrF2: 6 character n-grams, no word n-grams), each with its signature string recorded.
- Per-row BLEU: ``BLEU(effective_order=True).sentence_score`` (sacreBLEU's advice for single
  sentences); per-row chrF: ``sentence_score``.
- ROUGE: F1 of ``rouge1``, ``rouge2``, ``rougeL`` with Porter stemming, per row; the corpus value is
  the plain mean of the rows' F1 (rouge-score's bootstrap aggregator resamples with NumPy's
  global generator, so it is not used).
- exact match: the output and the reference equal after ``strip()`` (1.0 or 0.0; mean over rows).
- length: generated tokens per row, eos included; ``mean_length`` over rows.

Deterministic in any process (no hash seeds, no global random state). Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from reprotune._errors import InputError

#: The flat ``metrics`` mapping of an eval record: corpus metric name -> number.
CORPUS_METRICS: tuple[str, ...] = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "exact_match", "mean_length")
#: The per-row scores in ``predictions.jsonl``.
ROW_METRICS: tuple[str, ...] = ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "exact_match", "length")
_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@dataclass(frozen=True)
class Scores:
    """What :func:`score_rows` measured.

    Attributes:
        metrics: corpus metric name -> number (:data:`CORPUS_METRICS`).
        rows: per row, metric name -> number (:data:`ROW_METRICS`).
        config: how each metric was computed: sacreBLEU signatures, rouge settings, versions.
    """

    metrics: dict[str, float]
    rows: list[dict[str, float]]
    config: dict[str, Any]


def score_rows(predictions: Sequence[str], references: Sequence[str], lengths: Sequence[int]) -> Scores:
    """Score each prediction against its reference, and the whole set.

    Args:
        predictions: the generated texts.
        references: one reference text per prediction.
        lengths: generated tokens per prediction.

    Returns:
        The corpus metrics, per-row scores and the metric configuration.

    Raises:
        InputError: no rows, or the three sequences differ in length.
    """
    from rouge_score import rouge_scorer
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    if not predictions or not len(predictions) == len(references) == len(lengths):
        raise InputError(
            f"cannot score {len(predictions)} predictions against {len(references)} references "
            f"({len(lengths)} lengths)",
            fix="give one reference and one length per prediction, at least one row",
        )
    bleu, chrf, sentence_bleu = BLEU(), CHRF(), BLEU(effective_order=True)
    scorer = rouge_scorer.RougeScorer(list(_ROUGE_TYPES), use_stemmer=True)
    rows: list[dict[str, float]] = []
    for prediction, reference, length in zip(predictions, references, lengths, strict=True):
        rouge = scorer.score(reference, prediction)  # (target, prediction): the order matters
        rows.append(
            {
                "bleu": float(sentence_bleu.sentence_score(prediction, [reference]).score),
                "chrf": float(chrf.sentence_score(prediction, [reference]).score),
                # float(): rouge-score gives int 0 for an empty text
                **{name: float(rouge[name].fmeasure) for name in _ROUGE_TYPES},
                "exact_match": float(prediction.strip() == reference.strip()),
                "length": float(length),
            }
        )
    corpus_bleu = bleu.corpus_score(list(predictions), [list(references)])  # one reference stream
    corpus_chrf = chrf.corpus_score(list(predictions), [list(references)])
    n = len(rows)
    metrics = {
        "bleu": float(corpus_bleu.score),
        "chrf": float(corpus_chrf.score),
        **{name: math.fsum(r[name] for r in rows) / n for name in (*_ROUGE_TYPES, "exact_match")},
        "mean_length": math.fsum(r["length"] for r in rows) / n,
    }
    config = {
        # Signatures exist only once a score was computed.
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "row_bleu_signature": str(sentence_bleu.get_signature()),
        "rouge": {
            "types": list(_ROUGE_TYPES),
            "use_stemmer": True,
            "score": "fmeasure",
            "aggregate": "mean of the rows' F1",
        },
        "exact_match": "output.strip() == reference.strip()",
        "length": "generated tokens, eos included",
        "versions": {name: version(name) for name in ("sacrebleu", "rouge-score", "nltk")},
    }
    return Scores(metrics=metrics, rows=rows, config=config)
