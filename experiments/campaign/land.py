"""What a leg returned, put into results/campaign/ with its ledger rows: run on this machine.

    python -m experiments.campaign.land <the folder the device tool returned> [--knn]

``leg.json``'s values are checked first (`check_record`). For each run that `leg` shipped: its
parts joined and checked against the tar's SHA-256 in ``leg.json``, the tar's members checked
(only `leg.SHIPPED` files and one checkpoint of that run, no links), the checkpoint checked
against its ``.sha256`` and ``leg.json``, and its flags (`checked_run`); once every run has
passed, each is installed in ``results/campaign/<run>/``: the new checkpoint replaces the
run's previous one (a leg that did not move the run forward is refused), the flags and the
training log replace theirs. The leg's
``leg.json`` and ``console.txt`` are kept as ``results/campaign/legs/leg-<n>.{json,txt}``, and
each run gets a row in ``results/campaign/LEDGER.md`` (`LEDGER_HEADER`). ``--knn`` scores each
landed run's newest checkpoint with the authors' KNN (``configs/cifar10_probe_knn.cfg``: all
50,000 training vs 10,000 test images, a few minutes on 2 CPU cores) and writes it into the row.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from experiments.campaign import leg as legs
from experiments.campaign import pack

LEDGER = "LEDGER.md"
LEDGER_HEADER = (
    "| leg | date | device | run | steps (of the run) | pairs (share of the run) | wall (s) "
    "| pairs/s | loss | device min (leg / all legs) | device min still needed | checkpoint "
    "SHA-256 | authors' KNN (%) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
LEDGER_INTRO = """# The campaign's ledger: one row per run per leg

Each leg is `python -m experiments.campaign.leg` on a lent device (docs/campaign.md, which has
the runs and their whole schedules), landed here by `python -m experiments.campaign.land`. Steps
and pairs are those of the checkpoint installed (the run's totals after the leg), beside the
whole run's steps as its flags count them and the share reached; wall is the run's time in the
leg (start-up and compilation included), pairs/s the program's own rate for a run that ended by
itself (from its first step: compilation included, start-up not), else the rate from the run's
start to its last shipped checkpoint; device minutes are the run's wall time in this leg and in
all landed legs (the machine's start and the transfers, shared by the runs of a loan, are not
in them); the minutes still needed are the pairs left at this leg's pairs/s. The loss is the
mean of the run's last logged interval, the KNN the authors' protocol on this repository's CPU
(50,000 vs 10,000 images). The paper's Table 2 KNN: AETv1 77.61, AETv2 78.74 (1,500 epochs =
75 M pairs each).

