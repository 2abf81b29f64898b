"""Network-In-Network (NIN), the 4-block CIFAR backbone of RotNet, AETv1 and AETv2.

Every layer is Conv2D (no bias) + BN + ReLU, with the AETv1 init N(0, sqrt(2 / (k*k*out))):

| block | layers (out@kxk)                 | then                          | 32x32 input -> |
|-------|----------------------------------|-------------------------------|----------------|
| 1     | 192@5x5, 160@1x1, 96@1x1         | MaxPool 3x3 / 2, pad 1        | 16 x 16 x 96   |
| 2     | 192@5x5, 192@1x1, 192@1x1        | AvgPool 3x3 / 2, pad 1        | 8 x 8 x 192    |
| 3, 4  | 192@3x3, 192@1x1, 192@1x1        | -                             | 8 x 8 x 192    |

The pooling is PyTorch's `padding=1` on every side: `ZeroPadding2D(1)` then a "valid" pool
(exact for the average with `count_include_pad=True`, and for the max after a ReLU).
Layer names: `block{b}_conv{l}` (+ `_bn`, `_relu`), `block{1,2}_pad`, `block1_maxpool`,
`block2_avgpool`; the model returns the dict of the maps after each block.
"""

from __future__ import annotations

import keras

from aetv2_tf.models.blocks import conv_bn_relu

# (filters, kernel_size) of the three layers of each block, and the pooling that ends it.
NIN_BLOCK_SPECS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((192, 5), (160, 1), (96, 1)),
    ((192, 5), (192, 1), (192, 1)),
    ((192, 3), (192, 1), (192, 1)),
    ((192, 3), (192, 1), (192, 1)),
)
NIN_BLOCK_POOLING: tuple[str | None, ...] = ("max", "avg", None, None)


def nin_block(x, spec: tuple[tuple[int, int], ...], *, name: str, batch_norm: str = "fused"):
    """Three conv+BN+ReLU layers `{name}_conv1..3` ("same"): `(B, H, W, C) -> (B, H, W, F)`."""
    for index, (filters, kernel_size) in enumerate(spec, start=1):
        x = conv_bn_relu(x, filters, kernel_size, name=f"{name}_conv{index}", batch_norm=batch_norm)
    return x


def torch_pool(x, kind: str, *, name: str):
    """PyTorch `MaxPool2d/AvgPool2d(3, stride=2, padding=1)` on a non-negative `(B, H, W, C)`
    -> `(B, floor((H - 1) / 2) + 1, floor((W - 1) / 2) + 1, C)`."""
    x = keras.layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
    if kind == "max":
        return keras.layers.MaxPooling2D(3, strides=2, name=f"{name}_maxpool")(x)
    if kind == "avg":
        return keras.layers.AveragePooling2D(3, strides=2, name=f"{name}_avgpool")(x)
    raise ValueError(f"pooling kind must be 'max' or 'avg', got {kind!r}")


def build_nin(input_shape: tuple[int, int, int] = (32, 32, 3), num_blocks: int = 4,
              batch_norm: str = "fused", name: str = "nin") -> keras.Model:
    """The NIN encoder: `(B, H, W, 3)` -> dict of block outputs.

    `num_blocks` (1..4): the outputs `block1..blockN`; `batch_norm`: "fused" or "keras".
    Returns a `keras.Model` whose output is `{"block1": (B, 16, 16, 96), "block2": (B, 8, 8, 192),
        "block3": (B, 8, 8, 192), "block4": (B, 8, 8, 192)}` for 32x32 inputs.
    """
    if not 1 <= num_blocks <= len(NIN_BLOCK_SPECS):
        raise ValueError(f"num_blocks must be in 1..{len(NIN_BLOCK_SPECS)}, got {num_blocks}")
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    outputs = {}
    for index in range(num_blocks):
        block = f"block{index + 1}"
        x = nin_block(x, NIN_BLOCK_SPECS[index], name=block, batch_norm=batch_norm)
        if NIN_BLOCK_POOLING[index] is not None:
            x = torch_pool(x, NIN_BLOCK_POOLING[index], name=block)
        outputs[block] = x
    return keras.Model(inputs, outputs, name=name)
