"""Building blocks shared by the backbones and the probe heads.

* `FusedBatchNormalization`: a drop-in replacement for `keras.layers.BatchNormalization` (channels
  last) that runs TensorFlow's fused kernel (`FusedBatchNormV3`), kept for speed: Keras 3
  computes the moments with generic reductions, and the fused kernel makes a whole NIN training
  step 1.6x (float32) to 3.1x (bfloat16) faster per CPU-second on a CPU (docs/benchmarks-log.md,
  "Training step (benchmarks.step)" on the Xeon with AMX: 46.9 against 28.8 pairs per CPU-second
  in float32, 110.0 against 35.7 in bfloat16). Same variables as Keras's layer: its weights
  load into either (`set_weights`), the encoder's files are written in Keras's layout.
* `AdaptivePooling2D`: PyTorch's `AdaptiveAvgPool2d` / `AdaptiveMaxPool2d` for static shapes.
* `make_batch_norm`, `conv_bn_relu`, `dense_bn_relu`: the "layer + BN + ReLU" unit used everywhere.

Batch-norm hyper-parameters follow the PyTorch defaults of the published AETv1/RotNet code
(`BN_MOMENTUM = 0.9` in the Keras convention, i.e. PyTorch's `momentum=0.1`, `BN_EPSILON = 1e-5`).

TensorFlow is imported only when a TF-only layer runs (the fused BN, the adaptive pooling): the
module, `make_batch_norm("keras")` and `conv_bn_relu(batch_norm="keras")` work on any backend.
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

    Same constructor arguments and semantics as `keras.layers.BatchNormalization` (without
    `renorm`, `synchronized` and masking), same variables in the same order (`gamma`, `beta`,
    `moving_mean`, `moving_variance`, all float32 even under a mixed-precision policy), so
    `set_weights(bn_model.get_weights())` and `tf.train.Checkpoint` restore across the two.
    Note that `.weights.h5` files key layers by class name, so those do not cross-load.

    Input: any tensor of rank >= 2 with channels last, `(..., C)`. 4-D `(B, H, W, C)` maps go to
    the kernel directly; other ranks are reshaped to `(N, 1, 1, C)` first (e.g. the BN after a
    Dense layer), which normalizes over the same axes. Output: same shape, in the compute dtype
    (bfloat16/float16 inputs are fed to the kernel as they are, with float32 statistics).

    Training (`training=True` and `self.trainable`): normalizes with the batch statistics of this
    replica and updates `moving = moving * momentum + batch * (1 - momentum)`, where the batch
    variance is the BIASED one (divided by N), exactly like Keras 3. The kernel returns the
    unbiased variance, so it is rescaled by `(N - 1) / N`. Inference: uses the moving statistics.
    Under `tf.distribute`, statistics are per replica (not synchronized), like Keras's default.
    Inside `batch_statistics_groups(G)` the training statistics are per group of the batch, one
    kernel call each (`models.batch_groups`).
    """

    GROUPS_BATCH_STATISTICS = True  # (`batch_groups.groupable`)

    def __init__(
        self,
        axis: int = -1,
        momentum: float = 0.99,
        epsilon: float = 1e-3,
        center: bool = True,
        scale: bool = True,
        beta_initializer="zeros",
        gamma_initializer="ones",
        moving_mean_initializer="zeros",
        moving_variance_initializer="ones",
        beta_regularizer=None,
        gamma_regularizer=None,
        beta_constraint=None,
        gamma_constraint=None,
        **kwargs,
    ):
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
        shape = (channels,)
        # Creation order and names match keras.layers.BatchNormalization.
        if self.scale:
            self.gamma = self.add_weight(
                shape=shape,
                name="gamma",
                initializer=self.gamma_initializer,
                regularizer=self.gamma_regularizer,
                constraint=self.gamma_constraint,
                trainable=True,
                autocast=False,
            )
        if self.center:
            self.beta = self.add_weight(
                shape=shape,
                name="beta",
                initializer=self.beta_initializer,
                regularizer=self.beta_regularizer,
                constraint=self.beta_constraint,
                trainable=True,
                autocast=False,
            )
        self.moving_mean = self.add_weight(
            shape=shape,
            name="moving_mean",
            initializer=self.moving_mean_initializer,
            trainable=False,
            autocast=False,
        )
        self.moving_variance = self.add_weight(
            shape=shape,
            name="moving_variance",
            initializer=self.moving_variance_initializer,
            trainable=False,
            autocast=False,
        )
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
                x=x,
                scale=gamma,
                offset=beta,
                mean=tf.convert_to_tensor(self.moving_mean),
                variance=tf.convert_to_tensor(self.moving_variance),
                epsilon=self.epsilon,
                exponential_avg_factor=1.0,
                data_format="NHWC",
                is_training=False,
            )[0]
        if len(inputs.shape) != 4:
            y = tf.reshape(y, tf.shape(inputs))
        return y

    def _train_batch(self, x, gamma, beta):
        """Normalises ``x`` ``(N, H, W, C)`` by its batch statistics and updates the moving
        averages with them."""
        import tensorflow as tf

        y, batch_mean, batch_var_unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=gamma,
            offset=beta,
            mean=tf.zeros((0,), tf.float32),
            variance=tf.zeros((0,), tf.float32),
            epsilon=self.epsilon,
            exponential_avg_factor=1.0,
            data_format="NHWC",
            is_training=True,
        )
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
        ser = keras.saving.serialize_keras_object
        return {
            **super().get_config(),
            "axis": self.axis,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "beta_initializer": ser(self.beta_initializer),
            "gamma_initializer": ser(self.gamma_initializer),
            "moving_mean_initializer": ser(self.moving_mean_initializer),
            "moving_variance_initializer": ser(self.moving_variance_initializer),
            "beta_regularizer": ser(self.beta_regularizer),
            "gamma_regularizer": ser(self.gamma_regularizer),
            "beta_constraint": ser(self.beta_constraint),
            "gamma_constraint": ser(self.gamma_constraint),
        }


