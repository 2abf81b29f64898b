"""Gather ``results.json`` files into markdown tables laid out like the paper's, beside its numbers.

    python -m aetv2_tf.report runs/ other/results.json [--output=report.md [--overwrite]]

Every argument is a ``results.json`` file or a directory searched for them (keys:
`aetv2_tf.probes.results`). The report holds the paper's tables that have results
(`PAPER_TABLES`), one "ours" row per method (`method_of`) next to the "paper" row, and a table
of every run; several runs of one cell show ``mean ± std (n=...)``, ``*`` marks a cell with a
run on fewer test images than the full test set. Inputs are not trusted
(`program.report_inputs`): a bad one ends the report with exit 2, naming the file and the
problem; a non-finite value shows as ``nan (diverged?)``; text is escaped in the cells
(`_cell`). ``--output`` is written atomically (`check_output`), never inside a run it reads.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from aetv2_tf.errors import UsageError
from aetv2_tf.files.nesting import refuse_nested
from aetv2_tf.files.safe_paths import refuse_link, write_atomically
from aetv2_tf.probes.results import RESULTS_FILENAME, ResultsError
from aetv2_tf.program.report_inputs import ReportError, read_checked

# The paper's numbers, in one place (docs/method.md, section 1). "metric" is the results key shown:
# test_error (%, lower is better) for CIFAR-10, test_top1 (%, higher is better) elsewhere.
PAPER_TABLES: dict[str, dict[str, Any]] = {
    "cifar10": dict(
        title="CIFAR-10 (paper Table 2): test error (%) of classifiers on frozen NIN block-2 "
              "features, lower is better",
        dataset="cifar10", probes=("knn", "fc1", "fc2", "fc3", "conv"), feature="block2",
        columns=("KNN", "1-FC", "2-FC", "3-FC", "conv"), metric="test_error", digits=2,
        rows={
            "AETv1": (22.39, 16.65, 9.41, 9.92, 7.82),
            "AETv2": (21.26, 15.03, 9.09, 9.55, 7.44),
            "supervised": (None, None, None, None, 7.20),
            "random": (None, None, None, None, 27.50),
        },
    ),
    "imagenet_linear": dict(
        title="ImageNet: top-1 (%) of linear probes on frozen AlexNet features, higher is better",
        dataset="imagenet", probes=("linear",), feature=("conv1", "conv2", "conv3", "conv4",
                                                        "conv5"),
        columns=("conv1", "conv2", "conv3", "conv4", "conv5"), metric="test_top1", digits=1,
        rows={"AETv2": (19.6, 34.1, 41.9, 40.4, 37.9)},
    ),
    "imagenet_nonlinear": dict(
        title="ImageNet: top-1 (%) of nonlinear heads on frozen AlexNet features, higher is "
              "better",
        dataset="imagenet", probes=("nonlinear",), feature=("conv4", "conv5"),
        columns=("conv4", "conv5"), metric="test_top1", digits=1,
        rows={"AETv2": (54.3, 47.5)},
    ),
    "places_linear": dict(
        title="Places: top-1 (%) of linear probes on frozen ImageNet-pretrained AlexNet "
              "features, higher is better (paper: Places205)",
        dataset="places", probes=("linear",), feature=("conv1", "conv2", "conv3", "conv4",
                                                      "conv5"),
        columns=("conv1", "conv2", "conv3", "conv4", "conv5"), metric="test_top1", digits=1,
        rows={"AETv2": (22.8, 33.2, 38.1, 36.8, 35.3)},
    ),
}

ROW_LABELS = {
    "supervised": "supervised NIN (lower bound)",
    "random": "random init (upper bound)",
}
CANONICAL_METHODS = {"aetv1": "AETv1", "aetv2": "AETv2", "rotnet": "RotNet",
                     "supervised": "supervised", "random": "random"}
FULL_TEST_SIZE = {"cifar10": 10000, "imagenet": 50000}
MISSING = "-"
#: Exit status of every refusal (docs/reliability.md: 2, input the program rejects).
EXIT_BAD_INPUT = 2


def find_results(paths: Sequence[str]) -> list[str]:
    """``results.json`` files named by ``paths`` (files as given, directories recursively)."""
    if not paths:
        raise ReportError("give at least one results.json or directory")
    found: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                if RESULTS_FILENAME in files:
                    found.append(os.path.join(root, RESULTS_FILENAME))
        elif os.path.lexists(path):  # a file, or something else that read_checked refuses
            found.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    if not found:
        raise ReportError(
            f"no {RESULTS_FILENAME} found under: {', '.join(paths)}; pretraining writes none, "
            f"a probe does (into its --model_dir): python -m aetv2_tf.train "
            f"--flagfile=configs/cifar10_probe_knn.cfg --pretrained=<pretraining run> "
            f"--model_dir=<new folder>, then report that folder")
    return list(dict.fromkeys(found))


def load_all(paths: Sequence[str], warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Checked results of every file found, each with its ``_path``; their warnings are
    appended to `warnings` (when given)."""
    loaded = []
    for path in find_results(paths):
        result, found = read_checked(path)
        loaded.append({**result, "_path": path})
        if warnings is not None:
            warnings += found
    return loaded


