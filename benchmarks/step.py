"""Pretext training-step throughput: `python -m benchmarks.step`.

Times the compiled AET training step that `python -m aetv2_tf.train` runs (NIN Siamese encoder,
decoder, the real loss, metrics, Adam wrapped in the non-finite-step guard, L2 decay) through
`model.fit` on one in-memory batch repeated, so the input pipeline costs nothing here (see
`benchmarks.pipeline` for it). A configuration is
`[BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla][/eigen][/joint]`:

* BACKEND: the Keras backend, `tensorflow` (the default) or `jax`. Configurations of another
  backend than this process's run in a worker process of that backend (`benchmarks.backends`),
  built and warmed up like the others and timed in the same interleaved rounds, so
  `--configs=keras/fp32/geodesic,jax:keras/fp32/geodesic` compares the backends in one run;
* BN: `fused` (FusedBatchNormalization, the default) or `keras` (keras.layers.BatchNormalization);
  (`fused` is TensorFlow's kernel: other backends take `keras`);
* PRECISION: `fp32`, `bf16` (mixed_bfloat16) or `auto` (what `--mixed_precision=auto` picks here
  on that backend);
* LOSS: `geodesic` (AETv2) or `mse` (AETv1);
* `spe<N>`: `steps_per_execution=N` (default `--steps_per_execution`), `xla`: `jit_compile=True`;
* `eigen`: TensorFlow with its oneDNN kernels off (`TF_ENABLE_ONEDNN_OPTS=0`, its Eigen kernels:
  TensorFlow's own default on x86 CPUs without AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, which
  `aetv2_tf` overrides). A configuration whose oneDNN setting is not this process's runs in a
  TensorFlow worker process with that setting, timed in the same rounds;
* `joint`: the Siamese BatchNorm `--siamese_batch_norm=joint` (one encoder call on both images,
  statistics over both) instead of the default per-branch statistics (two calls), so
  `--configs=keras/fp32/mse,keras/fp32/mse/joint --matmul_n=0` compares the two in one run.

Every configuration and two 4096^3 matmuls (float32 and bfloat16: the machine's peaks under the
same load) are built and warmed up first, then timed in interleaved rounds; the table gives
medians. Achieved GFLOP/s count the conv/dense arithmetic of the step analytically
(`common.forward_macs`, training ~ 3x forward: 3.0 GFLOP a pair, `tests/test_benchmarks.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks import backends, common
from benchmarks.step_runner import Spec, StepRunner, example_batch, here_onednn

DEFAULT_CONFIGS = ("fused/fp32/geodesic", "fused/fp32/mse", "fused/bf16/geodesic",
                   "fused/bf16/mse", "keras/fp32/geodesic", "keras/bf16/geodesic")
BASELINE = "fused/fp32/geodesic"


@dataclasses.dataclass
class Result:
    """Medians of one configuration's rounds, in work units (pairs, or GFLOP for matmuls)."""

    pairs_per_s: float
    pairs_per_cpu_s: float
    rates: list[float]  # per round, units/s

    @classmethod
    def of(cls, timings: list[common.Timing], pairs: float) -> Result:
        rates = [pairs / t.wall for t in timings]
        return cls(common.median(rates), common.median(pairs / t.cpu for t in timings), rates)


def measure(specs: list[Spec], batch_size: int, steps: int, repeats: int, warmup: int = 2,
            matmul_n: int = 4096, matmul_dtypes: tuple[str, ...] = ("float32", "bfloat16"),
            threads: tuple[int, int] = (0, 0),
            ) -> tuple[dict[str, Result], dict[str, Result], dict]:
    """Builds, warms up and times every spec and the two matmuls, interleaved (`threads`: the
    intra-op and inter-op thread counts for TensorFlow workers, 0 = TensorFlow's default).

    Returns ({config: Result in pairs}, {"float32"|"bfloat16": matmul Result in GFLOP},
    {config: StepRunner}).
    """
    here = "tensorflow" if here_onednn() else "tensorflow-eigen"
    local = [s for s in specs if s.worker == here]
    remote = backends.start_workers([s for s in specs if s.worker != here], batch_size, warmup,
                                    threads)
    batch = example_batch(batch_size)
    runners = {}
    for spec in local:
        t0 = time.perf_counter()
        runner = StepRunner(spec, batch)
        runner.run(warmup)
        runners[spec.name] = runner
        print(f"built and warmed up {spec.name} in {time.perf_counter() - t0:.1f}s", flush=True)
    runners.update(backends.wait_ready(remote))
    runners = {spec.name: runners[spec.name] for spec in specs}  # the order asked for
    runs = {name: (lambda r=r: r.run(steps)) for name, r in runners.items()}
    matmuls = {}
    if matmul_n:
        matmuls = {f"matmul/{d}": common.make_matmul(d, matmul_n) for d in matmul_dtypes}
    timings = common.interleave({**runs, **matmuls}, repeats)
    results = {name: Result.of(timings[name], runners[name].round_steps(steps) * batch_size)
               for name in runners}
    peaks = {name.split("/")[1]: Result.of(timings[name], common.matmul_flops(matmul_n) / 1e9)
             for name in matmuls}
    return results, peaks, runners


