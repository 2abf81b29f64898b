"""What training shows: the loss the optimiser minimises and its terms first, the angle in the
frame of the loss, the weight decay apart (`aetv2_tf.method.metrics`, `models.displayed_loss`,
`program.monitoring.ProgressBar`)."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from aetv2_tf.data.sources import load_cifar10
from aetv2_tf.method import recipes
from aetv2_tf.method.metrics import geodesic_angle_deg, pretext_metrics
from aetv2_tf.models import build_backbone
from aetv2_tf.models.image_models import build_classifier
from aetv2_tf.probes.classifier import probe_optimizer
from aetv2_tf.program.monitoring import ProgressBar

#: Each recipe's terms shown beside its loss: those of weight above 0.
TERMS = {
    "AETV2": ["angle", "residual"],
    "AETV2_ZOOM16": ["angle"],
    "AETV2_PAPER": ["angle", "residual"],
    "AETV2_HYBRID": ["angle", "mse"],
    "AETV1": [],
}


def _pairs(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(y_true, y_pred) (n, 8): homographies near the identity, some quarter-turned."""
    rng = np.random.default_rng(seed)
    turns = rng.integers(0, 4, n)
    c, s = np.cos(turns * np.pi / 2), np.sin(turns * np.pi / 2)
    y_true = np.stack([c, -s, 0 * c, s, c, 0 * c, 0 * c, 0 * c], -1) + rng.normal(0, 0.1, (n, 8))
    y_pred = y_true + rng.normal(0, 0.1, (n, 8))
    return y_true.astype(np.float32), y_pred.astype(np.float32)


def _mean(values) -> float:
    return float(np.mean(keras.ops.convert_to_numpy(values)))


@pytest.mark.parametrize("name", sorted(TERMS))
def test_each_recipe_has_the_terms_of_its_weights_and_the_angle_of_its_frame(name):
    """The terms of weight above 0 sum to the loss; ``angle_deg`` is the angle of the loss's
    frame (the zoomed one for the recipe, not the unit frame's), the AETv1 MSE's in the model
    frame; the angle term of theta^2 is its square."""
    recipe = getattr(recipes, name)
    loss = recipe.build_loss(32)
    assert list(getattr(loss, "terms", ())) == TERMS[name]
    metrics = pretext_metrics(loss)
    assert [m.name for m in metrics] == ["angle_deg", "rotation_accuracy"]
    y_true, y_pred = _pairs()
    for m in metrics:
        m.update_state(y_true, y_pred)
    angle = float(metrics[0].result())
    if TERMS[name]:
        terms = sum(_mean(loss.term(t, y_true, y_pred)) for t in TERMS[name])
        assert terms == pytest.approx(float(loss(y_true, y_pred)), rel=1e-5)
    unit = _mean(geodesic_angle_deg(y_true, y_pred))
    if recipe.loss.kind == "mse" or recipe.loss.frame_scale == 1:
        assert angle == pytest.approx(unit, rel=1e-4)
    else:
        theta = keras.ops.convert_to_numpy(loss.term("theta", y_true, y_pred))
        assert angle == pytest.approx(float(np.mean(theta)) * 180 / math.pi, rel=1e-5)
        assert abs(angle - unit) > 1.0  # not the unit frame's
        if recipe.loss.angle_power == 2:  # theta^2 in the loss: the angle term is its square
            assert _mean(loss.term("angle", y_true, y_pred)) == pytest.approx(
                float(np.mean(np.square(theta))), rel=1e-5)


@pytest.fixture(scope="module")
def images(cifar10_dir):
    test_images, test_labels = load_cifar10(cifar10_dir, "test")
    return test_images[:64], test_labels[:64]


def _penalty(weights, weight_decay: float) -> float:
    """``weight_decay / 2 * sum ||w||^2`` in float64."""
    return weight_decay / 2 * sum(float(np.sum(np.square(w.numpy().astype(np.float64))))
                                  for w in weights)


