"""The eval's scores are sacreBLEU's and rouge-score's own numbers, with their configuration
recorded, and the same in any process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reprotune._errors import InputError
from reprotune._eval.metrics import CORPUS_METRICS, ROW_METRICS, score_rows

PREDICTIONS = ["The cat sat on the mat.", "", "hello there", "Paris is the capital of France"]
REFERENCES = ["The cat is on the mat.", "nothing", "hello there", "The capital of France is Paris."]
LENGTHS = [7, 1, 3, 8]


def test_corpus_scores_are_the_libraries_numbers() -> None:
    """BLEU and chrF are sacreBLEU's corpus scores (default settings); ROUGE is the mean of
    rouge-score's per-row F1 (stemmed); exact match and length are what they say."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scores = score_rows(PREDICTIONS, REFERENCES, LENGTHS)
    assert scores.metrics["bleu"] == sacrebleu.corpus_bleu(PREDICTIONS, [REFERENCES]).score
    assert scores.metrics["chrf"] == sacrebleu.corpus_chrf(PREDICTIONS, [REFERENCES]).score
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    for name in ("rouge1", "rouge2", "rougeL"):
        rows = [scorer.score(r, p)[name].fmeasure for p, r in zip(PREDICTIONS, REFERENCES, strict=True)]
        assert scores.metrics[name] == pytest.approx(sum(rows) / len(rows), abs=0, rel=1e-15)
    assert scores.metrics["exact_match"] == 0.25
    assert scores.metrics["mean_length"] == 4.75
    assert list(scores.metrics) == list(CORPUS_METRICS)
    assert all(set(row) == set(ROW_METRICS) for row in scores.rows)
    assert scores.rows[2]["exact_match"] == 1.0 and scores.rows[2]["bleu"] == pytest.approx(100.0)
    assert scores.rows[1] == {name: 0.0 for name in ROW_METRICS} | {"length": 1.0}


def test_signatures_and_versions_are_recorded() -> None:
    """The sacreBLEU signatures (BLEU, chrF, per-row BLEU) and library versions are recorded."""
    import sacrebleu

    config = score_rows(PREDICTIONS, REFERENCES, LENGTHS).config
    signature = f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert config["bleu_signature"] == signature
    assert config["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
    assert "eff:yes" in config["row_bleu_signature"]
    from importlib.metadata import version

    assert config["versions"] == {name: version(name) for name in ("sacrebleu", "rouge-score", "nltk")}
    assert config["versions"]["sacrebleu"] == sacrebleu.__version__
    assert config["rouge"]["use_stemmer"] is True


def test_scores_are_the_same_in_fresh_processes() -> None:
    """Two fresh processes with different hash seeds give the same scores, bit for bit."""
    code = (
        "import json; from reprotune._eval.metrics import score_rows; "
        f"s = score_rows({PREDICTIONS!r}, {REFERENCES!r}, {LENGTHS!r}); "
        "print(json.dumps([s.metrics, s.rows], sort_keys=True))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1")
    }
    assert len(outputs) == 1
    assert json.loads(outputs.pop())[0] == score_rows(PREDICTIONS, REFERENCES, LENGTHS).metrics


@pytest.mark.parametrize(("n_refs", "n_lengths"), [(3, 4), (4, 3)])
def test_mismatched_inputs_are_refused(n_refs: int, n_lengths: int) -> None:
    """One reference and one length per prediction, or an InputError."""
    with pytest.raises(InputError, match="cannot score"):
        score_rows(PREDICTIONS, REFERENCES[:n_refs], LENGTHS[:n_lengths])
