"""Pretext training-step throughput: `python -m benchmarks.step`.

Times the compiled AET training step that `python -m aetv2_tf.train` runs (NIN Siamese encoder,
decoder, the real loss, metrics, Adam wrapped in the non-finite-step guard, L2 decay) through
`model.fit` on one in-memory batch repeated, so the input pipeline costs nothing here (see
`benchmarks.pipeline` for it). A configuration is
`[BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla][/eigen]`:

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
  TensorFlow worker process with that setting, timed in the same rounds.

Every configuration and two 4096^3 matmuls (float32 and bfloat16: the machine's peaks under the
same load) are built and warmed up first, then timed in interleaved rounds; the table gives
medians. Achieved GFLOP/s count the conv/dense arithmetic of the step analytically
(`common.forward_macs`, training ~ 3x forward), which the issue's 3.0 GFLOP per pair checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks import common

DEFAULT_CONFIGS = ("fused/fp32/geodesic", "fused/fp32/mse", "fused/bf16/geodesic",
                   "fused/bf16/mse", "keras/fp32/geodesic", "keras/bf16/geodesic")
PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16"}
BASELINE = "fused/fp32/geodesic"
#: `jax:` configurations run in a Keras-on-JAX worker, `torch:` ones in a PyTorch worker
#: (`benchmarks.torch_step`: the AETv1 code's framework, the same NIN step).
BACKENDS = ("tensorflow", "jax", "torch")
# Targets of issue 5 for batch 128 on 2 cores.
TARGET_BF16, TARGET_FP32, TARGET_PEAK_FRACTION, TARGET_LOSS_GAP = 250.0, 100.0, 0.55, 0.03


@dataclasses.dataclass(frozen=True)
class Spec:
    """One parsed configuration string."""

    name: str
    batch_norm: str
    precision: str  # Keras policy name ("auto" for another backend's config: its worker decides)
    loss: str
    steps_per_execution: int
    xla: bool
    backend: str = "tensorflow"
    onednn: bool = True  # TensorFlow's oneDNN kernels (False: `/eigen`)

    @classmethod
    def parse(cls, name: str, steps_per_execution: int = 1) -> Spec:
        import keras

        backend, _, rest = name.rpartition(":")
        backend = backend or "tensorflow"
        parts = rest.split("/")
        bns = ("torch",) if backend == "torch" else ("keras",) if backend == "jax" else (
            "fused", "keras")
        if len(parts) < 3 or parts[0] not in bns or parts[2] not in ("geodesic", "mse") or \
                parts[1] not in (*PRECISIONS, "auto") or backend not in BACKENDS or (
                backend == "torch" and (parts[1] == "auto" or parts[2] != "mse")):
            raise ValueError(f"bad config {name!r}: use [BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla] "
                             f"with BACKEND tensorflow|jax|torch, BN fused|keras (jax: keras; "
                             f"torch: torch), PRECISION fp32|bf16|auto (torch: fp32|bf16), LOSS "
                             f"geodesic|mse (torch: mse, the AETv1 code's)")
        spe, xla, onednn = steps_per_execution, False, True
        for extra in parts[3:]:
            if extra == "xla":
                xla = True
            elif extra == "eigen" and backend == "tensorflow":
                onednn = False
            elif extra.startswith("spe") and extra[3:].isdigit() and int(extra[3:]) > 0:
                spe = int(extra[3:])
            else:
                raise ValueError(f"bad config suffix {extra!r} in {name!r}: spe<N>, xla or "
                                 f"(TensorFlow only) eigen")
        if parts[1] != "auto":
            precision = PRECISIONS[parts[1]]
        elif backend != keras.backend.backend() or onednn != _here_onednn():
            precision = "auto"  # its worker decides
        else:  # the benchmark machine is a CPU
            from aetv2_tf.program.precision import choose_precision

            precision = choose_precision("auto", backend).policy
        return cls(name, parts[0], precision, parts[2], spe, xla, backend, onednn)

    @property
    def worker(self) -> str:
        """The process kind that runs this configuration: its backend, `tensorflow-eigen` for
        TensorFlow with oneDNN off."""
        return self.backend if self.onednn else f"{self.backend}-eigen"

    def round_steps(self, steps: int) -> int:
        """`steps` rounded up to whole executions of `steps_per_execution`."""
        return -(-steps // self.steps_per_execution) * self.steps_per_execution


def _here_onednn() -> bool:
    """Whether this process runs TensorFlow's oneDNN kernels ("unknown" counts as on)."""
    from aetv2_tf.program.precision import onednn_state

    return onednn_state() != "off"


def example_batch(batch_size: int, seed: int = 0):
    """One real pretext batch ((x, tx), params) of random images (the content costs nothing):
    from the tf.data pipeline under TensorFlow, from the device sampler on other backends."""
    import keras
    import numpy as np

    images = np.random.default_rng(seed).integers(0, 256, (2 * batch_size, 32, 32, 3), np.uint8)
    if keras.backend.backend() != "tensorflow":
        from aetv2_tf.data.device import HomographyPairs

        x, tx, params = (keras.ops.convert_to_numpy(a) for a in
                         HomographyPairs(seed=seed)(images[:batch_size]))
        return (x, tx), params
    from aetv2_tf.data.pipelines import pretext_dataset

    return next(iter(pretext_dataset(images, batch_size, seed=seed)))


def _repeat(batch):
    while True:
        yield batch


