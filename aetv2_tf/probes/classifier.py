"""Classifier probes on a FROZEN encoder, selected on a held-out validation split.

Protocol (docs/method.md, section 2, with its one deliberate change):

* The encoder is frozen: ``trainable = False`` AND called with ``training=False`` (BatchNorm
  keeps its moving statistics), its output through ``stop_gradient``. Only the head learns.
* The head trains on the training set minus a seeded validation split (`split_train_val`, 5,000
  images for CIFAR-10); the epoch best on validation top-1 (the earliest on ties) is restored at
  the end and the TEST set evaluated once, with it. (The AETv1/RotNet CIFAR-10 code keeps the
  epoch best on test accuracy, their ImageNet and Places configs the last one.)
* `probe_optimizer`, `step_lr_schedule`: SGD, momentum 0.9, Nesterov, lr 0.1, PyTorch's coupled
  weight decay 5e-4 (`optimizers.SGDL2`), lr x0.2 at 30%, 60%, 80% of the epochs (60/120/160 of
  200, the AETv1/RotNet schedule).

Accuracies are top-1 in PERCENT. Keras 3, every backend: the batches are any ``fit`` input;
per-epoch logs go to ``epochs.csv`` and, where TensorFlow is importable, TensorBoard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import keras
import numpy as np

from aetv2_tf.errors import UsageError
from aetv2_tf.files import scalar_logs
from aetv2_tf.files.saving import damage, save_atomically
from aetv2_tf.files.weights_files import file_attributes, save_weights_file
from aetv2_tf.method import optimizers
from aetv2_tf.method.optimizers import STEP_DROPS
from aetv2_tf.models.displayed_loss import ShowsDataLoss

BEST_WEIGHTS = "best.weights.h5"

# --- optimiser and schedule -------------------------------------------------------------------


def probe_optimizer(kind: str = "sgd", learning_rate: float = 0.1, momentum: float = 0.9,
                    nesterov: bool = True,
                    weight_decay: float = 5e-4) -> keras.optimizers.Optimizer:
    """The probe-head optimiser: SGD, momentum 0.9, Nesterov, lr 0.1 and PyTorch's coupled L2
    weight decay 5e-4 (`optimizers.CoupledWeightDecay`: ``weight_decay * w`` added to the
    gradient of the head's variables before the momentum, as ``torch.optim.SGD``; the model
    shows the penalty apart, `displayed_loss.ShowsDataLoss`), or ``kind="adam"`` (betas 0.9,
    0.999, the same L2). A plain-float rate (`step_lr_schedule` sets it per epoch); no model."""
    if kind == "sgd":
        return optimizers.SGDL2(learning_rate, momentum=momentum, nesterov=nesterov,
                                l2_decay=weight_decay)
    if kind == "adam":
        return optimizers.AdamL2(learning_rate, l2_decay=weight_decay)
    raise ValueError(f"unknown probe optimizer {kind!r}; use 'sgd' or 'adam'")


def step_lr_schedule(epochs: int, base_lr: float = 0.1, factor: float = 0.2,
                     drop_epochs: Sequence[int] = ()) -> Callable[[int], float]:
    """Per-epoch step schedule ``epoch (0-based) -> lr``: `optimizers.Schedule`'s "step" (the
    project's one schedule type) counted in epochs, the rate multiplied by ``factor`` from each
    epoch of ``drop_epochs`` on (``boundaries``); by default at the whole epochs
    ``round(m * epochs)`` for m = 30%, 60%, 80% (`STEP_DROPS`): for 200 epochs 60, 120, 160 (lr
    0.1, 0.02, 0.004, 0.0008), for 100 epochs 30, 60, 80."""
    boundaries = list(drop_epochs) or [int(round(m * epochs)) for m in STEP_DROPS]
    per_epoch = optimizers.Schedule("step", base_lr, epochs, drop_factor=factor,
                                    drop_epochs=boundaries, epochs=epochs)

    def schedule(epoch: int, lr: float | None = None) -> float:
        del lr  # keras.callbacks.LearningRateScheduler also passes the current lr
        return float(keras.ops.convert_to_numpy(per_epoch(epoch)))

    schedule.boundaries = boundaries  # type: ignore[attr-defined]
    return schedule


# --- the probe model --------------------------------------------------------------------------


class FrozenEncoderProbe(ShowsDataLoss, keras.Model):
    """``images (B, H, W, 3) -> [preprocess] -> encoder (frozen) -> features[feature] -> head ->
    logits (B, K)``. ``encoder``: a Keras model/layer (made non-trainable) or a feature
    function, its dict outputs indexed by ``feature``; ``preprocess`` (e.g.
    `data.preprocessing_layers.ClassifierInputs`) gets the call's ``training`` flag."""

    def __init__(self, encoder: Callable, feature: str | None, head: Callable,
                 preprocess: keras.layers.Layer | None = None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(encoder, keras.layers.Layer):
            encoder.trainable = False
        self.encoder = encoder
        self.feature = feature
        self.head = head
        self.preprocess = preprocess

    def features(self, images):
        """The frozen feature map, e.g. ``(B, 8, 8, 192)`` for NIN block 2."""
        outputs = self.encoder(images, training=False) if isinstance(
            self.encoder, keras.layers.Layer) else self.encoder(images)
        if isinstance(outputs, dict):
            if self.feature is None:
                raise ValueError(f"encoder returns {sorted(outputs)}; pass feature=")
            outputs = outputs[self.feature]
        return keras.ops.stop_gradient(outputs)

    def call(self, images, training=None):
        if self.preprocess is not None:
            images = self.preprocess(images, training=training)
        return self.head(self.features(images), training=training)


def build_probe_model(
    feature_fn_or_encoder: Callable, feature: str | None, head: Callable,
    preprocess: keras.layers.Layer | None = None,
) -> FrozenEncoderProbe:
    """`FrozenEncoderProbe` of a Keras encoder (made non-trainable) or a callable ``images ->
    feature map``, its ``feature`` (a dict output's key, or None), a Keras ``head`` (feature
    map -> float32 logits ``(B, K)``) and an optional first layer ``preprocess``."""
    return FrozenEncoderProbe(feature_fn_or_encoder, feature, head, preprocess, name="probe")


def build_probe(
    encoder: Callable,
    feature: str | None,
    head_kind: str,
    num_classes: int,
    input_shape: Sequence[int] = (32, 32, 3),
    preprocess: keras.layers.Layer | None = None,
    **head_kwargs: Any,
) -> FrozenEncoderProbe:
    """`build_probe_model` with a head from ``aetv2_tf.models.heads.build_head(head_kind, ...)``.

    The feature shape (without batch) is found by running the encoder on one zero image, and
    the probe is built by running it on one (inference mode); ``head_kwargs`` (``batch_norm``,
    ``pool``, ``extra_convs``) go to ``build_head``.
    """
    from aetv2_tf.models.heads import build_head

    probe = build_probe_model(encoder, feature, keras.layers.Identity())
    feature_shape = tuple(probe.features(np.zeros((1, *input_shape), np.float32)).shape[1:])
    head = build_head(head_kind, feature_shape, num_classes, **head_kwargs)
    probe = build_probe_model(encoder, feature, head, preprocess)
    probe(np.zeros((1, *input_shape), np.float32))  # built: a checkpoint loads into it
    return probe


# --- per-epoch logs ----------------------------------------------------------------------------


class EpochScalars(keras.callbacks.Callback):
    """Per-epoch logs with the learning rate: ``log_dir/epochs.csv`` (`scalar_logs.CsvLog`) and,
    where TensorFlow is importable, scalars ``epoch_<name>`` in ``log_dir/train`` and
    ``log_dir/validation`` (``val_`` removed), as Keras' TensorBoard callback writes them."""

    COLUMNS = ("loss", "top1", "val_loss", "val_top1", "learning_rate")

    def __init__(self, log_dir: str, fresh: bool = True):
        super().__init__()
        self.csv = scalar_logs.CsvLog(os.path.join(log_dir, "epochs.csv"), self.COLUMNS, "epoch",
                                      fresh=fresh)  # anew unless a resumed training goes on
        self.writers = {split: scalar_logs.tensorboard_writer(os.path.join(log_dir, split))
                        for split in ("train", "validation")}

    def on_epoch_end(self, epoch: int, logs: dict | None = None):
        logs = {k: float(v) for k, v in (logs or {}).items()}
        logs.setdefault("learning_rate", float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate)))
        self.csv.write(epoch + 1, logs)
        train = {f"epoch_{k}": v for k, v in logs.items() if not k.startswith("val_")}
        val = {f"epoch_{k[4:]}": v for k, v in logs.items() if k.startswith("val_")}
        scalar_logs.write_scalars(self.writers["train"], epoch, train)
        if val:
            scalar_logs.write_scalars(self.writers["validation"], epoch, val)


