"""What a model shows while it trains: its loss first, the loss's terms, the weight decay
apart, in that order.

The coupled weight decay is the optimizer's, so the ``loss`` shown is the compiled loss alone.
`ShowsDataLoss` adds to what is shown (progress bar, history, logs, ``evaluate``): the terms of a
compiled loss that has them (`losses.GeodesicLoss.terms`) as ``<term>_term``, computed with the
loss at its step so that they sum to ``loss``; and ``l2_penalty`` (``wd / 2 * sum ||w||^2``,
`optimizers.l2_penalty`) where the optimizer has a coupled decay ``wd > 0``; ``fit`` shows them
in `metrics.shown_order` (`ShownOrderBar`).
"""

from __future__ import annotations

from typing import Any

import keras

from aetv2_tf.method.metrics import PENALTY, shown_order
from aetv2_tf.method.optimizers import coupled_l2_decay, l2_penalty


class ShownOrderBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar with the logs in `metrics.shown_order`."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, {k: logs[k] for k in shown_order(logs or {})})

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, {k: logs[k] for k in shown_order(logs or {})})


class ShowsDataLoss:
    """Mixin of a `keras.Model` (before it in the bases): the compiled loss's terms and the
    ``l2_penalty`` shown (module docstring), decided at ``compile``."""

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
