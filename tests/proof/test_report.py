"""write_report: one self-contained HTML file, curves embedded, differences tabled and escaped."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from reprotune._errors import InputError
from reprotune._proof.report import write_report
from rundirs import RunSpec, two_eval_sets, write_run_dir

CHROMIUM = Path("/usr/bin/chromium")
_SVG = re.compile(r"<figure><svg [^>]*>(.*?)</svg>", re.S)


def _write_verification(
    directory: Path, *, verdict: str, mode: str, reference: Path | str, legs: list[dict[str, Any]]
) -> None:
    """A verification.json of the current schema (5) in ``directory``."""
    data = {"schema": "reprotune/verification", "schema_version": 5, "verdict": verdict, "mode": mode}
    (directory / "verification.json").write_text(
        json.dumps({**data, "reference": str(reference), "legs": legs})
    )


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    """A reference, a run with another seed, and a run whose numbers part at step 7."""
    return [
        write_run_dir(tmp_path / "ref"),
        write_run_dir(tmp_path / "seed43", RunSpec(seed=43)),
        write_run_dir(
            tmp_path / "noisy", RunSpec(noise_from_step=7, environment={"torch": {"num_threads": 4}})
        ),
    ]


def test_self_contained_with_two_plots(runs: list[Path], tmp_path: Path) -> None:
    """The report draws two inline SVG charts (one line per run, the divergences marked) and
    refers to nothing outside itself."""
    out = write_report(runs, tmp_path / "report.html")
    html = out.read_text(encoding="utf-8")
    charts = _SVG.findall(html)
    assert len(charts) == 2
    train, val = charts
    for label in ("A (ref)", "B (seed43)", "C (noisy)"):
        assert f"<title>{label}</title></polyline>" in train
    assert "C parts from A at step 7" in train and "B parts from A at step 0" in train
    assert train.count("<polyline") == 3 and val.count("<polyline") == 3
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert "src=" not in html and "<img" not in html  # no source of any kind


def test_divergence_marked_and_differences_tabled(runs: list[Path], tmp_path: Path) -> None:
    """Each run's divergence step is marked; verdicts, causes and differences are in the page."""
    html = write_report(runs, tmp_path / "report.html").read_text(encoding="utf-8")
    marks = "B (seed43) parts from A (ref) at step 0, C (noisy) parts from A (ref) at step 7"
    assert f"dashed vertical lines: {marks}" in html
    assert html.count('<span class="verdict DIVERGED">DIVERGED</span>') == 4  # at a glance, and below
    assert "root seed 42 vs 43" in html
    # The verdict and the first cause come first, before the runs table, the plots and the details.
    glance = html[: html.index("<h2>Runs</h2>")]
    assert '<span class="verdict DIVERGED">DIVERGED</span> from step 7: numbers differ from step 7' in glance
    assert "numbers differ from step 7 with identical data order: torch.num_threads 2 vs 4" in html
    assert "<td>environment.torch.num_threads</td>" in html