def test_the_loss_shown_is_the_data_loss_and_the_weight_decay_is_shown_apart(images):
    """A pretext model compiled by its recipe (coupled L2 decay 5e-4, the optimizer's): ``loss``
    is the pretext loss (the sum of its terms), ``l2_penalty`` the decay's penalty of its
    trainable weights; the model carries no regularizer and no added loss. Nor does a
    classifier built on its encoder in the same process: compiled with a plain optimizer it
    shows the cross-entropy alone, with the probes' (SGD with the coupled decay) the
    cross-entropy and its own penalty apart."""
    x, y = images
    keras.utils.set_random_seed(0)
    encoder = build_backbone("nin")
    model = recipes.AETV2.build_model(encoder, seed=0)
    recipes.AETV2.compile(model, steps=10_000)
    assert model.losses == [] and all(w.regularizer is None for w in model.weights)
    shown = model.evaluate(x[:16], batch_size=16, verbose=0, return_dict=True)
    assert sorted(shown) == sorted(["loss", "angle_term", "residual_term", "angle_deg",
                                    "rotation_accuracy", "l2_penalty"])
    assert shown["loss"] == pytest.approx(shown["angle_term"] + shown["residual_term"], rel=1e-5)
    penalty = _penalty(model.trainable_weights, 5e-4)
    assert shown["l2_penalty"] == pytest.approx(penalty, rel=1e-5) and penalty > 0.5

    classifier = build_classifier(encoder, 10)  # the pretrained encoder: no decay of its own
    assert classifier.losses == [] and all(w.regularizer is None for w in classifier.weights)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    classifier.compile("adam", cross_entropy, metrics=["accuracy"])
    shown = classifier.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    logits = classifier.predict(x, batch_size=64, verbose=0)
    assert sorted(shown) == ["accuracy", "loss"]
    assert shown["loss"] == pytest.approx(float(cross_entropy(y, logits)), rel=1e-4)
    classifier.compile(probe_optimizer(), cross_entropy, metrics=["accuracy"])
    shown = classifier.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    assert sorted(shown) == ["accuracy", "l2_penalty", "loss"]
    assert shown["loss"] == pytest.approx(float(cross_entropy(y, logits)), rel=1e-4)
    penalty = _penalty(classifier.trainable_weights, 5e-4)
    assert shown["l2_penalty"] == pytest.approx(penalty, rel=1e-5) and penalty > 0.1
    # evaluate's list keeps Keras's order: [loss, accuracy, ...]
    assert classifier.evaluate(x, y, batch_size=64, verbose=0)[:2] == \
        pytest.approx([shown["loss"], shown["accuracy"]])

    plain = build_classifier(build_backbone("nin"), 10)  # no decay: what Keras shows
    plain.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert sorted(plain.evaluate(x, y, verbose=0, return_dict=True)) == ["loss"]


class _StopAt(keras.callbacks.Callback):
    def __init__(self, batches: int):
        super().__init__()
        self.batches = batches

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 >= self.batches:
            self.model.stop_training = True


@pytest.mark.slow
def test_the_progress_bar_shows_the_loss_first_and_stops_where_training_stopped(images, capsys):
    """Keras sorts its logs by name and draws a stopped epoch to its end; the program's bar
    shows the loss first and ends at the step reached (2/5), full only at the run's end; a
    pretext model's own ``fit`` shows the loss and its terms first too."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse", metrics=[keras.metrics.MeanAbsoluteError(name="a_error")])
    x, y = np.ones((10, 4), np.float32), np.zeros((10, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=1, verbose=1,
              callbacks=[ProgressBar(lambda: False), _StopAt(2)])
    out = capsys.readouterr().out
    last = out.replace("\r", "\n").strip().splitlines()[-1]
    assert "2/5" in last and "5/5" not in out, out
    assert last.index("loss:") < last.index("a_error:"), last
    model.fit(x, y, batch_size=2, epochs=1, verbose=1,
              callbacks=[ProgressBar(lambda: True), _StopAt(3)])
    last = capsys.readouterr().out.replace("\r", "\n").strip().splitlines()[-1]
    assert "3/3" in last, last
    x, _ = images
    keras.utils.set_random_seed(0)
    model = recipes.AETV2.build_model(build_backbone("nin"), seed=0)
    recipes.AETV2.compile(model, steps=10_000)
    model.run_eagerly = True  # the same logs, without tracing a train step for one step
    model.fit(x[:8], batch_size=8, epochs=1, verbose=2)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    order = [line.index(f" {n}: ") for n in ("loss", "angle_term", "residual_term",
                                              "angle_deg", "rotation_accuracy", "l2_penalty")]
    assert order == sorted(order), line
