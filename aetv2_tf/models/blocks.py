"""Building blocks shared by the backbones and the probe heads.

* `FusedBatchNormalization`: `keras.layers.BatchNormalization` (channels last) on TensorFlow's
  fused kernel, 1.6x (float32) to 3.1x (bfloat16) faster NIN steps on a CPU
  (docs/benchmarks-log.md); the same variables as Keras's layer.
* `AdaptivePooling2D`: PyTorch's `AdaptiveAvgPool2d` / `AdaptiveMaxPool2d` for static shapes.
* `make_batch_norm`, `conv_bn_relu`, `dense_bn_relu`: the "layer + BN + ReLU" unit.

Batch-norm settings are the PyTorch defaults of the AETv1/RotNet code (`BN_MOMENTUM = 0.9` in
Keras's convention, PyTorch's 0.1; `BN_EPSILON = 1e-5`). TensorFlow is imported only when the
fused BN runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras

from aetv2_tf.models.batch_groups import (
    BatchNormalization,
    current_batch_statistics_groups,
    split_batch,
)

BN_MOMENTUM = 0.9  # Keras convention: moving = moving * momentum + batch * (1 - momentum).
BN_EPSILON = 1e-5  # PyTorch's default; the raw fused op does not clamp it (tf.nn's wrapper does).
BATCH_NORM_KINDS = ("fused", "keras")


@keras.saving.register_keras_serializable(package="aetv2_tf")
class FusedBatchNormalization(keras.layers.Layer):
    """Batch normalization over the last axis computed by the fused TensorFlow kernel.

    The arguments and semantics of `keras.layers.BatchNormalization` (without `renorm`,
    `synchronized`, masking) and its variables in its order (`gamma`, `beta`, `moving_mean`,
    `moving_variance`, float32 under any policy): `set_weights` and `tf.train.Checkpoint` cross
    between the two (`.weights.h5` files, keyed by class name, do not).

    Input `(..., C)` of rank >= 2 (other than 4-D reshaped to `(N, 1, 1, C)`); output the same
    shape in the compute dtype. Training: per-replica batch statistics, the moving averages
    updated with the BIASED variance as Keras 3 (the kernel's unbiased one times `(N - 1) / N`);
    per group inside `batch_statistics_groups(G)` (`models.batch_groups`).
    """

    GROUPS_BATCH_STATISTICS = True  # (`batch_groups.groupable`)

    def __init__(self, axis: int = -1, momentum: float = 0.99, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True, beta_initializer="zeros",
                 gamma_initializer="ones", moving_mean_initializer="zeros",
                 moving_variance_initializer="ones", beta_regularizer=None, gamma_regularizer=None,
                 beta_constraint=None, gamma_constraint=None, **kwargs):
        super().__init__(**kwargs)
        self.axis = int(axis)
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.moving_mean_initializer = keras.initializers.get(moving_mean_initializer)
        self.moving_variance_initializer = keras.initializers.get(moving_variance_initializer)
        self.beta_regularizer = keras.regularizers.get(beta_regularizer)
        self.gamma_regularizer = keras.regularizers.get(gamma_regularizer)
        self.beta_constraint = keras.constraints.get(beta_constraint)
        self.gamma_constraint = keras.constraints.get(gamma_constraint)
        self.gamma = None
        self.beta = None

    def build(self, input_shape: Sequence[int | None]) -> None:
        rank = len(input_shape)
        if rank < 2 or self.axis not in (-1, rank - 1):
            raise ValueError(
                f"FusedBatchNormalization normalizes the last axis of a tensor of rank >= 2; "
                f"got axis={self.axis} for input shape {tuple(input_shape)}."
            )
        channels = input_shape[-1]
        if channels is None:
            raise ValueError("The channel dimension of the input must be known.")

        def weight(name: str, trainable: bool = False):  # keras.layers.BatchNormalization's order
            return self.add_weight(
                shape=(channels,), name=name, initializer=getattr(self, f"{name}_initializer"),
                regularizer=getattr(self, f"{name}_regularizer", None),
                constraint=getattr(self, f"{name}_constraint", None), trainable=trainable,
                autocast=False)

        if self.scale:
            self.gamma = weight("gamma", trainable=True)
        if self.center:
            self.beta = weight("beta", trainable=True)
        self.moving_mean = weight("moving_mean")
        self.moving_variance = weight("moving_variance")
        self.input_spec = keras.layers.InputSpec(ndim=rank, axes={-1: channels})

    def compute_output_shape(self, input_shape):
        return input_shape

    def call(self, inputs, training=None):
        import tensorflow as tf

        channels = self.moving_mean.shape[0]
        x = inputs
        if len(inputs.shape) != 4:
            x = tf.reshape(inputs, (-1, 1, 1, channels))
        # The kernel needs both affine terms: use the identity where they are disabled.
        ones, zeros = tf.ones((channels,), tf.float32), tf.zeros((channels,), tf.float32)
        gamma = tf.convert_to_tensor(self.gamma) if self.scale else ones
        beta = tf.convert_to_tensor(self.beta) if self.center else zeros
        if bool(training) and self.trainable:  # per group inside `batch_statistics_groups`
            groups = current_batch_statistics_groups()
            parts = split_batch(x, groups) if groups > 1 else [x]
            y = [self._train_batch(part, gamma, beta) for part in parts]  # in group order
            y = y[0] if len(y) == 1 else tf.concat(y, axis=0)
        else:
            y = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=gamma, offset=beta, mean=tf.convert_to_tensor(self.moving_mean),
                variance=tf.convert_to_tensor(self.moving_variance), epsilon=self.epsilon,
                exponential_avg_factor=1.0, data_format="NHWC", is_training=False)[0]
        if len(inputs.shape) != 4:
            y = tf.reshape(y, tf.shape(inputs))
        return y

    def _train_batch(self, x, gamma, beta):
        """Normalises ``x`` ``(N, H, W, C)`` by its batch statistics and updates the moving
        averages with them."""
        import tensorflow as tf

        y, batch_mean, batch_var_unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=tf.zeros((0,), tf.float32),
            variance=tf.zeros((0,), tf.float32), epsilon=self.epsilon,
            exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
        # Keras 3 tracks the biased variance; the kernel reports the unbiased one.
        count = tf.cast(tf.size(x) // self.moving_mean.shape[0], tf.float32)
        batch_var = batch_var_unbiased * (tf.maximum(count - 1.0, 1.0) / count)
        self.moving_mean.assign(
            self.moving_mean * self.momentum + batch_mean * (1.0 - self.momentum)
        )
        self.moving_variance.assign(
            self.moving_variance * self.momentum + batch_var * (1.0 - self.momentum)
        )
        return y

    def get_config(self) -> dict:
        objects = [f"{w}_initializer" for w in ("beta", "gamma", "moving_mean", "moving_variance")]
        objects += [f"{w}_{k}" for k in ("regularizer", "constraint") for w in ("beta", "gamma")]
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum,
                "epsilon": self.epsilon, "center": self.center, "scale": self.scale,
                **{n: keras.saving.serialize_keras_object(getattr(self, n)) for n in objects}}


def _adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: cell i covers [floor(i*size/out), ceil((i+1)*size/out))."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


@keras.saving.register_keras_serializable(package="aetv2_tf")
class AdaptivePooling2D(keras.layers.Layer):
    """Adaptive average/max pooling of `(B, H, W, C)` to `(B, out_h, out_w, C)`, as in PyTorch.

    Output cell `(i, j)` pools input rows `floor(i*H/out_h) .. ceil((i+1)*H/out_h) - 1` and the
    analogous columns (rows first, then columns: exact for mean and max). Needs static `H`, `W`.
    """

    def __init__(self, output_size: int | Sequence[int], mode: str = "avg", **kwargs):
        super().__init__(**kwargs)
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        self.output_size = tuple(int(s) for s in output_size)
        if mode not in ("avg", "max"):
            raise ValueError(f"mode must be 'avg' or 'max', got {mode!r}")
        self.mode = mode

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *self.output_size, input_shape[-1])

    def _pool_axis(self, x, axis: int, out: int):
        reduce = keras.ops.mean if self.mode == "avg" else keras.ops.max
        size = x.shape[axis]
        cells = []
        for start, stop in _adaptive_bounds(size, out):
            window = x[:, start:stop] if axis == 1 else x[:, :, start:stop]
            cells.append(reduce(window, axis=axis, keepdims=True))
        return keras.ops.concatenate(cells, axis=axis)

    def call(self, inputs):
        x = self._pool_axis(inputs, 1, self.output_size[0])
        return self._pool_axis(x, 2, self.output_size[1])

    def get_config(self) -> dict:
        return {**super().get_config(), "output_size": self.output_size, "mode": self.mode}


def make_batch_norm(batch_norm: str = "fused", name: str | None = None, center: bool = True,
                    scale: bool = True) -> keras.layers.Layer:
    """A channels-last BN layer with the PyTorch-default statistics (gamma=1, beta=0).

    `batch_norm`: "fused" (`FusedBatchNormalization`) or "keras" (the group-aware
    `batch_groups.BatchNormalization`); the same computation.
    """
    kwargs = dict(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, center=center, scale=scale, name=name)
    if batch_norm == "fused":
        return FusedBatchNormalization(**kwargs)
    if batch_norm == "keras":
        return BatchNormalization(**kwargs)
    raise ValueError(f"batch_norm must be one of {BATCH_NORM_KINDS}, got {batch_norm!r}")


def conv_init(kernel_size: int, filters: int) -> keras.initializers.Initializer:
    """AETv1/RotNet conv init: N(0, sqrt(2 / (k * k * out_channels)))."""
    return keras.initializers.RandomNormal(0.0, math.sqrt(2.0 / (kernel_size**2 * filters)))


def conv_bn_relu(x, filters: int, kernel_size: int, *, name: str, strides: int = 1,
                 padding: int | str = "same", batch_norm: str = "fused"):
    """Conv2D (no bias) + BN + ReLU on a `(B, H, W, C)` tensor; returns `(B, H', W', filters)`.

    `padding`: "same"/"valid" or an int `p`: PyTorch's `padding=p` (zero padding, then
    "valid"). Layers: `{name}[_pad]`, `{name}`, `{name}_bn`, `{name}_relu`.
    """
    if isinstance(padding, int):
        if padding > 0:
            x = keras.layers.ZeroPadding2D(padding, name=f"{name}_pad")(x)
        padding = "valid"
    x = keras.layers.Conv2D(filters, kernel_size, strides=strides, padding=padding,
                            use_bias=False, kernel_initializer=conv_init(kernel_size, filters),
                            name=name)(x)
    x = make_batch_norm(batch_norm, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def dense_bn_relu(x, units: int, *, name: str, batch_norm: str = "fused",
                  kernel_initializer="glorot_uniform"):
    """Dense (no bias) + BN + ReLU, `(B, D) -> (B, units)`; layers `{name}`, `_bn`, `_relu`."""
    x = keras.layers.Dense(units, use_bias=False, kernel_initializer=kernel_initializer,
                           name=name)(x)
    x = make_batch_norm(batch_norm, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def torch_linear_init() -> keras.initializers.Initializer:
    """PyTorch's default `nn.Linear` weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")