def test_values_are_escaped(tmp_path: Path) -> None:
    """Recorded values reach the page escaped, never as markup."""
    ref = write_run_dir(tmp_path / "ref")
    odd = write_run_dir(tmp_path / "odd", RunSpec(config={"data": {"path": "<script>alert(1)</script>&"}}))
    html = write_report([ref, odd], tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in html
    assert "&quot;&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;" in html


def test_single_run(tmp_path: Path) -> None:
    """A report on one run has its plots and says there is nothing to compare."""
    html = write_report([write_run_dir(tmp_path / "ref")], tmp_path / "one.html").read_text(encoding="utf-8")
    assert len(_SVG.findall(html)) == 2
    assert "One run: nothing to compare." in html


def test_same_runs_same_bytes(runs: list[Path], tmp_path: Path) -> None:
    """Two reports on the same runs are byte for byte equal; no temporary file is left behind."""
    first = write_report(runs, tmp_path / "out" / "a.html").read_bytes()
    second = write_report(runs, tmp_path / "out" / "b.html").read_bytes()
    assert first == second
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.html", "b.html"]


def test_no_runs_is_bad_input(tmp_path: Path) -> None:
    """No run directory given is bad input."""
    with pytest.raises(InputError, match="no run directory given"):
        write_report([], tmp_path / "r.html")


def test_out_is_directory(runs: list[Path], tmp_path: Path) -> None:
    """An output path that is a directory is bad input."""
    with pytest.raises(InputError, match="is a directory"):
        write_report(runs, tmp_path)


@pytest.mark.browser
def test_renders_in_headless_chromium(runs: list[Path], tmp_path: Path) -> None:
    """Headless Chromium loads the report and lays out both charts at their size."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium with "
            "`sudo apt-get update && sudo apt-get install -y chromium` (scripts/test.sh does this)"
        )
    html = write_report(runs, tmp_path / "report.html").read_text(encoding="utf-8")
    # The check runs in the page, after load: each image must be decoded with a real width.
    probe = (
        "<script>window.addEventListener('load', () => {"
        "const svgs = [...document.querySelectorAll('figure > svg')];"
        "const boxes = svgs.map(s => s.getBoundingClientRect());"
        "const ok = boxes.filter(b => b.width > 0 && b.height > 0);"
        "const lines = svgs.map(s => s.querySelectorAll('polyline').length);"
        "document.body.setAttribute('data-probe', ok.length + '/' + svgs.length + ' w=' +"
        " boxes.map(b => Math.round(b.width)).join(',') + ' lines=' + lines.join(','));"
        "});</script>"
    )
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", probe + "</body>"), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
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
    match = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert match is not None, proc.stdout[:2000]
    # Laid out at the page's width (headless Chromium's window is narrower than the charts' 900).
    probe_match = re.fullmatch(r"2/2 w=(\d+),(\d+) lines=3,3", match.group(1))
    assert probe_match is not None, match.group(1)
    assert all(600 <= int(w) <= 900 for w in probe_match.groups()), match.group(1)


def test_the_glance_of_an_incomparable_pair_says_why_first(tmp_path: Path) -> None:
    """INCOMPARABLE at a glance names what makes the runs other experiments (it showed the first
    cause, here the seed, as if they were one experiment that parted)."""
    ref = write_run_dir(tmp_path / "ref")
    other = write_run_dir(tmp_path / "longer", RunSpec(seed=43, steps=16))
    html = write_report([ref, other], tmp_path / "report.html").read_text(encoding="utf-8")
    glance = html[: html.index("<h2>Runs</h2>")]
    assert '<span class="verdict INCOMPARABLE">INCOMPARABLE</span>' in glance
    assert ": different training length: run A has 12 steps" in glance
    assert "root seed" not in glance


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"verdict": "PASS",', "verification is not valid JSON: "),
        ('{"schema": "reprotune/record", "schema_version": 1}', "schema is 'reprotune/record'"),
        ('{"schema": "reprotune/verification", "schema_version": 9}', "schema_version 9 is not supported"),
        ('{"schema": "reprotune/command-verification", "schema_version": 7}', "schema_version 7 is not"),
    ],
)
def test_a_damaged_or_foreign_verification_is_refused_with_its_file(
    runs: list[Path], tmp_path: Path, content: str, message: str
) -> None:
    """A verification directory whose verification.json is cut, of another schema or of a version
    this reprotune does not read is refused naming the file (exit 2 from the CLI), not rendered
    from whatever keys it happens to hold; no page is written."""
    from reprotune._cli import main

    directory = tmp_path / "ver"
    directory.mkdir()
    (directory / "verification.json").write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(message)) as refused:
        write_report([directory], tmp_path / "page.html")
    assert str(directory / "verification.json") in refused.value.source
    assert main(["report", str(directory), "-o", str(tmp_path / "page.html")]) == 2
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize(
    ("file", "edit", "said"),
    [
        ("verification.json", {"wall_s": "abc"}, "wall_s"),
        ("verification.json", {"legs": [{"verdict": "IDENTICAL"}]}, "legs[0].name: field required"),
        ("verification.json", {"legs": {"rerun": {}}}, "legs"),
        ("verification.json", {"reference": 5}, "reference"),
        ("rerun.json", {"tolerance": "1e-3"}, "tolerance"),
        ("rerun.json", {"code_drift_allowed": "yes"}, "code_drift_allowed"),
        ("rerun.json", {"code_drift": "code.commit"}, "code_drift"),
    ],
    ids=[
        "wall-s",
        "leg-without-name",
        "legs-object",
        "reference-number",
        "tolerance-string",
        "drift-allowed-string",
        "drift-not-a-list",
    ],
)
def test_a_proof_file_whose_fields_have_other_types_is_refused_naming_the_key(
    runs: list[Path], tmp_path: Path, file: str, edit: dict[str, object], said: str
) -> None:
    """A verification.json or rerun.json edited by hand: exit 2 naming the key (before, a
    ValueError, KeyError or TypeError traceback half-way through the page, exit 1)."""
    from reprotune._cli import main

    directory = tmp_path / "proof"
    directory.mkdir()
    if file == "verification.json":
        data = {"schema": "reprotune/verification", "schema_version": 5, "verdict": "PASS", "mode": "fast"}
        data |= {"reference": str(runs[0]), "legs": []}
    else:
        data = {"schema": "reprotune/bundle-rerun", "schema_version": 1, "verdict": "IDENTICAL"}
    (directory / file).write_text(json.dumps({**data, **edit}), encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(said)) as refused:
        write_report([directory], tmp_path / "page.html")
    assert str(directory / file) in (refused.value.source or "")
    assert main(["report", str(directory), "-o", str(tmp_path / "page.html")]) == 2
    assert not (tmp_path / "page.html").exists()


def test_the_third_run_is_named_c_in_what_compare_says_of_it(runs: list[Path], tmp_path: Path) -> None:
    """A shorter third run whose adapter is gone: compare's "run B" is C there (the report's own B
    is another run), its headers say C, and the missing adapter reads "(absent)" with no empty
    tensor table (before: "run B has 6", the headers "A"/"B", and "None" over a header-only table)."""
    short = write_run_dir(tmp_path / "short", RunSpec(steps=6))
    (short / "adapter" / "adapter_model.safetensors").unlink()
    html = write_report([*runs[:2], short], tmp_path / "page.html").read_text(encoding="utf-8")
    section = html.split("<h3>A (ref) vs C (short)", 1)[1]
    assert "run C has 6" in html and "run B has 6" not in html
    assert "<th>C</th>" in section and "vs (absent)</p>" in section and "<th>tensor</th>" not in section


def test_a_spot_replay_is_no_negative_control_and_verify_s_verdict_is_shown(
    runs: list[Path], tmp_path: Path
) -> None:
    """A spot check's replay is described as one (it was "this negative control"), and where verify
    judged it otherwise than compare over the common steps (its end state differed), the glance
    says verify's verdict."""
    directory = tmp_path / "spot"
    directory.mkdir()
    replay = shutil.copytree(runs[0], tmp_path / "replay")  # its steps the reference's, its end not
    legs = [
        {
            "name": "steps-9-12",
            "run_dir": str(replay),
            "expected": "IDENTICAL",
            "verdict": "DIVERGED",
            "passed": False,
        }
    ]
    _write_verification(directory, verdict="FAIL", mode="spot", reference=runs[0], legs=legs)
    html = write_report([directory], tmp_path / "page.html").read_text(encoding="utf-8")
    assert "negative control" not in html and "leg steps-9-12 replays an interval" in html
    glance = html.split('<ul class="glance">', 1)[1].split("</ul>", 1)[0]
    assert "verify judged leg steps-9-12" in glance and "DIVERGED" in glance, glance


