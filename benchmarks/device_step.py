"""The prepared GPU measurement of the AETv2 pretraining step: today's step, the new steps and
a PyTorch peer side by side, with where a step's time goes, in one command of <= 8 minutes.

    python3 -m benchmarks.device_step --output=$OUT     # the device (Keras on JAX, no TF)
    python -m benchmarks.device_step --tiny --output=DIR  # a CPU: batch 8, a few steps

BENCHMARKS.md, "GPU step: the prepared measurement", has the device call. Three parts, each a
child process with its own time limit (a part cut short reports what it finished):

* ``keras``: the default AETv2 pretext model built as the training program builds it
  (`aetv2_tf.program.pretext_stage.build_model`: the flags of configs/cifar10_aetv2.cfg, the
  recipe's `Recipe.build_model` and the model's own ``compile(steps=...)``), mixed_bfloat16,
  per-branch BatchNorm, the pairs sampled and warped inside the jitted step, ``steps_per_execution``
  ``--spe``, fed by ``model.fit`` from a NumPy array of uint8 images as the program feeds it.
  `VARIANTS`: today's two encoder calls (``two_pass``), one call with per-half statistics
  (``one_pass``), and that with the SVD-free projection (``one_pass_newton``). For each: the
  first execution (compilation, reported apart), then pairs/s over ``--seconds``; first, on one
  batch, each variant's loss and gradients against ``two_pass``'s and against the float32
  ``two_pass`` step's (the numerics: same weights, same pairs; the second says how far
  bfloat16 alone moves them).
* ``breakdown`` (`benchmarks.step_breakdown`): separately jitted pieces at the same shapes, and
  the whole train step without ``fit``: ms per step of each.
* ``torch`` (`benchmarks.torch_peer`): the same NIN, decoder and loss in PyTorch
  (torch.compile, channels_last, bfloat16 autocast, CUDA when there is one).

Writes ``console.txt`` (everything printed) and ``device_step.json`` (every number) to
``--output``. ``--tiny``: batch 8, short limits, for a test on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from benchmarks.device_model import build, run_config

REPO = pathlib.Path(__file__).resolve().parents[1]
#: The Keras steps timed: how per-branch BatchNorm is computed and how P is projected.
VARIANTS = {"two_pass": (False, "svd"), "one_pass": (True, "svd"),
            "one_pass_newton": (True, "newton")}
#: Each part's time limit in seconds on a device (``--tiny``: `TINY_LIMITS`).
LIMITS = {"keras": 200, "breakdown": 130, "torch": 110}
TINY_LIMITS = {"keras": 300, "breakdown": 300, "torch": 120}


def loss_and_gradients(model, images) -> tuple:
    """The training loss and every trainable gradient at the model's weights, one batch,
    through the jitted stateless step (nothing of the model changes)."""
    import functools

    import jax
    import numpy as np

    values = [[v.value for v in vs] for vs in (model.trainable_variables,
                                               model.non_trainable_variables,
                                               model.metrics_variables,
                                               model.optimizer.variables)]
    fn = jax.jit(jax.value_and_grad(functools.partial(model.compute_loss_and_updates,
                                                      training=True), has_aux=True))
    (_, (loss, *_)), grads = fn(values[0], values[1], values[2], images, None, None,
                                optimizer_variables=values[3])
    return float(loss), [np.asarray(g, np.float32) for g in grads]


def _distance(grads: list, reference: list) -> float:
    """The largest gradient difference over the largest reference gradient entry."""
    import numpy as np

    scale = max(float(np.max(np.abs(g))) for g in reference)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(grads, reference, strict=True)) \
        / scale


def keras_part(args, deadline: float) -> dict:
    import keras
    import numpy as np

    config = run_config(args.batch, args.spe)
    rng = np.random.default_rng(0)
    size = config.image_size
    images = rng.integers(0, 256, (args.batch * args.spe * 4, size, size, 3), np.uint8)
    out = {"batch": args.batch, "spe": args.spe, "policy": "mixed_bfloat16",
           "backend": keras.backend.backend(), "variants": {}}
    # The float32 two-call step on the same batch: how far bfloat16 alone moves the numbers.
    _, model = build(config, False, "svd", "float32")
    exact = loss_and_gradients(model, images[:args.batch])
    del model
    keras.backend.clear_session()
    reference = None
    for name, (one_pass, projection) in VARIANTS.items():
        if time.time() + args.seconds + 20 > deadline:
            out["variants"][name] = {"skipped": "the part's time limit"}
            print(f"{name}: skipped (the part's time limit)", flush=True)
            continue
        start = time.perf_counter()
        _, model = build(config, one_pass, projection)
        row = {"batch_groups": model.batch_groups, "projection": projection,
               "build_s": time.perf_counter() - start}
        loss, grads = loss_and_gradients(model, images[:args.batch])
        if reference is None:
            reference = (loss, grads)
        row["numerics"] = {"loss": loss, "loss_vs_two_pass": abs(loss - reference[0]),
                           "grad_vs_two_pass": _distance(grads, reference[1]),
                           "loss_vs_float32": abs(loss - exact[0]),
                           "grad_vs_float32": _distance(grads, exact[1])}

        def fit(steps: int, model=model) -> float:
            begin = time.perf_counter()
            history = model.fit(images, batch_size=args.batch, epochs=max(1, steps // args.spe),
                                steps_per_epoch=min(steps, args.spe), shuffle=False, verbose=0)
            float(history.history["loss"][-1])  # the last step has finished
            return time.perf_counter() - begin

        row["first_execution_s"] = fit(args.spe)  # compilation
        row["warm_s"] = fit(args.spe)
        repeats = 1 if args.tiny else 3
        steps = args.spe * max(1, round(args.seconds / repeats / max(row["warm_s"], 1e-3)))
        rates = [steps * args.batch / fit(steps) for _ in range(repeats)]
        row.update(steps_per_repeat=steps, pairs_per_s=sorted(rates)[len(rates) // 2],
                   rates=rates)
        out["variants"][name] = row
        print(f"{name}: {row['pairs_per_s']:,.0f} pairs/s (repeats "
              f"{', '.join(f'{r:,.0f}' for r in rates)}; {steps} steps each), first execution "
              f"{row['first_execution_s']:.1f} s, batch_groups {model.batch_groups}, loss "
              f"{loss:.5f}; vs two_pass: loss {row['numerics']['loss_vs_two_pass']:.2e}, "
              f"gradients {row['numerics']['grad_vs_two_pass']:.2e} of the largest; vs the "
              f"float32 two_pass: {row['numerics']['loss_vs_float32']:.2e}, "
              f"{row['numerics']['grad_vs_float32']:.2e}", flush=True)
        del model
        keras.backend.clear_session()
    return out


def run_part(part: str, args, limit: float, output: pathlib.Path, console: list) -> dict:
    """The part in a child process, stopped at ``limit`` seconds; its JSON (or why none)."""
    result_file = output / f"{part}.json"
    result_file.unlink(missing_ok=True)
    module = "benchmarks.torch_peer" if part == "torch" else "benchmarks.device_step"
    command = [sys.executable, "-m", module, f"--batch={args.batch}", f"--spe={args.spe}",
               f"--seconds={args.seconds}", f"--json={result_file}",
               f"--deadline={time.time() + limit - 5:.0f}"]
    if part != "torch":
        command.append(f"--part={part}")
    if args.tiny:
        command.append("--tiny")
    header = f"== {part} (limit {limit:.0f} s): {' '.join(command[1:3])}"
    print(header, flush=True)
    console.append(header)
    start = time.perf_counter()
    log = output / f"{part}.log"
    with open(log, "w") as stream:
        try:
            code = subprocess.run(command, cwd=REPO, stdout=stream, stderr=subprocess.STDOUT,
                                  timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = "timed out"
    text = log.read_text(errors="replace")
    log.unlink()
    shown = [line for line in text.splitlines() if not line.startswith(("WARNING:", "I0000"))]
    print("\n".join(shown), flush=True)
    console.extend(shown)
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    result_file.unlink(missing_ok=True)
    result.update(exit=code, wall_s=round(time.perf_counter() - start, 1))
    if code != 0:
        result.setdefault("error", text.strip().splitlines()[-1:] or [f"exit {code}"])
    return result


def summary(results: dict) -> list[str]:
    """The comparison table: pairs/s of each Keras variant and of the PyTorch peer."""
    variants = results.get("keras", {}).get("variants", {})
    base = variants.get("two_pass", {}).get("pairs_per_s")
    lines = ["| step | pairs/s | x today's |", "|---|---|---|"]
    for name, row in variants.items():
        rate = row.get("pairs_per_s")
        ratio = f"{rate / base:.2f}" if rate and base else "-"
        lines.append(f"| keras {name} | {f'{rate:,.0f}' if rate else row.get('skipped')} | "
                     f"{ratio} |")
    for name, row in results.get("torch", {}).get("variants", {}).items():
        rate = row.get("pairs_per_s")
        ratio = f"{rate / base:.2f}" if rate and base else "-"
        lines.append(f"| torch {name} | {f'{rate:,.0f}' if rate else row.get('skipped')} | "
                     f"{ratio} |")
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("OUT", "device_step_out")))
    p.add_argument("--tiny", action="store_true", help="batch 8, short runs: a CPU check")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--spe", type=int, default=10, help="steps_per_execution")
    p.add_argument("--seconds", type=float, default=8.0, help="timed seconds per variant")
    p.add_argument("--parts", default="keras,breakdown,torch")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child's
    p.add_argument("--json", type=pathlib.Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny and args.part is None:
        args.batch, args.spe, args.seconds = 8, 2, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.part is not None:  # a child: one part, its JSON to --json
        deadline = args.deadline or time.time() + 600
        if args.part == "keras":
            result = keras_part(args, deadline)
        else:
            from benchmarks.step_breakdown import breakdown_part

            result = breakdown_part(args, deadline)
        args.json.write_text(json.dumps(result, indent=1, default=str))
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    limits = TINY_LIMITS if args.tiny else LIMITS
    console, results = [], {"command": " ".join(sys.argv), "tiny": args.tiny}
    start = time.perf_counter()
    for part in args.parts.split(","):
        results[part] = run_part(part, args, limits[part], args.output, console)
    results["wall_s"] = round(time.perf_counter() - start, 1)
    table = summary(results)
    tail = ["== summary", *table, f"wall {results['wall_s']} s"]
    print("\n".join(tail), flush=True)
    console.extend(tail)
    (args.output / "console.txt").write_text("\n".join(console) + "\n")
    (args.output / "device_step.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