def table(results: dict[str, Result], peaks: dict[str, Result], flops: float,
          matmul_n: int = 4096) -> str:
    """The markdown table: rates, arithmetic rates, fractions of the peaks, ratios."""
    base = results.get(BASELINE)
    rows = []
    for name, r in results.items():
        per_cpu = r.pairs_per_cpu_s * flops / 1e9
        rows.append([name, name.rpartition(":")[0] or "tensorflow", f"{r.pairs_per_s:.1f}",
                     common.spread(r.rates), f"{r.pairs_per_cpu_s:.1f}",
                     f"{r.pairs_per_s * flops / 1e9:.0f}", f"{per_cpu:.0f}",
                     *(f"{100 * per_cpu / peaks[d].pairs_per_cpu_s:.0f}%" if d in peaks else "-"
                       for d in ("float32", "bfloat16")),
                     f"{r.pairs_per_s / base.pairs_per_s:.2f}x / "
                     f"{r.pairs_per_cpu_s / base.pairs_per_cpu_s:.2f}x" if base else "-"])
    for dtype, m in peaks.items():
        rows.append([f"matmul {matmul_n}^3 {dtype}", "tensorflow", "-", common.spread(m.rates), "-",
                     f"{m.pairs_per_s:.0f}", f"{m.pairs_per_cpu_s:.0f}", "", "", ""])
    return common.markdown_table(
        ["config", "backend", "pairs/s", "round spread", "pairs/CPU-s", "GFLOP/s", "GFLOP/CPU-s",
         "% fp32 peak", "% bf16 peak", f"vs {BASELINE} (wall / CPU)"], rows)


def auto_precision_note(results: dict[str, Result]) -> str:
    """What `--mixed_precision=auto` picks here (its own probe, run afresh), next to the step's
    measured bfloat16/float32 ratio when both were measured: do they rank the same way?"""
    from aetv2_tf.program.precision import _rates_text, decide, probe_rates

    rates = probe_rates()
    line = f"--mixed_precision=auto: its probe ({_rates_text(rates)}) picks {decide(rates)}"
    fp32 = results.get("fused/fp32/geodesic")
    bf16 = results.get("fused/bf16/geodesic") or results.get("fused/auto/geodesic")
    if fp32 and bf16:
        step = bf16.pairs_per_s / fp32.pairs_per_s
        agree = (step >= 1.0) == (decide(rates) == "mixed_bfloat16")
        line += (f"; the step measures {step:.2f}x (wall) / "
                 f"{bf16.pairs_per_cpu_s / fp32.pairs_per_cpu_s:.2f}x (CPU): "
                 f"{'same ranking' if agree else 'RANKED DIFFERENTLY'}")
    return line


def add_step_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch_size", type=int, default=128, help="Pairs per step.")
    p.add_argument("--steps", type=int, default=5, help="Timed steps per configuration a round.")
    p.add_argument("--repeats", type=int, default=3, help="Interleaved rounds (medians).")
    p.add_argument("--warmup", type=int, default=2, help="Untimed steps after building.")
    p.add_argument("--steps_per_execution", type=int, default=1,
                   help="model.compile(steps_per_execution=...) of configs without /spe<N>.")


def main() -> None:
    common.keras_quiet()
    p = common.parser(__doc__)
    add_step_flags(p)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="Comma-separated [BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla][/eigen]"
                        "[/joint] configs.")
    p.add_argument("--matmul_n", type=int, default=4096,
                   help="Size of the peak matmuls (0: skip them).")
    p.add_argument("--fp32_only", action="store_true",
                   help="Only the float32 peak matmul and no --mixed_precision=auto probe (for "
                        "runs where bfloat16 kernels are unavailable, e.g. oneDNN capped with "
                        "ONEDNN_MAX_CPU_ISA=AVX2).")
    args = p.parse_args()
    common.configure_threads(args)
    load = common.load_average()
    specs = [Spec.parse(c.strip(), args.steps_per_execution) for c in args.configs.split(",")]
    results, peaks, runners = measure(specs, args.batch_size, args.steps, args.repeats,
                                      args.warmup, args.matmul_n,
                                      ("float32",) if args.fp32_only else ("float32", "bfloat16"),
                                      (args.intra_op, args.inter_op))
    flops = next(iter(runners.values())).flops_per_pair()
    notes = [f"NIN Siamese pretext step, batch {args.batch_size} pairs, {args.steps} step(s) x "
             f"{args.repeats} interleaved rounds per configuration; medians. Step arithmetic "
             f"(conv + dense, training = 3x forward): {flops / 1e9:.2f} GFLOP per pair.",
             "pairs/CPU-s, GFLOP/CPU-s: per second of CPU time the process got (all its threads, "
             "spin-waits included): steadier than wall rates on a shared machine; x cores is the "
             "rate of an unloaded machine if the step scaled perfectly. % of peak: GFLOP/CPU-s "
             "of the step over that of the matmul (both measured in the same rounds). round "
             "spread: slowest/fastest round against the median.",
             f"TensorFlow kernels: oneDNN {'on' if here_onednn() else 'off'} in this process "
             f"(the matmul peaks and the configurations run here); `/eigen` configurations ran "
             f"with it off, the others with it on."]
    if not args.fp32_only:
        notes.append(auto_precision_note(results))
    common.report("Training step (benchmarks.step)", table(results, peaks, flops, args.matmul_n),
                  args, notes, load_before=load)


if __name__ == "__main__":
    main()