"""


class LandingError(ValueError):
    """What a leg returned cannot be landed; the message says why and what to do."""


def read_leg(returned: pathlib.Path) -> dict:
    """``returned/leg.json``, its values checked (`check_record`)."""
    path = returned / "leg.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LandingError(f"{path}: not readable ({e}); nothing was landed") from e
    if not isinstance(record, dict) or not isinstance(record.get("runs"), dict):
        raise LandingError(f"{path} is not a leg's record; nothing was landed")
    if problem := check_record(record):
        raise LandingError(f"{path}: {problem}; it is not what a leg writes: nothing was landed")
    return record


#: leg.json's values that reach the ledger, and what each must be (absent or None: "-"):
#: counts are integers in [0, `MAX_COUNT`], numbers in [their lower bound, `MAX_NUMBER`].
COUNTS = ("images", "steps", "pairs", "start_step")
NUMBERS = {"wall_s": 0.0, "pairs_per_sec": 0.0, "loss": -1e15}
TEXTS = ("started", "device")
MAX_COUNT, MAX_NUMBER = 2**53, 1e15
HEX64 = re.compile(r"[0-9a-f]{64}")


def is_count(v: object) -> bool:
    return type(v) is int and 0 <= v <= MAX_COUNT


def check_record(record: dict) -> str | None:
    """What is wrong with a leg's record (None: nothing): a run not of the campaign's, counts
    and numbers out of their ranges (`COUNTS`, `NUMBERS`), texts that would break a Markdown
    row, a shipped run without its parts' names or its checkpoint's step, file and SHA-256."""
    def wrong(values: dict, where: str) -> str | None:
        for key in COUNTS:
            if (v := values.get(key)) is not None and not is_count(v):
                return f"{where}{key} is {v!r}, not a count"
        for key, low in NUMBERS.items():
            v = values.get(key)
            if v is not None and not (type(v) in (int, float) and low <= v <= MAX_NUMBER):
                return f"{where}{key} is {v!r}, not a number from {low:g} to {MAX_NUMBER:g}"
        for key in TEXTS:
            v = values.get(key)
            if v is not None and (not isinstance(v, str) or not v.isprintable() or "|" in v):
                return f"{where}{key} is {v!r}, not one line of text without '|'"
        return None

    if problem := wrong(record, ""):
        return problem
    for run, entry in record["runs"].items():
        if run not in legs.RUNS:
            return f"it names the run {run!r}, not one of {list(legs.RUNS)}"
        if not isinstance(entry, dict):
            return f"the run {run!r} has {entry!r}, not a run's entry"
        if problem := wrong(entry, f"{run}: "):
            return problem
        if not (parts := entry.get("parts")):
            continue
        if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            return f"{run}: its parts are {parts!r}, not a list of file names"
        point = entry.get("checkpoint")
        if not (isinstance(point, dict) and is_count(point.get("step"))
                and isinstance(point.get("file"), str)
                and HEX64.fullmatch(str(point.get("sha256")))):
            return f"{run}: its shipped checkpoint is {point!r}, not a step, file and SHA-256"
    return None


def joined_tar(returned: pathlib.Path, run: str, entry: dict) -> bytes:
    parts = entry.get("parts") or []
    if not parts or any(p != f"{run}.tar.{i}" for i, p in enumerate(parts)):
        raise LandingError(f"{run}: leg.json lists parts {parts}, expected {run}.tar.0, ...")
    data = b"".join((returned / p).read_bytes() for p in parts)
    if hashlib.sha256(data).hexdigest() != entry.get("tar_sha256"):
        raise LandingError(f"{run}: the joined parts' SHA-256 is not leg.json's: a part is "
                           "missing or damaged; fetch the returned files again")
    return data


def extract(run: str, data: bytes, into: pathlib.Path, checkpoint: str) -> None:
    """The tar's members into ``into``, after checking each is a regular file of the run that a
    leg ships (`legs.SHIPPED` and ``checkpoint``)."""
    allowed = {f"{run}/{n}" for n in (*legs.SHIPPED, checkpoint, checkpoint + ".sha256")}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        for m in members:
            if m.name not in allowed or not m.isfile():
                raise LandingError(f"{run}: the returned tar holds {m.name!r}, which a leg does "
                                   "not ship; nothing was landed")
        tar.extractall(into, members=members, filter="data")


def next_leg(results: pathlib.Path) -> int:
    found = [int(p.stem.split("-")[1]) for p in (results / "legs").glob("leg-*.json")]
    return max(found, default=0) + 1


def install(staged: pathlib.Path, target: pathlib.Path, new: dict) -> None:
    """The staged run folder's files into ``target`` (the run's folder in results/campaign),
    the previous checkpoint (written by an earlier landing) removed; ``new``: the staged
    checkpoint, checked by `checked_run`."""
    old = legs.newest_checkpoint(target) if target.is_dir() else None
    for name in legs.SHIPPED:
        if (staged / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            pack.write_bytes(target / name, (staged / name).read_bytes())
    (target / "checkpoints").mkdir(parents=True, exist_ok=True)
    for suffix in (".sha256", ""):  # the digest first: a file is never there without it
        name = new["file"] + suffix
        pack.write_bytes(target / name, (staged / name).read_bytes())
    if old is not None:
        for suffix in ("", ".sha256"):
            old[1].with_name(old[1].name + suffix).unlink(missing_ok=True)


def ledger_row(number: int, record: dict, run: str, entry: dict, spent_s: float,
               knn: str = "-") -> str:
    """The run's row of leg ``number``; ``entry``: its `checked_run` record, ``spent_s``: its
    wall seconds in all landed legs."""
    def value(key, fmt="{}"):
        return fmt.format(entry[key]) if entry.get(key) is not None else "-"

    total, batch, rate = entry.get("total_steps"), entry.get("batch"), entry.get("pairs_per_sec")
    steps, share, needed = value("steps", "{:,}"), value("pairs", "{:,}"), "-"
    leg_minutes = "-" if entry.get("wall_s") is None else f"{entry['wall_s'] / 60:.1f}"
    if total:
        steps += f" of {total:,}"
        share += f" ({100 * entry['steps'] / total:.1f} %)"
        if rate:
            needed = f"{max(total - entry['steps'], 0) * batch / rate / 60:,.0f}"
    return (f"| {number} | {(record.get('started') or '-')[:10]} | "
            f"{record.get('device') or '-'} | "
            f"{run} | {steps} | {share} | {value('wall_s', '{:.0f}')} | "
            f"{value('pairs_per_sec', '{:,.0f}')} | {value('loss', '{:.4f}')} | "
            f"{leg_minutes} / {spent_s / 60:.1f} | {needed} | "
            f"`{entry['checkpoint']['sha256'][:16]}` | {knn} |\n")


def checked_run(run: str, entry: dict, staged: pathlib.Path, target: pathlib.Path,
                images: int | None) -> dict:
    """The run's entry as its ledger row shows it, after checking what was staged for it: its
    checkpoint (its ``.sha256``, leg.json's step and SHA-256, past the one in ``target``) and
    its flags. Adds ``batch``; ``steps`` and ``pairs``: the checkpoint's step and that times the
    batch (what is installed); ``total_steps``: the whole run's, ``--train_steps``, else
    ``--epochs`` of ``images // --batch_size`` steps (the program's count for the campaign's
    runs; None for a run whose count depends on what is not shipped: ``--train_seconds``,
    ``--train_examples``, RotNet, or a leg that did not record its images)."""
    try:
        new = legs.checked_checkpoint(staged)
        flags = json.loads((staged / "flags.json").read_text())
        batch, epochs = flags["batch_size"], flags["epochs"]
        train_steps = flags.get("train_steps") or 0
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise LandingError(f"{run}: the returned files are not a run's ({e}); nothing was "
                           "landed") from e
    if new is None or (new["step"], new["sha256"]) != (entry["checkpoint"]["step"],
                                                       entry["checkpoint"]["sha256"]):
        raise LandingError(f"{run}: the returned checkpoint is not the one leg.json names; "
                           "nothing was landed")
    if not (is_count(batch) and batch >= 1 and is_count(epochs) and is_count(train_steps)):
        raise LandingError(f"{run}: its flags.json has --batch_size={batch!r}, --epochs="
                           f"{epochs!r}, --train_steps={train_steps!r}; nothing was landed")
    old = legs.newest_checkpoint(target) if target.is_dir() else None
    if old is not None and old[0] >= new["step"]:
        raise LandingError(f"{run}: the returned checkpoint (step {new['step']}) is not past "
                           f"the one in {target} (step {old[0]}); nothing was landed")
    total = train_steps or (
        None if images is None or flags.get("train_seconds") or flags.get("train_examples")
        or flags.get("pretext", "aet") != "aet" else epochs * max(images // batch, 1))
    return dict(entry, checkpoint=new, batch=batch, steps=new["step"],
                pairs=new["step"] * batch, total_steps=total)


def spent_seconds(results: pathlib.Path, run: str) -> float:
    """The run's wall seconds in all the legs landed in ``results`` (their ``leg.json``)."""
    return sum(json.loads(p.read_text())["runs"].get(run, {}).get("wall_s") or 0.0
               for p in (results / "legs").glob("leg-*.json"))