# --- training with validation-based selection --------------------------------------------------


class BestValidationSnapshot(keras.callbacks.Callback):
    """Keeps in memory the weights of the epoch with the best ``val_top1`` (the earliest on
    ties: ``model.head``'s, else all); `restore` puts them back. With ``model_dir`` the whole
    model's are also saved to ``best.weights.h5`` there (atomically, with its checksum and
    epoch), which `restore` reads when the best epoch is one of ``history``, the ``val_top1`` of
    the epochs before a resumed training."""

    def __init__(self, monitor: str = "val_top1", model_dir: str | None = None,
                 history: Sequence[float] = ()):
        super().__init__()
        self.monitor, self.model_dir, self._weights = monitor, model_dir, None
        self.history = [float(v) for v in history]
        self.best_value = max(self.history, default=-np.inf)
        self.best_epoch = 1 + int(np.argmax(self.history)) if self.history else None

    def _variables(self):
        head = getattr(self.model, "head", None)
        return head.weights if isinstance(head, keras.layers.Layer) else self.model.weights

    def on_epoch_end(self, epoch: int, logs: dict | None = None):
        if logs is None or self.monitor not in logs:
            raise KeyError(f"{self.monitor!r} not in the epoch logs; is validation data given?")
        value = float(logs[self.monitor])
        self.history.append(value)
        if value > self.best_value:
            self.best_value, self.best_epoch = value, epoch + 1
            self._weights = [np.array(keras.ops.convert_to_numpy(v), copy=True)
                             for v in self._variables()]
            if self.model_dir:
                save_atomically(lambda tmp: save_weights_file(self.model, tmp,
                                                              {"epoch": epoch + 1}),
                                os.path.join(self.model_dir, BEST_WEIGHTS))

    def restore(self) -> None:
        if self._weights is None and self.best_epoch is not None and self.model_dir:
            self._load_best_file()
            return
        if self._weights is None:
            raise RuntimeError("no epoch finished: nothing to restore")
        for variable, value in zip(self._variables(), self._weights, strict=True):
            variable.assign(value)

    def _load_best_file(self) -> None:
        """The best epoch's weights from ``best.weights.h5``: refused unless they are whole and
        of that epoch (UsageError)."""
        path = os.path.join(self.model_dir, BEST_WEIGHTS)
        held = file_attributes(path).get("epoch") if os.path.isfile(path) else None
        reason = damage(path, required=True) if held == self.best_epoch else \
            f"it holds epoch {held}"
        if reason:
            raise UsageError(f"{path} should hold the weights of the selected epoch "
                             f"{self.best_epoch}, but {reason}; train the probe afresh (the "
                             "program: --overwrite).")
        self.model.load_weights(path)


