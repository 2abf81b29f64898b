"""One leg of the campaign, on a device machine: each campaign run resumed from its checkpoint in
results/campaign/, trained until a deadline, and its newest checkpoint returned through $OUT.

    python3 -m experiments.campaign.leg --out=$OUT --seconds=480

The campaign's runs (`RUNS`) are the two of the paper's CIFAR-10 experiment, each a flagfile of
1,500 epochs at batch 512, so that the learning-rate schedule is the whole campaign's and a leg
only moves a run along it. A leg, for each run of ``--runs`` in turn (``--mode=parallel``: all at
once, each process with its share of the device's memory):

1. copies ``results/campaign/<run>/`` (flags, training log, the newest checkpoint and its
   ``.sha256``) to ``--work/<run>``, checking the checkpoint's SHA-256 (the training program
   checks it again before it resumes: weights, optimizer state, data position, sampler state);
2. runs ``python -m aetv2_tf.train --flagfile=<the run's config> <LEG_FLAGS> --model_dir=...
   --stop_after_seconds=<its share of what is left>``, which ends at that deadline with a
   checkpoint;
3. packs what `land` needs (`SHIPPED`: flags, log, the newest checkpoint) into ``<run>.tar``,
   split into parts of at most `PART_BYTES` (the tool returns files of at most 16 MiB), in
   ``--out``; it does so each time the run writes a checkpoint, so a leg cut short by the tool's
   limit still returns the run's last checkpoint (what is under $OUT comes back).

``--out/leg.json`` (rewritten after every shipment) says how many images the runs train on and
what each run did: steps before and after, pairs, wall time, pairs/s, the checkpoint's and the
tar's SHA-256 (from the moment a checkpoint is shipped: a leg cut by the tool still names its
step, its pairs and its rate from the run's start to that checkpoint), and once the run's
process has ended its final loss and exit status. ``--out/console.txt`` has everything
printed, each run's output line by line while it trains (prefixed ``[<run>]``). The data is
the JPEG pack (`experiments.campaign.pack`, carried as an ignored folder), unpacked and checked
first.
`experiments.campaign.land` puts the returned files into results/campaign/ and adds the ledger
rows; docs/campaign.md has the whole procedure.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time

from benchmarks.common import line_writer, tee
from experiments.campaign import pack

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "campaign"
#: The campaign's runs and their flagfiles (the same at every leg: a resumed run's flags are
#: checked against the ones it was started with).
RUNS = {"aetv1": "configs/cifar10_aetv1_official.cfg", "aetv2": "configs/cifar10_aetv2.cfg"}
#: The flags every leg adds to a run's flagfile (none of them changes the run's course).
LEG_FLAGS = ("--batch_norm=keras", "--steps_per_execution=20", "--checkpoint_every_steps=2000",
             "--keep_checkpoints=1", "--summary_every_steps=500", "--export=false",
             "--quick_knn_train=0", "--verbose=0")
#: What a leg returns of a run (paths in its model_dir; the newest checkpoint is added).
SHIPPED = ("flags.json", "flags.cfg", "flags_history.jsonl", "train/log.csv")
CHECKPOINT = re.compile(r"^ckpt-(\d+)\.weights\.h5$")
PART_BYTES = 15 * 2**20


def newest_checkpoint(model_dir: pathlib.Path) -> tuple[int, pathlib.Path] | None:
    """(step, path) of the newest ``checkpoints/ckpt-<step>.weights.h5``, or None."""
    found = [(int(m.group(1)), p) for p in (model_dir / "checkpoints").glob("ckpt-*.weights.h5")
             if (m := CHECKPOINT.match(p.name))]
    return max(found) if found else None


def file_sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checked_checkpoint(model_dir: pathlib.Path) -> dict | None:
    """The newest checkpoint of ``model_dir`` as {step, file, sha256}, its SHA-256 checked
    against the ``.sha256`` written with it (a mismatch or a missing digest: ValueError)."""
    newest = newest_checkpoint(model_dir)
    if newest is None:
        return None
    step, path = newest
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        raise ValueError(f"{path} has no {sidecar.name}: a checkpoint without its digest is "
                         "not resumed; restore both from git")
    digest = file_sha256(path)
    if sidecar.read_text().split()[:1] != [digest]:
        raise ValueError(f"{path}: its SHA-256 is not the one in {sidecar.name}: damaged; "
                         "restore it from git")
    return dict(step=step, file=f"checkpoints/{path.name}", sha256=digest)


def ship(run: str, model_dir: pathlib.Path, out: pathlib.Path) -> dict | None:
    """Packs the run's `SHIPPED` files and newest checkpoint into ``out/<run>.tar[.<i>]``
    (parts of at most `PART_BYTES`; stale parts removed); returns {checkpoint, tar_sha256,
    parts}, or None before its first checkpoint."""
    checkpoint = checked_checkpoint(model_dir)
    if checkpoint is None:
        return None
    names = [n for n in SHIPPED if (model_dir / n).is_file()]
    names += [checkpoint["file"], checkpoint["file"] + ".sha256"]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            tar.add(model_dir / name, arcname=f"{run}/{name}")
    data = buffer.getvalue()
    chunks = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    parts = [f"{run}.tar.{i}" for i in range(len(chunks))]
    for stale in out.glob(f"{run}.tar.*"):
        if stale.name not in parts:
            stale.unlink()
    for name, chunk in zip(parts, chunks, strict=True):
        pack.write_bytes(out / name, chunk)
    return dict(checkpoint=checkpoint, tar_sha256=hashlib.sha256(data).hexdigest(), parts=parts)


def done_summary(output: str) -> dict[str, str]:
    """The program's last ``Done (pretext): k=v, ... Outputs in DIR`` line (``Stopped (pretext)
    at step S of M: k=v, ...`` for a leg's deadline) as {k: v} ({}: none)."""
    line = next((ln for ln in reversed(output.splitlines())
                 if ln.startswith(("Done (", "Stopped ("))), None)
    if line is None:
        return {}
    body = line.split(": ", 1)[1].rsplit(". Outputs in ", 1)[0]
    return dict(item.split("=", 1) for item in body.split(", ") if "=" in item)


