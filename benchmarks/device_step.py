"""The prepared GPU measurement of the AETv2 pretraining step, in ONE device command: today's
step, the new steps and a PyTorch peer side by side, and where a step's time goes.

    python3 -m benchmarks.device_step --output=$OUT          # the device (Keras on JAX, no TF)
    python -m benchmarks.device_step --tiny --output=DIR     # a CPU dry run: batch 8, a few steps
    python -m benchmarks.device_step --summary=DIR           # the table of a returned folder

BENCHMARKS.md, "GPU step: the prepared measurement", has the call (`device_call`), its time
within a loan and what to do with its numbers. Three parts, each a child process stopped at its
limit (`LIMITS`): ``keras`` (`benchmarks.keras_step`: the default AETv2 step through
``model.fit`` in three forms, pairs/s and numerics), ``breakdown`` (`benchmarks.step_breakdown`:
the step without ``fit`` and its jitted pieces) and ``torch`` (`benchmarks.torch_peer`).

A part prints each number and appends it as one JSON line to ``device_step.jsonl`` the moment
it exists (`Records`, flushed and synced); this process copies every line the parts print into
``console.txt`` as it comes (`common.tee`); at the end ``device_step.json`` gathers the records
(`gather`) with each part's exit, and the summary table closes the console: a command cut at
any second returns all but the piece in flight. A part's `Clock` skips a piece that would not
end before the part's deadline, its compilation counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from benchmarks.common import REPO, line_writer, tee

#: The first execution (mostly its compilation) of the default AETv2 step, batch 512 and
#: ``steps_per_execution`` 10: 18.0 s on an H200, 20.8 s on an H100 (the first 200 steps' time
#: less 200 steps at the next interval's rate: results/scale/aetv2_recipe/train/log.csv,
#: results/loss_screen/recipe_s0/train/log.csv). A `Clock` counts compilations in these units
#: until it has timed one.
STEP_COMPILE_S = 21.0
#: Each part's limit on a device in seconds, `PLAN_S` in all; the command's ``timeout_s`` adds
#: the wheels' install (~10 s) and a margin.
LIMITS = {"keras": 190, "breakdown": 130, "torch": 110}
TINY_LIMITS = {"keras": 400, "breakdown": 400, "torch": 200}
PLAN_S, TIMEOUT_S = sum(LIMITS.values()), 480
#: What a device command runs first: the wheels of Keras, namex and optree (carried in the
#: ignored ``.whl/``), and the environment of Keras on JAX.
SETUP = ("{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
         "--upgrade --target {site} .whl/*.whl && export PYTHONPATH={site}:$PWD "
         "KERAS_BACKEND=jax PYTHONUNBUFFERED=1")
JSONL, JSON, CONSOLE = "device_step.jsonl", "device_step.json", "console.txt"


def device_command(python: str = "python3", site: str = "/tmp/site", flags: str = "",
                   install: bool = True) -> str:
    """The device call's command; ``install=False`` leaves the wheels' install out (a CPU dry
    run, whose ``site`` holds what replaces them there)."""
    setup = SETUP.format(python=python, site=site)
    if not install:
        setup = setup.split(" && ", 1)[1]
    return f"{setup} && {python} -m benchmarks.device_step --output=$OUT{flags}"


def device_call() -> str:
    """The `run` tool call, as BENCHMARKS.md writes it."""
    return (f'run(command="{device_command()}", carry=[".whl"], timeout_s={TIMEOUT_S})')


class Records:
    """A part's measurements: each printed and appended at once to the JSON-lines file
    ``path`` (None: printed only) as ``{"part", "name", "event", "at_s", **fields}``."""

    def __init__(self, path: pathlib.Path | None, part: str):
        self.path, self.part, self.start = path, part, time.time()

    def add(self, name: str, event: str, text: str, **fields) -> None:
        print(text, flush=True)
        if self.path is None:
            return
        line = json.dumps({"part": self.part, "name": name, "event": event,
                           "at_s": round(time.time() - self.start, 1), **fields}, default=float)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


class Clock:
    """A part's deadline (``time.time()`` seconds) and what one step-sized compilation is
    expected to take here (`STEP_COMPILE_S` until the part has measured one)."""

    def __init__(self, deadline: float, compile_s: float = STEP_COMPILE_S):
        self.deadline, self.compile_s = deadline, compile_s

    def left(self) -> float:
        return self.deadline - time.time()

    def allows(self, records: Records, name: str, compiles: float, seconds: float) -> bool:
        """Whether ``name``, ``compiles`` step-sized compilations and ``seconds`` of running,
        ends before the deadline; if not, its skip is recorded."""
        need, left = compiles * self.compile_s + seconds, self.left()
        if need <= left:
            return True
        records.add(name, "skipped", f"{name}: skipped: it needs about {need:.0f} s "
                    f"(compilation included), {left:.0f} s are left", need_s=round(need, 1),
                    left_s=round(left, 1))
        return False

    def compiled(self, seconds: float, compiles: float = 1.0) -> None:
        """A compilation of ``compiles`` steps' size took ``seconds``: later estimates use it."""
        self.compile_s = seconds / compiles