def compile_probe(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    """Compiles ``model`` for `train_probe`: sparse softmax cross-entropy of its logits, a
    ``top1`` accuracy (weighted: batches padded to a whole batch for several devices weight the
    copies 0), ``optimizer``."""
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1")])


def probe_callbacks(snapshot: BestValidationSnapshot, lr_schedule: Callable[[int], float] | None,
                    log_dir: str | None, callbacks: Sequence[keras.callbacks.Callback],
                    fresh: bool = True) -> list[keras.callbacks.Callback]:
    """`train_probe`'s callbacks in their order: the selection, the rate, the epoch logs
    (`EpochScalars`, started anew when ``fresh``), then ``callbacks`` (which see the epoch
    logged)."""
    found: list[keras.callbacks.Callback] = [snapshot]
    if lr_schedule is not None:
        found.append(keras.callbacks.LearningRateScheduler(lr_schedule))
    if log_dir:
        found.append(EpochScalars(log_dir, fresh))
    return [*found, *callbacks]


def tested(model: keras.Model, snapshot: BestValidationSnapshot, test_ds: Any,
           log_dir: str | None, verbose: int, start: float) -> dict[str, Any]:
    """`train_probe`'s result: the selected epoch's weights restored, ``test_ds`` evaluated
    once (``start``: `time.perf_counter` at its start)."""
    snapshot.restore()
    test = model.evaluate(test_ds, return_dict=True, verbose=verbose)
    test_top1 = 100.0 * float(test["top1"])
    if log_dir:
        write_test_top1(log_dir, test_top1, step=snapshot.best_epoch)
    return dict(
        selected_epoch=snapshot.best_epoch,
        val_top1=100.0 * snapshot.best_value,
        test_top1=test_top1,
        test_error=100.0 - test_top1,
        epochs_run=len(snapshot.history),
        wall_time_s=time.perf_counter() - start,
        val_top1_history=[100.0 * v for v in snapshot.history],
    )


def train_probe(
    model: keras.Model,
    train_ds: Any,
    val_ds: Any,
    test_ds: Any,
    *,
    epochs: int,
    optimizer: keras.optimizers.Optimizer | None = None,
    lr_schedule: Callable[[int], float] | str | None = "step",
    model_dir: str | None = None,
    log_dir: str | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    verbose: int = 0,
    history: Sequence[float] = (),
    steps_per_epoch: int | None = None,
) -> dict[str, Any]:
    """Train the head, select the epoch on ``val_ds``, evaluate ``test_ds`` once.

    Args:
      model: e.g. `build_probe_model(...)`, images -> logits ``(B, K)``; compiled here
        (`compile_probe`) with ``optimizer`` (default `probe_optimizer()`).
      train_ds, val_ds, test_ds: batched ``(images, int labels)``, anything ``fit`` takes;
        train_ds once per epoch (it shuffles and augments itself; or an endless stream of
        epochs of ``steps_per_epoch`` batches), val_ds once per epoch, test_ds once at the end.
      lr_schedule: ``"step"`` (`step_lr_schedule(epochs, base_lr=<optimizer lr>)`), a callable
        ``epoch (0-based) -> lr``, or None (the optimizer's rate unchanged).
      model_dir: ``best.weights.h5`` goes there. log_dir: the epoch logs (`EpochScalars`) and
        the test top-1 (`write_test_top1`, at step = selected epoch). callbacks: after those.
      history: the ``val_top1`` (fractions) of the epochs done before: the model then comes
        compiled with their state loaded, optimizer included (whose rate is then a later
        epoch's: pass ``lr_schedule`` as a callable), and trains on from the next epoch.

    Returns:
      ``dict(selected_epoch (1-based), val_top1, test_top1, test_error, epochs_run, wall_time_s,
      val_top1_history)``; accuracies and error in percent.
    """
    start = time.perf_counter()
    if not history:
        compile_probe(model, optimizer if optimizer is not None else probe_optimizer())
    if lr_schedule == "step":
        base_lr = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        lr_schedule = step_lr_schedule(epochs, base_lr=base_lr)
    snapshot = BestValidationSnapshot("val_top1", model_dir, history)
    model.fit(train_ds, validation_data=val_ds, initial_epoch=len(history), epochs=epochs,
              steps_per_epoch=steps_per_epoch, verbose=verbose,
              callbacks=probe_callbacks(snapshot, lr_schedule, log_dir, callbacks, not history),
              shuffle=False)  # datasets shuffle themselves; Keras would only warn
    return tested(model, snapshot, test_ds, log_dir, verbose, start)


def write_test_top1(log_dir: str, top1: float, step: int) -> None:
    """The test top-1 (percent) as the TensorBoard scalar ``test/top1`` where TensorFlow is
    importable (results.json always has it)."""
    scalar_logs.write_scalars(scalar_logs.tensorboard_writer(os.path.join(log_dir, "test")), step,
                            {"top1": top1})


# --- train/validation split ---------------------------------------------------------------------


class Split(NamedTuple):
    """A disjoint split of a training set; indices index the original arrays (ascending)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    val_images: np.ndarray
    val_labels: np.ndarray
    train_indices: np.ndarray
    val_indices: np.ndarray


def split_train_val(images, labels, val_examples: int = 5000, seed: int = 0) -> Split:
    """Hold out ``val_examples`` random training examples for model selection.

    The held-out indices are the first ``val_examples`` of ``np.random.default_rng(seed)``'s
    permutation of ``range(N)``; both parts keep the original order. ``images (N, ...)``,
    ``labels (N,)``.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    n = len(images)
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} images")
    if not 0 < val_examples < n:
        raise ValueError(f"val_examples={val_examples} must be in [1, {n - 1}]")
    permutation = np.random.default_rng(seed).permutation(n)
    val_idx = np.sort(permutation[:val_examples])
    train_idx = np.sort(permutation[val_examples:])
    return Split(images[train_idx], labels[train_idx], images[val_idx], labels[val_idx],
                 train_idx, val_idx)