def dataset_key(name: Any) -> str:
    """Family: ``CIFAR-10`` -> cifar10, ``imagenet2012`` -> imagenet, ``places*`` -> places."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())
    for prefix in ("cifar10", "imagenet", "places"):
        if key.startswith(prefix) and not (prefix == "cifar10" and key.startswith("cifar100")):
            return prefix
    return key


def method_of(result: dict[str, Any]) -> str:
    """The row label: ``method`` if given; else from ``pretrained``: None/""/"none"/"random"
    -> ``random``, a path mentioning ``supervised``, ``aetv1``, ``aetv2`` or ``rotnet``
    (any case) -> that method, else the path's last component. Known names canonicalised."""
    method = result.get("method")
    if not method:
        pretrained = result.get("pretrained")
        text = "" if pretrained is None else str(pretrained).strip()
        if text.lower() in ("", "none", "random", "random_init"):
            method = "random"
        else:
            lowered = text.lower()
            method = next((name for name in ("supervised", "aetv1", "aetv2", "rotnet")
                           if name in lowered), None)
            method = method or os.path.basename(os.path.normpath(text))
    return CANONICAL_METHODS.get(str(method).lower(), str(method))


def _fmt(values: list[float], digits: int, partial: bool) -> str:
    if not values:
        return MISSING
    finite = all(map(math.isfinite, values))
    if finite:
        text = f"{statistics.fmean(values):.{digits}f}"
    else:  # fmean and stdev refuse inf - inf: the cell names the non-finite value it holds
        odd = {str(v) for v in values if not math.isfinite(v)}
        text = _number(float(odd.pop()) if len(odd) == 1 else math.nan, digits)
    if len(values) > 1:
        spread = f" ± {statistics.stdev(values):.{digits}f}" if finite else ""
        text += f"{spread} (n={len(values)})"
    return text + ("*" if partial else "")


def _number(value: Any, digits: int = 2) -> str:
    """A cell's number: `MISSING` for None, ``nan (diverged?)`` for a non-finite value."""
    if value is None:
        return MISSING
    return f"{float(value):.{digits}f}" if math.isfinite(value) else f"{value} (diverged?)"


def _cell(text: Any) -> str:
    """`text` safe in a markdown table cell: control and line-separator characters become
    spaces, ``\\ | ` <`` are escaped, lone surrogates become ``?`` (stdout is UTF-8)."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("`", "\\`"), ("<", "&lt;")):
        text = text.replace(char, escaped)
    return text


def _code(path: str) -> str:
    """`path` as an inline code cell, or escaped plain text when it holds what a code span
    cannot (a backtick, a pipe, a backslash, a control character)."""
    plain = _cell(path)
    return f"`{path}`" if plain == path.replace("<", "&lt;") else plain


def _markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _cells(spec: dict[str, Any], results: list[dict[str, Any]]):
    """{method: [(values, partial) per column]} for the results that belong to ``spec``."""
    features = spec["feature"] if isinstance(spec["feature"], tuple) else None
    cells: dict[str, list[tuple[list[float], bool]]] = {}
    full = FULL_TEST_SIZE.get(spec["dataset"])
    for result in results:
        if dataset_key(result["dataset"]) != spec["dataset"] or result["probe"] not in spec[
                "probes"]:
            continue
        if features is None:  # columns are probes, one feature
            if result["feature"] != spec["feature"]:
                continue
            column = spec["probes"].index(result["probe"])
        elif result["feature"] in features:  # columns are features, one probe
            column = features.index(result["feature"])
        else:
            continue
        value = result.get(spec["metric"])
        if value is None:
            continue
        row = cells.setdefault(method_of(result), [([], False) for _ in spec["columns"]])
        values, partial = row[column]
        tests = result.get("test_examples")
        partial = partial or bool(full and isinstance(tests, int) and tests < full)
        row[column] = ([*values, float(value)], partial)
    return cells


def render_table(spec: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of one paper-style table, or [] when no result belongs to it."""
    cells = _cells(spec, results)
    if not cells:
        return []
    paper_rows = spec["rows"]
    methods = [m for m in paper_rows] + sorted(m for m in cells if m not in paper_rows)
    rows = []
    for method in methods:
        label = _cell(ROW_LABELS.get(method, method))
        if method in cells:
            rows.append([label, "ours", *(_fmt(v, 2, p) for v, p in cells[method])])
        if method in paper_rows:
            rows.append([label, "paper", *(MISSING if v is None else f"{v:.{spec['digits']}f}"
                                           for v in paper_rows[method])])
    lines = [f"### {spec['title']}", ""] + _markdown(["Method", "Source", *spec["columns"]], rows)
    if any(p for row in cells.values() for _, p in row):
        lines += ["", "`*` at least one run used fewer test images than the full test set."]
    return lines