def knn_top1(results: pathlib.Path, run: str, number: int, work: pathlib.Path) -> str:
    """The authors' KNN of the run's newest checkpoint (module docstring), as text."""
    model_dir = work / f"{run}-leg{number}"
    proc = subprocess.run([sys.executable, "-m", "aetv2_tf.train",
                           "--flagfile=configs/cifar10_probe_knn.cfg",
                           f"--pretrained={results / run}", f"--model_dir={model_dir}",
                           "--overwrite", "--verbose=0"], cwd=legs.REPO,
                          capture_output=True, text=True)
    if proc.returncode:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        return "failed"
    return f"{json.loads((model_dir / 'results.json').read_text())['test_top1']:.2f}"


def land(returned: pathlib.Path, results: pathlib.Path, knn: bool = False,
         work: pathlib.Path | None = None) -> int:
    """Lands the leg in ``returned`` (module docstring); returns its number."""
    record = read_leg(returned)
    number = next_leg(results)
    landed = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run, entry in record["runs"].items():
            if not entry.get("parts"):
                print(f"{run}: nothing returned (no checkpoint written in this leg)")
                continue
            extract(run, joined_tar(returned, run, entry), pathlib.Path(tmp),
                    entry["checkpoint"]["file"])
            landed[run] = checked_run(run, entry, pathlib.Path(tmp) / run, results / run,
                                      record.get("images"))
        for run, entry in landed.items():  # every run checked before any is installed
            install(pathlib.Path(tmp) / run, results / run, entry["checkpoint"])
    (results / "legs").mkdir(parents=True, exist_ok=True)
    pack.write_bytes(results / "legs" / f"leg-{number}.json", (returned / "leg.json").read_bytes())
    if (returned / "console.txt").is_file():
        shutil.copyfile(returned / "console.txt", results / "legs" / f"leg-{number}.txt")
    ledger = results / LEDGER
    text = ledger.read_text() if ledger.is_file() else LEDGER_INTRO + LEDGER_HEADER
    for run, entry in landed.items():
        score = knn_top1(results, run, number, work or legs.REPO / "runs" / "campaign_knn") \
            if knn else "-"
        text += ledger_row(number, record, run, entry, spent_seconds(results, run), score)
        print(f"{run}: landed at step {entry['steps']:,} (KNN {score})")
    pack.write_bytes(ledger, text.encode())
    return number


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("returned", type=pathlib.Path, help="the folder the device tool returned")
    p.add_argument("--results", type=pathlib.Path, default=legs.RESULTS)
    p.add_argument("--knn", action="store_true", help="score each landed run (minutes)")
    p.add_argument("--work", type=pathlib.Path, default=None,
                   help="where the KNN probes run (default runs/campaign_knn)")
    args = p.parse_args(argv)
    try:
        number = land(args.returned, args.results, args.knn, args.work)
    except (LandingError, ValueError, OSError, tarfile.TarError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"leg {number} landed in {args.results}; commit it: git add {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