def _adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: cell i covers [floor(i*size/out), ceil((i+1)*size/out))."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


@keras.saving.register_keras_serializable(package="aetv2_tf")
class AdaptivePooling2D(keras.layers.Layer):
    """Adaptive average/max pooling of `(B, H, W, C)` to `(B, out_h, out_w, C)`, as in PyTorch.

    Output cell `(i, j)` pools input rows `floor(i*H/out_h) .. ceil((i+1)*H/out_h) - 1` and the
    analogous columns (windows may overlap when the sizes do not divide). The window of a cell is
    a rectangle with uniform weights, so pooling rows first and columns second is exact for both
    the mean and the max. Needs static `H` and `W`.
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


def make_batch_norm(
    batch_norm: str = "fused",
    name: str | None = None,
    center: bool = True,
    scale: bool = True,
) -> keras.layers.Layer:
    """A channels-last BN layer with the PyTorch-default statistics (gamma=1, beta=0).

    `batch_norm="fused"` gives `FusedBatchNormalization`, `"keras"` gives
    `batch_groups.BatchNormalization` (``keras.layers.BatchNormalization`` under the same class
    name, group-aware); both take the same arguments and compute the same thing.
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


def conv_bn_relu(
    x,
    filters: int,
    kernel_size: int,
    *,
    name: str,
    strides: int = 1,
    padding: int | str = "same",
    batch_norm: str = "fused",
):
    """Conv2D (no bias) + BN + ReLU on a `(B, H, W, C)` tensor; returns `(B, H', W', filters)`.

    `padding` is either "same"/"valid" or an int `p`: zero padding of `p` pixels on every side
    followed by a "valid" convolution, i.e. PyTorch's `padding=p` (needed for strided convs,
    where Keras's "same" pads asymmetrically). Layers: `{name}[_pad]`, `{name}`, `{name}_bn`,
    `{name}_relu`. The conv bias is omitted since BN removes it.
    """
    if isinstance(padding, int):
        if padding > 0:
            x = keras.layers.ZeroPadding2D(padding, name=f"{name}_pad")(x)
        padding = "valid"
    x = keras.layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding=padding,
        use_bias=False,
        kernel_initializer=conv_init(kernel_size, filters),
        name=name,
    )(x)
    x = make_batch_norm(batch_norm, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def dense_bn_relu(
    x,
    units: int,
    *,
    name: str,
    batch_norm: str = "fused",
    kernel_initializer="glorot_uniform",
):
    """Dense (no bias) + BN + ReLU on a `(B, D)` tensor; returns `(B, units)`.

    Layers: `{name}`, `{name}_bn`, `{name}_relu`.
    """
    x = keras.layers.Dense(units, use_bias=False, kernel_initializer=kernel_initializer, name=name)(
        x
    )
    x = make_batch_norm(batch_norm, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def torch_linear_init() -> keras.initializers.Initializer:
    """PyTorch's default `nn.Linear` weight init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")