def test_a_cut_bundle_rerun_summary_is_refused_with_its_file(tmp_path: Path) -> None:
    directory = tmp_path / "rerun"
    directory.mkdir()
    (directory / "rerun.json").write_text('{"schema": "reprotune/bundle-rerun", ', encoding="utf-8")
    with pytest.raises(InputError, match="bundle rerun summary is not valid JSON") as refused:
        write_report([directory], tmp_path / "page.html")
    assert str(directory / "rerun.json") in refused.value.source and not (tmp_path / "page.html").exists()


def test_an_older_verification_still_opens_its_report(runs: list[Path], tmp_path: Path) -> None:
    """A verification.json of an earlier version (1: no mode, no prefix flags) still reads: the
    report opens with its verdict and its legs."""
    directory = tmp_path / "ver"
    directory.mkdir()
    legs = [{"name": "rerun", "run_dir": str(runs[1]), "expected": "IDENTICAL", "verdict": "DIVERGED"}]
    old = {
        "schema": "reprotune/verification",
        "schema_version": 1,
        "verdict": "FAIL",
        "reference": str(runs[0]),
    }
    (directory / "verification.json").write_text(json.dumps({**old, "legs": legs}), encoding="utf-8")
    html = write_report([directory], tmp_path / "page.html").read_text(encoding="utf-8")
    assert "verify FAIL" in html and "The config did NOT verify" in html and "<td>rerun</td>" in html


