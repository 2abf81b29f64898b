"""What a model shows while it trains: its loss first, the loss's terms, the weight decay
apart, in that order.

The coupled L2 weight decay is the optimizer's (`optimizers.CoupledWeightDecay`: its gradient
``wd * w`` is added to the gradient, nothing to the loss), so the ``loss`` Keras shows is the
loss compiled (the pretext loss, the cross-entropy) plus any loss the model adds itself
(``model.losses``: none in this project). `ShowsDataLoss` keeps the training as it is and adds
to what is shown (the progress bar, ``fit``'s history, the callbacks' logs, ``evaluate``):

* the terms of a compiled loss that has them (`losses.GeodesicLoss.terms`) as ``<term>_term``:
  ``angle_term``, and ``residual_term``, ``mse_term``, ``chordal_term`` where their weight is
  above 0; computed with the loss, at its step (a decaying MSE weight included), so that they
  sum to ``loss``;
* the weight decay as ``l2_penalty`` (`metrics.PENALTY`): ``wd / 2 * sum ||w||^2`` of the
  trainable weights (`optimizers.l2_penalty`), the penalty whose gradient the optimizer adds,
  where the optimizer compiled has a coupled decay ``wd > 0`` (`optimizers.coupled_l2_decay`);
* ``fit`` with ``verbose`` shows them in that order (`ShownOrderBar`, unless a progress bar is
  given), the compiled metrics (``angle_deg``, ``rotation_accuracy``, ``accuracy``) after the
  terms (`metrics.shown_order`).
"""

from __future__ import annotations

from typing import Any

import keras

from aetv2_tf.method.metrics import PENALTY, shown_order
from aetv2_tf.method.optimizers import coupled_l2_decay, l2_penalty


class ShownOrderBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar with the logs in the order shown (`metrics.shown_order`: the loss
    and its terms first), not Keras's alphabetical order."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, {k: logs[k] for k in shown_order(logs or {})})

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, {k: logs[k] for k in shown_order(logs or {})})


class ShowsDataLoss:
    """Mixin of a `keras.Model` (before ``keras.Model`` in the bases; module docstring): the
    compiled loss's terms shown beside ``loss``, and the optimizer's coupled weight decay
    apart as ``l2_penalty``. Decided at ``compile``, from the loss and the optimizer
    compiled."""

    def compile(self, *args: Any, **kwargs: Any) -> None:
        super().compile(*args, **kwargs)
        trackers = {name: keras.metrics.Mean(name=f"{name}_term")
                    for name in getattr(self.loss, "terms", ())}
        if coupled_l2_decay(self.optimizer) > 0:
            trackers[PENALTY] = keras.metrics.Mean(name=PENALTY)
        object.__setattr__(self, "_shown_apart", trackers)  # not a tracked sub-object

    @property
    def metrics(self) -> list:
        return [*super().metrics, *getattr(self, "_shown_apart", {}).values()]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        total = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        trackers = getattr(self, "_shown_apart", {})
        if not trackers or total is None:
            return total
        batch = keras.ops.shape(next(a for a in keras.tree.flatten(y_pred) if a is not None))[0]
        for name in getattr(self.loss, "terms", ()):
            trackers[name].update_state(self.loss.term(name, y, y_pred), sample_weight=batch)
        if PENALTY in trackers:
            penalty = l2_penalty(self.trainable_variables, coupled_l2_decay(self.optimizer))
            trackers[PENALTY].update_state(penalty, sample_weight=batch)
        return total

    def fit(self, *args: Any, **kwargs: Any):
        """``keras.Model.fit``, its progress bar a `ShownOrderBar` unless ``callbacks`` holds
        one (`keras.callbacks.ProgbarLogger`)."""
        callbacks = list(kwargs.get("callbacks") or ())
        if kwargs.get("verbose", "auto") != 0 and not any(
                isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, ShownOrderBar()]
        return super().fit(*args, **kwargs)


@keras.saving.register_keras_serializable(package="aetv2_tf")
class DataLossModel(ShowsDataLoss, keras.Model):
    """A functional `keras.Model` that shows its data loss and its penalty apart
    (`ShowsDataLoss`), e.g. the RotNet model of the TensorFlow program."""