def part_parser(doc: str) -> argparse.ArgumentParser:
    """The flags a part takes (`part_command` gives them)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512, help="pairs (probe: images) per step")
    p.add_argument("--spe", "--steps_per_execution", type=int, default=10)
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per variant")
    p.add_argument("--records", type=pathlib.Path, default=None, help="a JSON-lines file")
    p.add_argument("--deadline", type=float, default=float("inf"), help="time.time() to end by")
    p.add_argument("--tiny", action="store_true", help="a CPU dry run")
    return p


def part_command(part: str, args: argparse.Namespace, deadline: float) -> list[str]:
    module = {"keras": "benchmarks.keras_step", "breakdown": "benchmarks.step_breakdown",
              "torch": "benchmarks.torch_peer"}[part]
    return [sys.executable, "-m", module, f"--batch={args.batch}", f"--spe={args.spe}",
            f"--seconds={args.seconds}", f"--records={args.output / JSONL}",
            f"--deadline={deadline:.0f}", *(["--numerics"] if part == "keras" else []),
            *(["--tiny"] if args.tiny else [])]


def run_part(part: str, args: argparse.Namespace, limit: float, say) -> dict:
    """The part in a child process of its own session, its output copied line by line to
    ``say``, killed at ``limit`` seconds; whatever it started and left running is ended with it
    (the device tool would leave a new session's processes running); its exit and wall time."""
    command = part_command(part, args, time.time() + limit - 5)
    say(f"== {part} (limit {limit:.0f} s): {' '.join(command[1:3])}\n")
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    copier = tee(proc.stdout, say)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        code = "timed out"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    copier.join(10)
    return {"exit": code, "wall_s": round(time.perf_counter() - start, 1)}


def gather(jsonl: pathlib.Path) -> dict:
    """The records of ``jsonl`` as ``{part: {name: fields}}``: each name's records merged in
    order (a ``repeat`` record's rate appended to ``repeats``); unreadable lines (a line cut by
    a kill) left out."""
    out: dict = {}
    lines = jsonl.read_text(errors="replace").splitlines() if jsonl.is_file() else []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        row = out.setdefault(record.pop("part"), {}).setdefault(record.pop("name"), {})
        if record.pop("event") == "repeat":
            row.setdefault("repeats", []).append(record["pairs_per_s"])
        else:
            row.update({k: v for k, v in record.items() if k != "at_s"})
    return out


def summary(results: dict) -> list[str]:
    """The comparison table: pairs/s of each Keras variant and of the PyTorch peer against
    today's step (``keras two_pass``), and the device-alone rate of the breakdown."""
    base = results.get("keras", {}).get("two_pass", {}).get("pairs_per_s")

    def row(name: str, rate: float | None) -> str:
        ratio = f"{rate / base:.2f}" if rate and base else "-"
        return f"| {name} | {f'{rate:,.0f}' if rate else 'skipped'} | {ratio} |"

    lines = ["| step | pairs/s | x today's |", "|---|---|---|"]
    for part in ("keras", "torch"):
        lines += [row(f"{part} {name}", fields.get("pairs_per_s"))
                  for name, fields in results.get(part, {}).items()
                  if "pairs_per_s" in fields or "need_s" in fields]
    loop = results.get("breakdown", {}).get("step_in_loop", {})
    if "pairs_per_s" in loop:
        lines.append(row("breakdown step_in_loop (no fit)", loop["pairs_per_s"]))
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("OUT", "device_step_out")))
    p.add_argument("--tiny", action="store_true", help="batch 8, short runs: a CPU dry run")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--spe", type=int, default=10, help="steps_per_execution")
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per variant")
    p.add_argument("--parts", default=",".join(LIMITS))
    p.add_argument("--summary", type=pathlib.Path, default=None,
                   help="print the table of a returned folder (its device_step.jsonl) and exit")
    args = p.parse_args(argv)
    if unknown := set(args.parts.split(",")) - set(LIMITS):
        p.error(f"unknown parts {sorted(unknown)}; the parts: {list(LIMITS)}")
    if args.tiny:
        args.batch, args.spe, args.seconds = 8, 2, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.summary is not None:
        print("\n".join(summary(gather(args.summary / JSONL))))
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / JSONL).unlink(missing_ok=True)
    limits = TINY_LIMITS if args.tiny else LIMITS
    with open(args.output / CONSOLE, "w") as console:
        say = line_writer(sys.stdout, console)
        say(f"device_step: {' '.join(sys.argv)}; parts {args.parts}, batch {args.batch}, "
            f"steps_per_execution {args.spe}\n")
        start, exits = time.perf_counter(), {}
        for part in args.parts.split(","):
            exits[part] = run_part(part, args, limits[part], say)
            say(f"== {part}: exit {exits[part]['exit']} after {exits[part]['wall_s']} s\n")
        results = gather(args.output / JSONL)
        for part, outcome in exits.items():
            results.setdefault(part, {})["exit"] = outcome
        results.update(command=" ".join(sys.argv), tiny=args.tiny,
                       wall_s=round(time.perf_counter() - start, 1))
        (args.output / JSON).write_text(json.dumps(results, indent=1, default=str))
        say("\n".join(["== summary", *summary(results), f"wall {results['wall_s']} s", ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
