"""AlexNet with batch norm, the ImageNet backbone of RotNet, AETv1 and AETv2.

| layer | op                                             | 224x224 input ->  |
|-------|------------------------------------------------|-------------------|
| conv1 | 64@11x11 / 4, pad 2, BN, ReLU                  | 55 x 55 x 64      |
| pool1 | MaxPool 3x3 / 2                                | 27 x 27 x 64      |
| conv2 | 192@5x5, pad 2, BN, ReLU                       | 27 x 27 x 192     |
| pool2 | MaxPool 3x3 / 2                                | 13 x 13 x 192     |
| conv3 | 384@3x3, pad 1, BN, ReLU                       | 13 x 13 x 384     |
| conv4 | 256@3x3, pad 1, BN, ReLU                       | 13 x 13 x 256     |
| conv5 | 256@3x3, pad 1, BN, ReLU                       | 13 x 13 x 256     |
| pool5 | MaxPool 3x3 / 2, flatten                       | 9216              |
| fc6   | Dense 4096 (no bias), BN, ReLU                 | 4096              |
| fc7   | Dense 4096 (no bias), BN, ReLU                 | 4096              |

The outputs `conv1..conv5` are taken after the ReLU, BEFORE the pooling (the RotNet AlexNet's
feature keys). Convolutions have no bias and the init N(0, sqrt(2 / (k*k*out))); the fc layers
PyTorch's default `nn.Linear` init.
"""

from __future__ import annotations

import keras

from aetv2_tf.models.blocks import conv_bn_relu, dense_bn_relu, torch_linear_init

# (name, filters, kernel_size, stride, padding, max-pool after it); pool5 opens the fc block.
ALEXNET_CONVS: tuple[tuple[str, int, int, int, int, bool], ...] = (
    ("conv1", 64, 11, 4, 2, True),
    ("conv2", 192, 5, 1, 2, True),
    ("conv3", 384, 3, 1, 1, False),
    ("conv4", 256, 3, 1, 1, False),
    ("conv5", 256, 3, 1, 1, False),
)
ALEXNET_FC_UNITS = 4096


def alexnet_fc_block(x, *, batch_norm: str = "fused", prefix: str = ""):
    """pool5 map `(B, 13, 13, 256)` -> MaxPool 3/2, flatten, fc6, fc7: returns (fc6, fc7);
    layers `{prefix}pool5`, `{prefix}flatten`, `{prefix}fc6`, `{prefix}fc7`."""
    x = keras.layers.MaxPooling2D(3, strides=2, name=f"{prefix}pool5")(x)
    x = keras.layers.Flatten(name=f"{prefix}flatten")(x)
    fc6 = dense_bn_relu(x, ALEXNET_FC_UNITS, name=f"{prefix}fc6", batch_norm=batch_norm,
                        kernel_initializer=torch_linear_init())
    fc7 = dense_bn_relu(fc6, ALEXNET_FC_UNITS, name=f"{prefix}fc7", batch_norm=batch_norm,
                        kernel_initializer=torch_linear_init())
    return fc6, fc7


def build_alexnet(input_shape: tuple[int, int, int] = (224, 224, 3), batch_norm: str = "fused",
                  name: str = "alexnet") -> keras.Model:
    """The AlexNet encoder: `(B, 224, 224, 3)` -> dict of features.

    Returns:
        A `keras.Model` whose output is `{"conv1": (B, 55, 55, 64), "conv2": (B, 27, 27, 192),
        "conv3": (B, 13, 13, 384), "conv4": (B, 13, 13, 256), "conv5": (B, 13, 13, 256),
        "fc6": (B, 4096), "fc7": (B, 4096)}` for 224x224 inputs.
    """
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    outputs = {}
    for conv_name, filters, kernel_size, strides, padding, pool in ALEXNET_CONVS:
        x = conv_bn_relu(x, filters, kernel_size, name=conv_name, strides=strides,
                         padding=padding, batch_norm=batch_norm)
        outputs[conv_name] = x
        if pool:
            x = keras.layers.MaxPooling2D(3, strides=2, name=f"pool{conv_name[-1]}")(x)
    outputs["fc6"], outputs["fc7"] = alexnet_fc_block(x, batch_norm=batch_norm)
    return keras.Model(inputs, outputs, name=name)