def render_runs(results: list[dict[str, Any]], base: str | None = None) -> list[str]:
    """Markdown lines of a table with one row per run (every probe, feature and dataset)."""
    num = _number
    rows = []
    ordered = sorted(results, key=lambda r: (str(r["dataset"]), method_of(r), str(r["probe"]),
                                             str(r["feature"]), r["_path"]))
    for r in ordered:
        path = os.path.relpath(r["_path"], base) if base else r["_path"]
        rows.append([_cell(method_of(r)), _cell(r["dataset"]), _cell(r["probe"]),
                     _cell(r["feature"]), num(r["test_error"]), num(r["test_top1"]),
                     num(r["val_top1"]),
                     MISSING if r["selected_epoch"] is None else str(r["selected_epoch"]),
                     f"{r['train_examples']}/{r['val_examples']}/{r['test_examples']}",
                     num(r["wall_time_s"], 0), _code(path)])
    header = ["Method", "Dataset", "Probe", "Feature", "Test error %", "Test top-1 %",
              "Val top-1 %", "Epoch", "Train/val/test", "Time s", "File"]
    return ["### All runs", ""] + _markdown(header, rows)


def render_report(results: list[dict[str, Any]], base: str | None = None) -> str:
    """The whole markdown report for validated results (each with a ``_path``)."""
    if not results:
        raise ReportError("no results to report")
    lines = ["# aetv2_tf evaluation report", "",
             "Ours: epoch selected on a held-out part of the training set, test set evaluated "
             "once. Paper: AETv2 (Lin, Xu, Li, Xiong, Qi; the published predecessors "
             "selected on test).", ""]
    for spec in PAPER_TABLES.values():
        table = render_table(spec, results)
        if table:
            lines += table + [""]
    lines += render_runs(results, base)
    return "\n".join(lines) + "\n"


def check_output(output: str, overwrite: bool = False) -> None:
    """ReportError unless the report may be written to `output`: a new file, or with
    `overwrite` an existing regular file; never a symbolic link, folder, FIFO or device."""
    fix = "choose a new file for --output"
    try:
        refuse_link(output, fix, regular=True)
    except UsageError as err:
        raise ReportError(str(err)) from err
    if os.path.exists(output) and not overwrite:
        raise ReportError(f"--output={output} exists; the report replaces no file unless told: "
                          "nothing was written; pass --overwrite to replace it, or "
                          f"{fix}.")


def main(argv: Sequence[str], output: str | None = None, overwrite: bool = False) -> int:
    """The report of the results files and directories `argv[1:]`, printed and written to
    `output` (`check_output` first); returns 0, or `EXIT_BAD_INPUT` after a message on stderr."""
    paths = list(argv[1:])
    warnings: list[str] = []
    try:
        if output:
            check_output(output, overwrite)
        results = load_all(paths, warnings)
        if output:  # never written into a run it reads, nor over one of its results files
            runs = [("the run folder", os.path.dirname(os.path.abspath(r["_path"])))
                    for r in results]
            refuse_nested({"--output": output}, runs)
        report = render_report(results, base=os.getcwd())
    except (ReportError, ResultsError, UsageError) as err:
        print(f"aetv2_tf.report: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for warning in warnings:
        print(f"aetv2_tf.report: warning: {warning}", file=sys.stderr)
    if output:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
            write_atomically(output, report)
        except (OSError, UsageError) as err:
            print(f"aetv2_tf.report: error: --output={output} cannot be written ({err}); "
                  "choose another file", file=sys.stderr)
            return EXIT_BAD_INPUT
    sys.stdout.write(report)
    return 0


def run() -> None:
    """Entry point: define the flags (only here, so importing this module defines none)."""
    from absl import app, flags

    from aetv2_tf.program.flag_support import PathParser
    from aetv2_tf.program.flagfiles import parse_command_line

    flags.DEFINE(PathParser(), "output", None, "Also write the markdown report to this file "
                 "(a new one; an existing file only with --overwrite; never through a link).")
    flags.DEFINE_boolean("overwrite", False, "Let --output replace an existing file.")
    app.run(lambda argv: main(argv, flags.FLAGS.output, flags.FLAGS.overwrite),
            flags_parser=parse_command_line)  # flagfiles checked before absl reads them


if __name__ == "__main__":
    run()