class StepRunner:
    """A compiled AET model of one `Spec`, ready to run `steps` training steps on one batch."""

    def __init__(self, spec: Spec, batch, learning_rate: float = 1e-3):
        import keras

        from aetv2_tf import losses, metrics, optim
        from aetv2_tf.models import build_aet_model, build_backbone

        self.spec = spec
        previous = keras.mixed_precision.dtype_policy().name
        keras.mixed_precision.set_global_policy(spec.precision)
        try:
            self.encoder = build_backbone("nin", (32, 32, 3), batch_norm=spec.batch_norm)
            self.model = build_aet_model(self.encoder)
        finally:
            keras.mixed_precision.set_global_policy(previous)
        optim.add_l2_decay(self.model, 5e-4)
        optimizer = optim.build_optimizer(
            "adam", optim.Schedule("constant", learning_rate, 1), weight_decay=5e-4)
        tensorflow = keras.backend.backend() == "tensorflow"
        if spec.loss == "geodesic":
            loss = losses.GeodesicLoss(1.0)
        elif tensorflow:
            from aetv2_tf.data.homographies import parameter_statistics

            loss = losses.ParameterMSELoss(std=parameter_statistics(32, 32, "integer")[1])
        else:
            from aetv2_tf.recipes import parameter_std

            loss = losses.ParameterMSELoss(std=parameter_std(32, "integer"))
        self.model.compile(optimizer=optimizer, loss=loss, metrics=metrics.pretext_metrics(),
                           steps_per_execution=spec.steps_per_execution,
                           jit_compile=spec.xla or not tensorflow)  # JAX always compiles
        self.batch_size = int(batch[1].shape[0])
        if tensorflow:
            import tensorflow as tf

            self.dataset = tf.data.Dataset.from_tensors(batch).repeat()
        else:
            self.dataset = _repeat(batch)
        self.history: dict[str, float] = {}

    def round_steps(self, steps: int) -> int:
        return self.spec.round_steps(steps)

    def run(self, steps: int, dataset=None) -> None:
        """`steps` (rounded up to whole executions) training steps through `model.fit`, on the
        repeated batch or on `dataset`."""
        fit = self.model.fit(self.dataset if dataset is None else dataset, epochs=1,
                             steps_per_epoch=self.round_steps(steps), shuffle=False, verbose=0)
        self.history = {k: float(v[-1]) for k, v in fit.history.items()}

    def flops_per_pair(self) -> float:
        """Training-step FLOPs per pair: the encoder sees 2 images, the decoder 1 pair."""
        encoder = common.forward_macs(self.encoder)
        decoder = common.forward_macs(self.model) - encoder
        return common.train_step_flops(2 * encoder + decoder)


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
    from benchmarks import backends

    here = "tensorflow" if _here_onednn() else "tensorflow-eigen"
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


def targets(results: dict[str, Result], peaks: dict[str, Result], flops: float) -> list[str]:
    """The issue's targets, each with the measured value and met/missed.

    Rates are judged as measured (wall) and as estimated for the whole unloaded machine
    (pairs/CPU-s x cores); the fraction of peak and the loss gap use the CPU-time rates.
    """
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    out, cores = [], common.cores()
    for name, r in results.items():
        bn, precision, loss = name.split("/")[:3]
        if bn == "fused" and loss == "geodesic" and len(name.split("/")) == 3:
            goal = TARGET_BF16 if precision == "bf16" else TARGET_FP32
            estimate = r.pairs_per_cpu_s * cores
            measured = verdict(r.pairs_per_s >= goal)
            out.append(f"{name}: {r.pairs_per_s:.0f} pairs/s measured ({measured}), "
                       f"{estimate:.0f} estimated on {cores} free cores "
                       f"({verdict(estimate >= goal)}) vs target {goal:.0f}")
            if precision == "fp32" and "float32" in peaks:
                frac = r.pairs_per_cpu_s * flops / 1e9 / peaks["float32"].pairs_per_cpu_s
                goal = TARGET_PEAK_FRACTION
                out.append(f"{name}: {100 * frac:.0f}% of the fp32 matmul peak vs target "
                           f"{100 * goal:.0f}%: {verdict(frac >= goal)}")
        mse = name.replace("/geodesic", "/mse")
        if loss == "geodesic" and mse in results:
            gap = 1 - r.pairs_per_cpu_s / results[mse].pairs_per_cpu_s
            wall_gap = 1 - r.pairs_per_s / results[mse].pairs_per_s
            out.append(f"{name} vs {mse}: geodesic {100 * gap:+.1f}% slower per CPU-s "
                       f"({100 * wall_gap:+.1f}% wall) vs target <= {100 * TARGET_LOSS_GAP:.0f}%: "
                       f"{verdict(gap <= TARGET_LOSS_GAP)}")
    return out


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
                   help="Comma-separated [BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla][/eigen] "
                        "configs.")
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
             f"TensorFlow kernels: oneDNN {'on' if _here_onednn() else 'off'} in this process "
             f"(the matmul peaks and the configurations run here); `/eigen` configurations ran "
             f"with it off, the others with it on.",
             *(f"Target: {t}" for t in targets(results, peaks, flops))]
    if not args.fp32_only:
        notes.append(auto_precision_note(results))
    common.report("Training step (benchmarks.step)", table(results, peaks, flops, args.matmul_n),
                  args, notes, load_before=load)


if __name__ == "__main__":
    main()