@pytest.mark.parametrize(
    ("legs", "said"),
    [
        (
            ["rerun-resume", "control-seed"],
            "a rerun (stopped at a checkpoint and resumed in a fresh process)",
        ),
        (["rerun", "control-seed"], "(exact resume was not checked: verify ran with --no-resume)"),
        (["rerun", "resume-skipped"], "(exact resume was not checked: skipped: train.save_every gives"),
        (["rerun", "resume", "control-seed"], "and so did a run stopped at a checkpoint and resumed"),
    ],
    ids=["fast", "no-resume", "no-checkpoint", "thorough"],
)
def test_what_a_pass_proved_is_what_its_legs_showed(
    runs: list[Path], tmp_path: Path, legs: list[str], said: str
) -> None:
    """A PASS says a resume was checked only where a leg resumed (before, every PASS said "stopped
    at a checkpoint and resumed", with --no-resume or no checkpoint before the end too); the
    controls only where they ran; a schema-1 file shows no mode or cost it never recorded."""
    directory = tmp_path / "ver"
    directory.mkdir()
    skipped = {
        "name": "resume",
        "run_dir": "",
        "expected": "IDENTICAL",
        "verdict": None,
        "passed": None,
        "note": "skipped: train.save_every gives no checkpoint before the last step; set it",
    }
    ran = {"run_dir": str(runs[1]), "expected": "IDENTICAL", "verdict": "IDENTICAL", "passed": True}
    entries = [skipped if name == "resume-skipped" else {"name": name, **ran} for name in legs]  # fmt: skip
    _write_verification(directory, verdict="PASS", mode="fast", reference=runs[0], legs=entries)
    html = write_report([directory], tmp_path / "page.html").read_text(encoding="utf-8")
    proven = html.split("What was proven", 1)[1].split("</p>", 1)[0]
    assert said in proven and ("negative controls" in proven) == ("control-seed" in legs), proven
    assert ("stopped at a checkpoint and resumed in a fresh process" in proven) == ("rerun-resume" in legs)
    old = {"schema": "reprotune/verification", "schema_version": 1, "verdict": "PASS", "mode": None}
    old |= {"reference": str(runs[0]), "legs": entries}
    (directory / "verification.json").write_text(json.dumps(old))
    html = write_report([directory], tmp_path / "page.html").read_text(encoding="utf-8")
    assert "None mode" not in html and "Cost:" not in html


