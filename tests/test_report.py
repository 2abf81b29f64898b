"""results.json writing/validation and the markdown report (module and command line)."""

import json
import os
import subprocess
import sys

import pytest

from aetv2_tf.probes.results import (
    REQUIRED_KEYS,
    ResultsError,
    read_results,
    write_results,
)
from aetv2_tf.report import PAPER_TABLES, ReportError, load_all, method_of, render_report
from tests.folders import make_result

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table_row(markdown: str, title_start: str, label: str, source: str) -> list[str]:
    """Cells of the row (label, source) in the table whose heading starts with title_start."""
    section = markdown.split(f"### {title_start}", 1)[1].split("###", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == [label, source]:
            return cells[2:]
    raise AssertionError(f"no row {label!r}/{source!r} in:\n{section}")


def test_write_read_roundtrip_is_atomic_and_fills_defaults(tmp_path):
    path = write_results(tmp_path / "run", make_result("fc1", 15.5, method="AETv2"))
    assert path == str(tmp_path / "run" / "results.json")
    assert os.listdir(tmp_path / "run") == ["results.json"]  # no temporary file left behind
    loaded = read_results(path)
    assert set(REQUIRED_KEYS) <= set(loaded)
    assert loaded["test_error"] == 15.5 and loaded["flags"] == {"probe": "fc1", "seed": 0}
    assert loaded["created"][:4].isdigit() and loaded["version"]
    # Overwriting replaces the file whole.
    write_results(tmp_path / "run", make_result("fc1", 14.0))
    assert read_results(path)["test_error"] == 14.0


def test_missing_keys_are_named(tmp_path):
    incomplete = make_result("fc1", 15.0)
    del incomplete["test_error"]
    with pytest.raises(ResultsError, match="'test_error'"):
        write_results(tmp_path, incomplete)
    assert not os.path.exists(tmp_path / "results.json")
    (tmp_path / "results.json").write_text(json.dumps({"probe": "knn"}))
    with pytest.raises(ResultsError, match=r"results\.json: missing required key 'feature'"):
        read_results(tmp_path / "results.json")
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        read_results(tmp_path / "results.json")


def test_method_names():
    assert method_of({"method": "aetv2"}) == "AETv2"
    assert method_of({"pretrained": None}) == "random"
    assert method_of({"pretrained": "none"}) == "random"
    assert method_of({"pretrained": "/runs/AETv1_nin/export"}) == "AETv1"
    assert method_of({"pretrained": "/runs/nin_supervised"}) == "supervised"
    assert method_of({"pretrained": "/runs/mine/"}) == "mine"


@pytest.fixture()
def runs(tmp_path):
    """AETv2 (all five columns, two conv seeds), random init conv, an ImageNet linear run."""
    root = tmp_path / "runs"
    errors = {"knn": 21.5, "fc1": 15.25, "fc2": 9.0, "fc3": 9.75}
    for probe, error in errors.items():
        write_results(root / "aetv2" / probe, make_result(probe, error, method="AETv2"))
    write_results(root / "aetv2" / "conv_s0", make_result("conv", 7.5, method="AETv2"))
    write_results(root / "aetv2" / "conv_s1", make_result("conv", 7.7, method="AETv2"))
    write_results(root / "random" / "conv", make_result("conv", 26.0, test_examples=2000))
    write_results(root / "aetv2" / "fc1_block3",
                  make_result("fc1", 30.0, feature="block3", method="AETv2"))
    write_results(tmp_path / "imagenet" / "conv3",
                  make_result("linear", 60.0, feature="conv3", dataset="imagenet2012",
                              pretrained="/models/aetv2_alexnet", test_examples=50000,
                              test_top1=40.0))
    return tmp_path


def test_render_cifar_table_with_paper_rows(runs):
    results = load_all([str(runs / "runs")])
    assert len(results) == 8
    md = render_report(results)
    title = "CIFAR-10 (paper Table 2)"
    assert table_row(md, title, "AETv2", "ours") == [
        "21.50", "15.25", "9.00", "9.75", "7.60 ± 0.14 (n=2)"]
    assert table_row(md, title, "AETv2", "paper") == ["21.26", "15.03", "9.09", "9.55", "7.44"]
    assert table_row(md, title, "AETv1", "paper") == ["22.39", "16.65", "9.41", "9.92", "7.82"]
    with pytest.raises(AssertionError):
        table_row(md, title, "AETv1", "ours")
    assert table_row(md, title, "random init (upper bound)", "ours") == [
        "-", "-", "-", "-", "26.00*"]
    assert table_row(md, title, "random init (upper bound)", "paper")[-1] == "27.50"
    assert table_row(md, title, "supervised NIN (lower bound)", "paper") == [
        "-", "-", "-", "-", "7.20"]
    assert "fewer test images" in md
    # block3 is not Table 2 but is listed among all runs; no ImageNet table without ImageNet runs.
    assert "| 30.00 |" not in md.split("### All runs")[0]
    assert "block3" in md.split("### All runs")[1]
    assert "ImageNet" not in md


def test_render_imagenet_table_only_when_present(runs):
    md = render_report(load_all([str(runs / "imagenet")]))
    assert "CIFAR-10" not in md
    title = "ImageNet: top-1 (%) of linear"
    assert table_row(md, title, "AETv2", "ours") == ["-", "-", "40.00", "-", "-"]
    assert table_row(md, title, "AETv2", "paper") == ["19.6", "34.1", "41.9", "40.4", "37.9"]
    assert "nonlinear" not in md.split("### All runs")[0]


def test_paper_numbers_in_one_structure():
    cifar = PAPER_TABLES["cifar10"]["rows"]
    assert cifar["AETv2"] == (21.26, 15.03, 9.09, 9.55, 7.44)
    assert cifar["random"][-1] == 27.50 and cifar["supervised"][-1] == 7.20
    assert PAPER_TABLES["places_linear"]["rows"]["AETv2"] == (22.8, 33.2, 38.1, 36.8, 35.3)
    assert PAPER_TABLES["imagenet_nonlinear"]["rows"]["AETv2"] == (54.3, 47.5)


def test_errors(tmp_path):
    with pytest.raises(ReportError, match="no results.json found"):
        load_all([str(tmp_path)])
    with pytest.raises(ReportError, match="no such file"):
        load_all([str(tmp_path / "missing")])


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([sys.executable, "-m", "aetv2_tf.report", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_prints_and_writes(runs):
    out = runs / "report" / "report.md"
    proc = _cli(str(runs / "runs"), str(runs / "imagenet" / "conv3" / "results.json"),
                f"--output={out}", cwd=runs)
    assert proc.returncode == 0, proc.stderr
    assert "| AETv2 | paper | 21.26 | 15.03 | 9.09 | 9.55 | 7.44 |" in proc.stdout
    assert "### ImageNet: top-1 (%) of linear" in proc.stdout
    assert out.read_text() == proc.stdout
    assert "`runs/aetv2/knn/results.json`" in proc.stdout


def test_cli_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _cli(str(tmp_path / "empty"), cwd=tmp_path)
    assert proc.returncode != 0
    assert "no results.json found" in proc.stderr and proc.stdout == ""
    assert "a probe does (into its --model_dir): python -m aetv2_tf.train " \
        "--flagfile=configs/cifar10_probe_knn.cfg --pretrained=<pretraining run>" in proc.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps({"probe": "knn"}))
    proc = _cli(str(bad), cwd=tmp_path)
    assert proc.returncode != 0 and "missing required key 'feature'" in proc.stderr
