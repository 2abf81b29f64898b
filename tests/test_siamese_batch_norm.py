"""`siamese_batch_norm="per_branch"`: each branch normalised by its own batch statistics and the
moving averages updated twice a step, x's batch first (the published AETv1 code's two forward
passes), the same on TensorFlow and JAX; the same variables as the joint batch."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_per_branch_equals_two_encoder_calls_x_first(backend):
    env = dict(os.environ, KERAS_BACKEND=backend)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "siamese_bn_case.py"), backend],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["num_stats"] == 24  # 12 BatchNorm layers of NIN: mean and variance each
    assert got["output"] <= 1e-5
    assert got["stats"] <= 1e-6  # t(x) first would differ by about 1e-2 (measured)
    assert got["joint_stats"] > 0.1  # the joint batch's statistics are another thing


def test_same_variables_and_bad_value_refused():
    import keras

    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.aet import build_aet_model

    keras.utils.set_random_seed(0)
    joint = build_aet_model(build_backbone("nin", (32, 32, 3)), siamese_batch_norm="joint")
    keras.utils.set_random_seed(0)
    per_branch = build_aet_model(build_backbone("nin", (32, 32, 3)))  # the default
    assert per_branch.get_layer("after_x") is not None
    assert [v.path for v in joint.weights] == [v.path for v in per_branch.weights]
    per_branch.set_weights(joint.get_weights())
    with pytest.raises(ValueError, match="per_branch"):
        build_aet_model(build_backbone("nin", (32, 32, 3)), siamese_batch_norm="split")
