"""aetv2_tf: AETv2 (CVPR 2020) in Keras 3 on TensorFlow.

Self-supervised representation learning by autoencoding homographies: a Siamese encoder sees an
image x and a warped copy t(x); a decoder regresses t, and the loss is the geodesic distance on
SO(3) between the applied and the decoded homography (after projection), plus a projection residual.
"""

import os

# Keras 3 is multi-backend; this package is TensorFlow-only.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
