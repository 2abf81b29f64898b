"""What a leg returned, put into results/campaign/ with its ledger rows: run on this machine.

    python -m experiments.campaign.land <the folder the device tool returned> [--knn]

For each run that `leg` shipped: its parts joined and checked against the tar's SHA-256 in
``leg.json``, the tar's members checked (only `leg.SHIPPED` files and one checkpoint of that
run, no links), the checkpoint checked against its ``.sha256``, then installed in
``results/campaign/<run>/``: the new checkpoint replaces the run's previous one (a leg that did
not move the run forward is refused), the flags and the training log replace theirs. The leg's
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
import shutil
import subprocess
import sys
import tarfile
import tempfile

from experiments.campaign import leg as legs
from experiments.campaign import pack

LEDGER = "LEDGER.md"
LEDGER_HEADER = (
    "| leg | date | device | run | steps | pairs | wall (s) | pairs/s | loss | checkpoint "
    "SHA-256 | authors' KNN (%) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
LEDGER_INTRO = """# The campaign's ledger: one row per run per leg

Each leg is `python -m experiments.campaign.leg` on a lent device (docs/campaign.md), landed here
by `python -m experiments.campaign.land`; steps and pairs are the run's totals after the leg,
wall and pairs/s the leg's own (start-up and compilation included in the wall time), the loss the
mean of the run's last logged interval, the KNN the authors' protocol on this repository's CPU
(50,000 vs 10,000 images). The paper's Table 2 KNN: AETv1 77.61, AETv2 78.74 (1,500 epochs =
75 M pairs each).

"""


class LandingError(ValueError):
    """What a leg returned cannot be landed; the message says why and what to do."""


def read_leg(returned: pathlib.Path) -> dict:
    path = returned / "leg.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LandingError(f"{path}: not readable ({e}); nothing was landed") from e
    if not isinstance(record, dict) or not isinstance(record.get("runs"), dict):
        raise LandingError(f"{path} is not a leg's record; nothing was landed")
    return record


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


def install(run: str, staged: pathlib.Path, target: pathlib.Path) -> dict:
    """The staged run folder's files into ``target`` (the run's folder in results/campaign),
    the previous checkpoint (written by an earlier landing) removed; returns the new one."""
    new = legs.checked_checkpoint(staged)
    if new is None:
        raise LandingError(f"{run}: the returned files hold no checkpoint")
    old = legs.newest_checkpoint(target) if target.is_dir() else None
    if old is not None and old[0] >= new["step"]:
        raise LandingError(f"{run}: the returned checkpoint (step {new['step']}) is not past "
                           f"the one in {target} (step {old[0]}); nothing was landed")
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
    return new


def ledger_row(number: int, record: dict, run: str, entry: dict, knn: str = "-") -> str:
    def value(key, fmt="{}"):
        return fmt.format(entry[key]) if entry.get(key) is not None else "-"

    return (f"| {number} | {record.get('started', '-')[:10]} | {record.get('device', '-')} | "
            f"{run} | {value('steps', '{:,}')} | {value('pairs', '{:,}')} | "
            f"{value('wall_s', '{:.0f}')} | {value('pairs_per_sec', '{:,.0f}')} | "
            f"{value('loss', '{:.4f}')} | `{entry['checkpoint']['sha256'][:16]}` | {knn} |\n")


def completed(entry: dict, staged: pathlib.Path) -> dict:
    """The run's entry with its steps and pairs after the leg: leg.json's, else (a record
    written before the run's end, the leg cut by the tool) the step of the checkpoint it
    shipped and that times the batch of the flags shipped with it."""
    steps = entry.get("steps")
    if steps is None:
        steps = entry["checkpoint"]["step"]
    pairs = entry.get("pairs")
    if pairs is None:
        pairs = steps * int(json.loads((staged / "flags.json").read_text())["batch_size"])
    return dict(entry, steps=steps, pairs=pairs)


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
            if run not in legs.RUNS:
                raise LandingError(f"leg.json names the run {run!r}, not one of {list(legs.RUNS)}")
            if not entry.get("parts"):
                print(f"{run}: nothing returned (no checkpoint written in this leg)")
                continue
            extract(run, joined_tar(returned, run, entry), pathlib.Path(tmp),
                    entry["checkpoint"]["file"])
            landed[run] = entry
        for run, entry in landed.items():  # every run checked before any is installed
            new = install(run, pathlib.Path(tmp) / run, results / run)
            if new["sha256"] != entry["checkpoint"]["sha256"]:
                raise LandingError(f"{run}: installed checkpoint differs from leg.json's")
            landed[run] = completed(entry, pathlib.Path(tmp) / run)
    (results / "legs").mkdir(parents=True, exist_ok=True)
    pack.write_bytes(results / "legs" / f"leg-{number}.json", (returned / "leg.json").read_bytes())
    if (returned / "console.txt").is_file():
        shutil.copyfile(returned / "console.txt", results / "legs" / f"leg-{number}.txt")
    ledger = results / LEDGER
    text = ledger.read_text() if ledger.is_file() else LEDGER_INTRO + LEDGER_HEADER
    for run, entry in landed.items():
        score = knn_top1(results, run, number, work or legs.REPO / "runs" / "campaign_knn") \
            if knn else "-"
        text += ledger_row(number, record, run, entry, score)
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