class Leg:
    """The leg's state: its clock, its console, its `leg.json` (module docstring)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.out = args.out
        self.console = open(self.out / "console.txt", "a")  # noqa: SIM115 - the leg's own log
        self.lock = threading.Lock()  # the runs' output threads and the leg write to it
        self.write = line_writer(sys.stdout, self.console)
        self.record = dict(started=time.strftime("%Y-%m-%d %H:%M:%S %Z"), device=device(),
                           seconds=args.seconds, mode=args.mode, leg_flags=list(LEG_FLAGS),
                           train_flags=args.train_flag, runs={})

    def say(self, text: str) -> None:
        self.echo(f"[leg +{time.monotonic() - self.started:5.0f} s] {text}\n")

    def echo(self, line: str) -> None:
        """``line`` (ending in a newline) to stdout and the console file, at once."""
        with self.lock:
            self.write(line)

    def save(self) -> None:
        self.record["ended"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        pack.write_bytes(self.out / "leg.json", (json.dumps(self.record, indent=1) + "\n").encode())

    def left(self) -> float:
        return self.args.seconds - (time.monotonic() - self.started)


def device() -> str:
    """The accelerator, as nvidia-smi names it, or "cpu"."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    return "cpu"


def prepare_run(run: str, args: argparse.Namespace) -> tuple[pathlib.Path, dict | None]:
    """``--work/<run>`` as a copy of the run's results folder; returns it and the checkpoint it
    resumes from (checked)."""
    model_dir = args.work / run
    if model_dir.exists():
        shutil.rmtree(model_dir)
    source = args.results / run
    if source.is_dir():
        shutil.copytree(source, model_dir, symlinks=False)
    else:
        model_dir.mkdir(parents=True)
    return model_dir, checked_checkpoint(model_dir)


def command(run: str, model_dir: pathlib.Path, data: pathlib.Path, seconds: float,
            args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "aetv2_tf.train", f"--flagfile={RUNS[run]}", *LEG_FLAGS,
            f"--model_dir={model_dir}", f"--data_dir={data}",
            f"--stop_after_seconds={max(seconds, 1.0):.0f}", *args.train_flag]


def train(leg: Leg, runs: list[str], data: pathlib.Path) -> None:
    """Trains ``runs`` (together or one after the other), shipping each run's newest checkpoint
    as it appears and once its process has ended."""
    args = leg.args
    batches = [runs] if args.mode == "parallel" else [[run] for run in runs]
    for i, batch in enumerate(batches):
        seconds = leg.left() / (len(batches) - i) - args.reserve
        procs = {}
        for run in batch:
            entry = leg.record["runs"].setdefault(run, {})
            try:
                model_dir, resumed = prepare_run(run, args)
            except ValueError as e:  # its checkpoint is damaged: the run is left as it is
                entry.update(exit=2, error=str(e))
                leg.say(f"error: {run}: {e}")
                leg.save()
                continue
            entry.update(flagfile=RUNS[run], resumed_from=resumed, exit=None)
            cmd = command(run, model_dir, data, seconds, args)
            env = dict(os.environ)
            if args.mode == "parallel":
                env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{0.9 / len(batch):.2f}"
            leg.say(f"{run}: from step {resumed['step'] if resumed else 0}, {seconds:.0f} s: "
                    + " ".join(cmd[1:]))
            log = open(args.work / f"{run}.log", "w")  # noqa: SIM115 - closed below
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace")
            copier = tee(proc.stdout, line_writer(log), lambda line, r=run: leg.echo(
                f"[{r}] {line}"))
            procs[run] = (proc, log, copier, model_dir, time.monotonic())
        shipped = {run: None for run in batch}
        while procs:
            time.sleep(args.poll)
            for run, (proc, log, copier, model_dir, t0) in list(procs.items()):
                newest = newest_checkpoint(model_dir)
                if newest and newest[0] != shipped[run]:
                    shipped[run] = newest[0]
                    with contextlib.suppress(ValueError, OSError):  # mid-write: next poll
                        record_shipment(leg, run, model_dir, time.monotonic() - t0)
                if proc.poll() is None:
                    continue
                copier.join(30)
                log.close()
                del procs[run]
                finish(leg, run, proc.returncode, model_dir, time.monotonic() - t0)


