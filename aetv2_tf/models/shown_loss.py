"""The loss a model shows is its data loss; the weight decay is shown apart.

Keras adds a model's own losses (``model.losses``: regularizers, ``add_loss``; here the coupled
L2 weight decay of `optim.add_l2_decay`, which a pretraining recipe puts on the encoder's
weights, so that a classifier built on that encoder in the same process carries it too) to the
loss it trains on AND to the ``loss`` it shows. `ShowsDataLoss` keeps the training as it is and
changes what is shown: ``loss`` is the compiled loss alone (the geodesic loss, the
cross-entropy), and the added losses appear as the separate scalar ``l2_penalty``
(`metrics.PENALTY`) in the progress bar, ``fit``'s history, the callbacks' logs and
``evaluate``. A model without added losses at ``compile`` shows what Keras shows.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from aetv2_tf.metrics import PENALTY

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


class ShowsDataLoss:
    """Mixin of a `keras.Model` (before ``keras.Model`` in the bases; module docstring): the
    shown ``loss`` excludes ``model.losses``, shown apart as ``l2_penalty``; the optimizer
    still minimises their sum. Decided at ``compile`` from whether the model has added losses
    then."""

    def compile(self, *args: Any, **kwargs: Any) -> None:
        super().compile(*args, **kwargs)
        trackers = (keras.metrics.Mean(name=_DATA_LOSS), keras.metrics.Mean(name=PENALTY)) \
            if self.losses else ()
        object.__setattr__(self, "_shown_apart", trackers)  # not a tracked sub-object

    @property
    def metrics(self) -> list:
        return [*super().metrics, *getattr(self, "_shown_apart", ())]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        total = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        trackers = getattr(self, "_shown_apart", ())
        if trackers and total is not None:
            penalty = ops.sum(ops.stack([ops.cast(ops.sum(loss), total.dtype)
                                         for loss in self.losses]))
            batch = ops.shape(next(a for a in keras.tree.flatten(y_pred) if a is not None))[0]
            trackers[0].update_state(_unscaled(total - penalty), sample_weight=batch)
            trackers[1].update_state(penalty, sample_weight=batch)
        return total

    def get_metrics_result(self) -> dict:
        result = super().get_metrics_result()
        if _DATA_LOSS in result:
            result["loss"] = result.pop(_DATA_LOSS)
        return result


@keras.saving.register_keras_serializable(package="aetv2_tf")
class DataLossModel(ShowsDataLoss, keras.Model):
    """A functional `keras.Model` that shows its data loss and its penalty apart
    (`ShowsDataLoss`), e.g. the RotNet model of the TensorFlow program."""
