"""One benchmark configuration and its compiled training step, in any process.

`Spec` parses `[BACKEND:]BN/PRECISION/LOSS[/spe<N>][/xla][/eigen][/joint]` (`benchmarks.step`'s
docstring says what each part means), `StepRunner` builds and runs its compiled AET step on one
repeated batch, `example_batch` makes that batch. `benchmarks.step` (the parent, which times the
rounds) and `benchmarks.backends` (a worker of another backend) both build on them, so that the
parent imports the worker's module and never the other way round.
"""

from __future__ import annotations

import dataclasses

from benchmarks import common

PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16"}
#: `jax:` configurations run in a Keras-on-JAX worker, `torch:` ones in a PyTorch worker
#: (`benchmarks.torch_peer`: the AETv1 code's framework, the same NIN step).
BACKENDS = ("tensorflow", "jax", "torch")


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
    siamese_batch_norm: str = "per_branch"  # "joint": `/joint`

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
        spe, xla, onednn, siamese = steps_per_execution, False, True, "per_branch"
        for extra in parts[3:]:
            if extra == "xla":
                xla = True
            elif extra == "eigen" and backend == "tensorflow":
                onednn = False
            elif extra == "joint" and backend != "torch":
                siamese = "joint"
            elif extra.startswith("spe") and extra[3:].isdigit() and int(extra[3:]) > 0:
                spe = int(extra[3:])
            else:
                raise ValueError(f"bad config suffix {extra!r} in {name!r}: spe<N>, xla, "
                                 f"joint (Keras only) or (TensorFlow only) eigen")
        if parts[1] != "auto":
            precision = PRECISIONS[parts[1]]
        elif backend != keras.backend.backend() or onednn != here_onednn():
            precision = "auto"  # its worker decides
        else:  # the benchmark machine is a CPU
            from aetv2_tf.program.precision import choose_precision

            precision = choose_precision("auto", backend).policy
        return cls(name, parts[0], precision, parts[2], spe, xla, backend, onednn, siamese)

    @property
    def worker(self) -> str:
        """The process kind that runs this configuration: its backend, `tensorflow-eigen` for
        TensorFlow with oneDNN off."""
        return self.backend if self.onednn else f"{self.backend}-eigen"

    def round_steps(self, steps: int) -> int:
        """`steps` rounded up to whole executions of `steps_per_execution`."""
        return -(-steps // self.steps_per_execution) * self.steps_per_execution


def here_onednn() -> bool:
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
        from aetv2_tf.data.preprocessing_layers import HomographyPairs

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

        from aetv2_tf.method import losses, metrics, optimizers
        from aetv2_tf.models import build_aet_model, build_backbone

        self.spec = spec
        previous = keras.mixed_precision.dtype_policy().name
        keras.mixed_precision.set_global_policy(spec.precision)
        try:
            self.encoder = build_backbone("nin", (32, 32, 3), batch_norm=spec.batch_norm)
            self.model = build_aet_model(self.encoder,
                                         siamese_batch_norm=spec.siamese_batch_norm)
        finally:
            keras.mixed_precision.set_global_policy(previous)
        optimizer = optimizers.build_optimizer(
            "adam", optimizers.Schedule("constant", learning_rate, 1), weight_decay=5e-4)
        tensorflow = keras.backend.backend() == "tensorflow"
        if spec.loss == "geodesic":
            loss = losses.GeodesicLoss(1.0)
        else:
            from aetv2_tf.data.sampler import parameter_std

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
