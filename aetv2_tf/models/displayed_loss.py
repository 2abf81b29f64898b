"""What a model shows while it trains: its data loss first, the loss's terms, the weight decay
apart, in that order.

Keras adds a model's own losses (``model.losses``: regularizers, ``add_loss``; here the coupled
L2 weight decay of `optimizers.add_l2_decay`, which a pretraining recipe puts on the encoder's
weights, so that a classifier built on that encoder in the same process carries it too) to the
loss it trains on AND to the ``loss`` it shows, and it shows its logs sorted by name.
`ShowsDataLoss` keeps the training as it is and changes what is shown (the progress bar,
``fit``'s history, the callbacks' logs, ``evaluate``):

* ``loss`` is the compiled loss alone (the pretext loss, the cross-entropy);
* the terms of a compiled loss that has them (`losses.GeodesicLoss.terms`) as ``<term>_term``:
  ``angle_term``, and ``residual_term``, ``mse_term``, ``chordal_term`` where their weight is
  above 0; computed with the loss, at its step (a decaying MSE weight included), so that they
  sum to ``loss``;
* the added losses as ``l2_penalty`` (`metrics.PENALTY`), where the model has any at
  ``compile``;
* ``fit`` with ``verbose`` shows them in that order (`ShownOrderBar`, unless a progress bar is
  given), the compiled metrics (``angle_deg``, ``rotation_accuracy``, ``accuracy``) after the
  terms (`metrics.shown_order`).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from aetv2_tf.method.metrics import PENALTY, shown_order

_DATA_LOSS = "data_loss"  # the tracker's own name; shown as "loss"


def _unscaled(value):
    """``value`` times the replicas of a `tf.distribute` strategy, whose losses Keras divides
    by them (as Keras's own ``loss`` tracker undoes it)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            value = value * float(replicas)
    return value


class ShownOrderBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar with the logs in the order shown (`metrics.shown_order`: the loss
    and its terms first), not Keras's alphabetical order."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, {k: logs[k] for k in shown_order(logs or {})})

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, {k: logs[k] for k in shown_order(logs or {})})


class ShowsDataLoss:
    """Mixin of a `keras.Model` (before ``keras.Model`` in the bases; module docstring): the
    shown ``loss`` excludes ``model.losses``, shown apart as ``l2_penalty``, and the compiled
    loss's terms are shown beside it; the optimizer still minimises ``loss + l2_penalty``.
    Decided at ``compile``, from the loss compiled and whether the model has added losses
    then."""

    def compile(self, *args: Any, **kwargs: Any) -> None:
        super().compile(*args, **kwargs)
        trackers = {name: keras.metrics.Mean(name=f"{name}_term")
                    for name in getattr(self.loss, "terms", ())}
        if self.losses:
            trackers.update({_DATA_LOSS: keras.metrics.Mean(name=_DATA_LOSS),
                             PENALTY: keras.metrics.Mean(name=PENALTY)})
        object.__setattr__(self, "_shown_apart", trackers)  # not a tracked sub-object

    @property
    def metrics(self) -> list:
        return [*super().metrics, *getattr(self, "_shown_apart", {}).values()]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        total = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        trackers = getattr(self, "_shown_apart", {})
        if not trackers or total is None:
            return total
        batch = ops.shape(next(a for a in keras.tree.flatten(y_pred) if a is not None))[0]
        for name in getattr(self.loss, "terms", ()):
            trackers[name].update_state(self.loss.term(name, y, y_pred), sample_weight=batch)
        if PENALTY in trackers:
            penalty = ops.sum(ops.stack([ops.cast(ops.sum(loss), total.dtype)
                                         for loss in self.losses]))
            trackers[_DATA_LOSS].update_state(_unscaled(total - penalty), sample_weight=batch)
            trackers[PENALTY].update_state(penalty, sample_weight=batch)
        return total

    def get_metrics_result(self) -> dict:
        result = super().get_metrics_result()
        if _DATA_LOSS in result:
            result["loss"] = result.pop(_DATA_LOSS)
        return result

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
