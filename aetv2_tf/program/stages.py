"""The program's one run sequence, on every Keras backend (`aetv2_tf.train` calls `run`):
the backend -> seed -> the machine's checks -> precision -> the data (and a probe's encoder) ->
the model_dir -> the start line -> the stage. Bad input fails before the model_dir is touched.
"""

from __future__ import annotations

import keras

from aetv2_tf.program import pretext_stage, probe_stage, rundir
from aetv2_tf.program.backend import Backend
from aetv2_tf.program.config import RunConfig
from aetv2_tf.program.flags import ESSENTIAL, TRAJECTORY
from aetv2_tf.program.precision import Choice, choose_precision
from aetv2_tf.program.pretext_data import PretextData
from aetv2_tf.program.run_control import StageResult
from aetv2_tf.program.signal_stop import interrupting


def run(config: RunConfig, backend_type: type[Backend]) -> StageResult:
    """Sets up ``backend_type``'s machine, precision and the model_dir, then runs the stage."""
    backend = backend_type(config)  # first: a multi-worker strategy needs a fresh context
    keras.utils.set_random_seed(config.train.seed)
    backend.prepare_devices()
    precision = choose_precision(config.machine.mixed_precision, backend.name,
                                 backend.accelerator)
    keras.mixed_precision.set_global_policy(precision.policy)
    pretext = config.stage == "pretext"
    data = pretext_stage.load(config, accelerator=bool(backend.accelerator)) if pretext else None
    loaded = None if pretext else probe_stage.load(config)
    rundir.prepare(config.outputs.model_dir,
                   config.recorded(precision._asdict(), backend=backend.recorded_backend()),
                   config.flagfile_text(), ESSENTIAL, config.outputs.overwrite, backend.chief,
                   TRAJECTORY)
    print(start_line(config, backend, precision, data), flush=True)
    if pretext:
        return pretext_stage.train(config, backend, data)
    with interrupting(probe_stage.interrupted_where(config)):
        return StageResult(probe_stage.run(config, backend.strategy, backend.chief, loaded))


def start_line(config: RunConfig, backend: Backend, precision: Choice,
               data: PretextData | None = None) -> str:
    """One line: what runs, on which data (its size where known), the distribution and
    replicas, the precision (and why), the CPU kernels, the model_dir and the backend's note."""
    if config.stage == "pretext":
        what = "RotNet" if config.pretext == "rotation" else \
            {"geodesic": "AETv2 (geodesic loss)",
             "mse": "AETv1 (parameter MSE)"}[config.recipe.loss.kind]
    elif config.stage == "probe":
        what = f"{config.probe.probe} probe of {config.probe.pretrained}"
    else:
        what = "supervised NIN"
    images = f", {data.num_examples} training images" if data and data.num_examples else ""
    kernels = f"{backend.kernels} | " if backend.kernels else ""
    return (f"aetv2_tf {config.stage}: {what} | {config.data.dataset}{images} | "
            f"{backend.distribution} x{backend.replicas} | "
            f"{precision.policy} ({precision.reason}) | {kernels}"
            f"{config.outputs.model_dir}{backend.note}")