def test_a_verification_with_failed_and_unrun_legs_still_opens_its_report(
    runs: list[Path], tmp_path: Path
) -> None:
    """A FAIL verification whose control failed (its directory half a run) and whose RNG-skip
    control was not run (no directory): the report lists every leg in its summary and compares
    only the legs that ran and were judged."""
    directory = tmp_path / "ver"
    (directory / "control-seed").mkdir(parents=True)
    legs = [
        {"name": "rerun-resume", "run_dir": str(runs[1]), "expected": "IDENTICAL", "verdict": "DIVERGED"},
        {
            "name": "control-seed",
            "run_dir": str(directory / "control-seed"),
            "expected": "DIVERGED",
            "verdict": "FAILED",
        },
        {
            "name": "control-resume",
            "run_dir": str(directory / "control-resume"),
            "expected": "DIVERGED",
            "verdict": None,
        },
    ]
    _write_verification(directory, verdict="FAIL", mode="fast", reference=runs[0], legs=legs)
    html = write_report([directory], tmp_path / "page.html").read_text(encoding="utf-8")
    assert all(f"<td>{leg['name']}</td>" in html for leg in legs)
    assert str(directory / "control-resume") not in html.split("</table>", 1)[1]  # not compared


def test_a_moved_verification_directory_still_compares_its_legs(tmp_path: Path) -> None:
    """verification.json names its runs by absolute path, where they were made; moved (or copied to
    another machine), the report finds the reference and the legs inside the directory now, and
    compares them (it listed the legs and compared none)."""
    made = tmp_path / "made"
    write_run_dir(made / "reference")
    write_run_dir(made / "rerun", RunSpec(seed=43))
    legs = [{"name": "rerun", "run_dir": str(made / "rerun"), "expected": "IDENTICAL", "verdict": "DIVERGED"}]
    _write_verification(made, verdict="FAIL", mode="fast", reference=made / "reference", legs=legs)
    moved = tmp_path / "elsewhere" / "ver"
    moved.parent.mkdir()
    made.rename(moved)
    html = write_report([moved], tmp_path / "page.html").read_text(encoding="utf-8")
    compared = html.split("</table>", 1)[1]
    assert str(moved / "reference") in compared and str(moved / "rerun") in compared


def test_an_outside_reference_gone_is_not_taken_for_a_leg_of_the_same_name(tmp_path: Path) -> None:
    """A verification whose reference was an outside run (``--reference``) named like one of its
    legs: that run gone, the report does not compare the leg with itself in its place."""
    directory = tmp_path / "ver"
    write_run_dir(directory / "rerun", RunSpec(seed=43))
    legs = [
        {"name": "rerun", "run_dir": str(directory / "rerun"), "expected": "IDENTICAL", "verdict": "DIVERGED"}
    ]
    gone = tmp_path / "elsewhere" / "rerun"
    _write_verification(directory, verdict="FAIL", mode="fast", reference=gone, legs=legs)
    with pytest.raises(InputError) as refused:
        write_report([directory], tmp_path / "page.html")
    assert str(gone) in str(refused.value) + str(refused.value.source)


def test_a_run_directory_whose_name_is_not_utf8_is_written_escaped(tmp_path: Path) -> None:
    """A directory named with a Latin-1 byte (run-caf\\xe9): the page shows it escaped (before, a
    UnicodeEncodeError traceback, exit 1)."""
    import os

    name = os.fsdecode(b"run-caf\xe9")
    run = write_run_dir(tmp_path / name)
    html = write_report([run], tmp_path / "page.html").read_text(encoding="utf-8")
    assert "run-caf\\udce9" in html


_POLYLINE = re.compile(
    r'<polyline points="[^"]*" fill="none" stroke="(#\w+)" stroke-width="1.6"'
    r'(?: stroke-dasharray="([\d,]+)")?><title>([^<]*)</title>'
)
_MARK = re.compile(r'stroke="(#\w+)" stroke-dasharray="6,4" stroke-width="1.2"/><text [^>]*>([^<]*)</text>')


def _styles(chart: str) -> dict[str, tuple[str, str]]:
    """Each run's (colour, dash pattern) in a chart, by its label."""
    return {label: (color, dashes or "") for color, dashes, label in _POLYLINE.findall(chart)}