def record_shipment(leg: Leg, run: str, model_dir: pathlib.Path, wall: float) -> None:
    """The run's newest checkpoint shipped (`ship`; nothing before its first) and what it says
    recorded in leg.json at once: its step, the run's pairs, the leg's wall time and its rate
    so far (from the run's start and its resumed step: start-up and compilation included), so
    that a leg the tool cuts before the run ends still lands with them."""
    entry = leg.record["runs"][run]
    shipment = ship(run, model_dir, leg.args.out)
    if shipment is None:
        return
    batch = run_batch(model_dir)
    start = (entry.get("resumed_from") or {}).get("step", 0)
    steps = shipment["checkpoint"]["step"]
    entry.update(shipment, start_step=start, steps=steps, pairs=steps * batch,
                 wall_s=round(wall, 1),
                 pairs_per_sec=round((steps - start) * batch / max(wall, 1e-9), 1))
    leg.save()


def run_batch(model_dir: pathlib.Path) -> int:
    """The run's ``--batch_size`` (its ``flags.json``, written first by every start)."""
    return int(json.loads((model_dir / "flags.json").read_text())["batch_size"])


def finish(leg: Leg, run: str, code: int, model_dir: pathlib.Path, wall: float) -> None:
    """After a run's process: its newest checkpoint shipped and recorded, then the program's
    own summary (steps, its rate from its first step, the final loss) and exit status."""
    summary = done_summary((leg.args.work / f"{run}.log").read_text(errors="replace"))
    record_shipment(leg, run, model_dir, wall)
    entry = leg.record["runs"][run]
    entry.update(exit=code, wall_s=round(wall, 1), summary=summary)
    if summary:
        steps = int(summary["steps"])
        entry.update(start_step=int(summary["start_step"]), steps=steps,
                     pairs=steps * run_batch(model_dir),
                     pairs_per_sec=float(summary["pairs_per_sec"]),
                     loss=float(summary["loss"]) if "loss" in summary else None)
    leg.save()
    leg.say(f"{run}: exit {code} after {wall:.0f} s, "
            f"step {entry.get('start_step', '?')} -> {entry.get('steps', '?')}, "
            f"{entry.get('pairs_per_sec', '?')} pairs/s, loss {entry.get('loss', '?')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, required=True, help="what comes back ($OUT)")
    p.add_argument("--seconds", type=float, default=480.0,
                   help="the leg's length from its start to the last deadline (the device "
                        "tool's 600 s per command less the start-up, shipping and a margin)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {list(RUNS)}")
    p.add_argument("--mode", choices=("sequential", "parallel"), default="sequential")
    p.add_argument("--pack", type=pathlib.Path, default=pack.DEFAULT_PACK)
    p.add_argument("--results", type=pathlib.Path, default=RESULTS)
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/campaign"))
    p.add_argument("--reserve", type=float, default=10.0,
                   help="seconds kept back from each run's share (its last step, checkpoint)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between checkpoint checks")
    p.add_argument("--train_flag", action="append", default=[],
                   help="an extra training flag for every run (tests: a tiny run)")
    args = p.parse_args(argv)
    runs = args.runs.split(",")
    if unknown := [r for r in runs if r not in RUNS]:
        p.error(f"unknown runs {unknown}; the campaign's: {list(RUNS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    leg = Leg(args)
    data = args.work / "data" / "cifar-10-batches-py"
    try:
        for note in pack.unpack(args.pack, data):
            leg.say(f"note: {note}")
    except pack.PackError as e:
        leg.say(f"error: {e}")
        return 2
    leg.record["images"] = pack.read_manifest(args.pack)["images"]
    leg.say(f"data: {args.pack}'s {leg.record['images']:,} images unpacked into {data}; "
            f"device: {leg.record['device']}")
    leg.save()
    train(leg, runs, data)
    leg.say("leg done: " + ", ".join(f"{r} exit {e.get('exit')}"
                                      for r, e in leg.record["runs"].items()))
    return max((e.get("exit") or 0 for e in leg.record["runs"].values()), default=0)


if __name__ == "__main__":
    sys.exit(main())
