"""The HTML reports of a study and of a significance test: self-contained, and drawn by a browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic import write_study_dir

from reprotune._studies.report import render_study, write_significance_report
from reprotune._studies.significance import significance
from reprotune._studies.studyfile import load_study

CHROMIUM = Path("/usr/bin/chromium")


def test_study_report_each(tmp_path: Path) -> None:
    """A --vary each study: one strip plot (a column per source, a dot per run), the shares line and
    bar chart, values escaped, nothing outside the file."""
    groups = {"split": [1.0, 1.2], "data_order": [1.0, 1.1], "lora_init": [1.0, 1.05], "dropout": [1.0, 1.0]}
    study = load_study(write_study_dir(tmp_path / "s", groups, vary="each"))
    html = render_study(study)
    assert html.count("<svg") == 2 and html.count("<circle") == 8 and html.count("<rect") == 4
    shares = "Share of the variance: split: 76%, data order: 19%, LoRA init: 5%, dropout: 0%."
    assert shares in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert render_study(study) == html  # the same study, the same bytes


@pytest.mark.browser
def test_significance_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Headless Chromium lays out the report's chart with a real size and shows the verdict."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/test.sh does this)")
    a = write_study_dir(tmp_path / "a", [5.0, 5.02, 4.98])
    b = write_study_dir(
        tmp_path / "b", [4.9, 4.92, 4.88], config={"seed": {"root": 1}, "train": {"max_steps": 50}}
    )
    out = write_significance_report(significance(a, b), load_study(a), load_study(b), tmp_path / "sig.html")
    probe = (
        "<script>window.addEventListener('load', () => {"
        "const box = document.querySelector('svg').getBoundingClientRect();"
        "document.body.setAttribute('data-probe', Math.round(box.width) + 'x' + Math.round(box.height));"
        "});</script>"
    )
    page = tmp_path / "probe.html"
    page.write_text(out.read_text(encoding="utf-8").replace("</body>", probe + "</body>"), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r'data-probe="640x300"', proc.stdout), proc.stdout[:2000]
    assert "beyond seed noise" in proc.stdout