def test_each_mark_has_the_colour_of_the_run_that_parts(runs: list[Path], tmp_path: Path) -> None:
    """B agrees with A, C parts at step 7: C's mark is drawn in C's colour (it took the colour of
    its place among the marks, B's)."""
    twin = write_run_dir(tmp_path / "twin")
    html = write_report([runs[0], twin, runs[2]], tmp_path / "page.html").read_text(encoding="utf-8")
    train = _SVG.findall(html)[0]
    assert _MARK.findall(train) == [(_styles(train)["C (noisy)"][0], "C parts from A at step 7")]


def test_a_run_without_points_keeps_every_other_run_s_style_and_its_legend(
    runs: list[Path], tmp_path: Path
) -> None:
    """A run with no step between A and C: C keeps the colour and dash pattern of the third run in
    both charts (it took B's), and the empty run is in the legends, marked as having no points."""
    zero = write_run_dir(tmp_path / "zero")
    init = (zero / "ledger.jsonl").read_text().splitlines(keepends=True)[0]
    (zero / "ledger.jsonl").write_text(init)
    page = write_report([runs[0], zero, runs[2]], tmp_path / "page.html").read_text(encoding="utf-8")
    usual = write_report(runs, tmp_path / "usual.html").read_text(encoding="utf-8")
    for chart, expected in zip(_SVG.findall(page), _SVG.findall(usual), strict=True):
        assert _styles(chart)["C (noisy)"] == _styles(expected)["C (noisy)"]
        assert "B (zero) (no points)</text>" in chart


def test_five_identical_runs_each_keep_a_style_of_their_own(tmp_path: Path) -> None:
    """Five runs of one spec draw five identical curves: each in its own dash pattern (the fifth
    drew solid over the solid first and hid it), so no two share colour and dash pattern."""
    names = ["ref", "b", "c", "d", "e"]
    paths = [write_run_dir(tmp_path / name) for name in names]
    html = write_report(paths, tmp_path / "page.html").read_text(encoding="utf-8")
    for chart in _SVG.findall(html):
        styles = _styles(chart)
        assert len(styles) == 5
        assert len({dashes for _, dashes in styles.values()}) == 5, styles


def test_another_validation_schedule_at_a_glance_is_its_config_value(tmp_path: Path) -> None:
    """At a glance, a run validated every 8 steps against every 4 reads as that config value, not
    as an edited ledger."""
    ref, other = write_run_dir(tmp_path / "ref"), write_run_dir(tmp_path / "every8", RunSpec(eval_every=8))
    html = write_report([ref, other], tmp_path / "page.html").read_text(encoding="utf-8")
    glance = html[: html.index("<h2>Runs</h2>")]
    assert "every number both recorded agrees: config.train.eval_every 4 vs 8</li>" in glance
    assert "edited" not in glance


@pytest.mark.parametrize(
    ("names", "curves"),
    [(None, ("A (ref), eval set 1", "A (ref), eval set 2")), (["dev", "test"], ("A (ref), eval set 'dev'",))],
)
def test_each_eval_set_is_a_curve_of_its_own(
    tmp_path: Path, names: list[str] | None, curves: tuple[str, ...]
) -> None:
    """A Trainer's dict of eval datasets writes one val line a set at each evaluation: the chart
    drew them as one zigzag curve; each set is a curve now, named where the record names it, in a
    style of its own, and a run of one set keeps its plain curve."""
    runs = [write_run_dir(tmp_path / "ref"), write_run_dir(tmp_path / "other")]
    two_eval_sets(runs[0], names=names)
    val = _SVG.findall(write_report(runs, tmp_path / "report.html").read_text(encoding="utf-8"))[1]
    polylines = re.findall(
        r'<polyline points="([^"]*)"[^>]*stroke="([^"]*)"[^>]*><title>([^<]*)</title>', val
    )
    titles = [unescape(title) for _, _, title in polylines]
    assert all(curve in titles for curve in curves) and "B (other)" in titles and len(titles) == 3
    for points, _, _ in polylines:
        xs = [float(point.split(",")[0]) for point in points.split()]
        assert xs == sorted(set(xs))  # one point a step: no zigzag
    assert len({(stroke, title.split(",")[0]) for _, stroke, title in polylines}) == 3  # sets apart
