"""What a Keras backend does its own way in the training program (`Backend`); everything else
is one sequence for all (`stages.run`, `pretext_stage.train`). `tensorflow_backend` serves
TensorFlow (tf.distribute, tf.data, TensorBoard, SavedModel), `keras_native_backend` JAX and
any other Keras backend (`keras.distribution`, NumPy batches, CSV logs, no TensorFlow needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras

from aetv2_tf.program.config import RunConfig

if TYPE_CHECKING:
    from aetv2_tf.program.checkpoint_saver import CheckpointStore
    from aetv2_tf.program.pretext_data import PretextData
    from aetv2_tf.program.signal_stop import Agreement


class Backend:
    """A backend's part of the program, made first thing (TensorFlow's strategy needs a fresh
    context). Set by the subclass: ``name`` (Keras's backend), ``replicas`` (the model's copies
    a step is split over), ``accelerator`` ("tpu", "gpu" or "": a CPU), ``chief`` (this worker
    writes the model_dir), ``strategy`` (the tf.distribute strategy the probe stage builds in;
    None: Keras's distribution, if any), ``distribution``, ``kernels`` and ``note`` (what the
    start line says of the machine), ``peer_lost`` (a lost worker's errors: exit 6)."""

    name: str = ""
    replicas: int = 1
    accelerator: str = ""
    chief: bool = True
    strategy: Any = None
    distribution: str = ""
    kernels: str = ""
    note: str = ""
    peer_lost: tuple[type[BaseException], ...] = ()
    #: Workers that write throwaway checkpoints beside the chief's.
    other_writers: int = 0
    #: Extra ``model.fit`` arguments of the pretraining.
    fit_kwargs: dict[str, Any] = {}

    def __init__(self, config: RunConfig):
        self.config = config

    def prepare_devices(self) -> None:
        """Checks the run against the machine (`config.check_machine` and this backend's own),
        then spreads the model over the devices; before anything is written."""
        raise NotImplementedError

    def recorded_backend(self) -> str | None:
        """The backend that ``flags.json`` records (None: TensorFlow's program, unrecorded)."""
        return keras.backend.backend()

    # ---------------------------------------------------------------------- the pretraining
    def skip_check_every(self) -> int:
        """How often the optimizer's skipped-step counter is read (steps)."""
        return 1

    def build(self, data: PretextData, steps: int) -> tuple[keras.Model, keras.Model, Any, Any]:
        """``(encoder, compiled pretext model, schedule, optimizer)`` of a ``steps``-step run
        (`pretext_stage.build_model` with this backend's inputs and scope)."""
        raise NotImplementedError

    def batches(self, data: PretextData, start: int, stop: int) -> Any:
        """The training batches of steps ``start .. stop - 1`` (what ``fit`` takes)."""
        raise NotImplementedError

    def checkpoints(self, model: keras.Model, optimizer) -> tuple[CheckpointStore, int]:
        """The store checkpoints go to, and the step restored from its newest one (0: none)."""
        raise NotImplementedError

    def summaries(self, data: PretextData, step_fn, schedule) -> list[keras.callbacks.Callback]:
        """The logging callbacks (`monitoring.PretextSummaries`); ``step_fn()``: the step."""
        raise NotImplementedError

    def export(self, encoder: keras.Model, model: keras.Model) -> dict:
        """``--export`` of a finished run; returns summary entries."""
        raise NotImplementedError

    def exports(self) -> bool:
        """Whether ``--export`` writes a SavedModel here (not where TensorFlow is missing)."""
        return self.config.outputs.export

    def signal_agreement(self) -> Agreement | None:
        """`signal_stop.SignalStop`'s ``agree`` across workers; None: one process."""
        return None

    def close(self) -> None:
        """Called once at the end of the pretraining."""
