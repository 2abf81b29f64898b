"""aetv2_tf: AETv2 (CVPR 2020) in Keras 3 on TensorFlow.

Self-supervised representation learning by autoencoding homographies: a Siamese encoder sees an
image x and a warped copy t(x); a decoder regresses t, and the loss is the geodesic distance on
SO(3) between the applied and the decoded homography (after projection), plus a projection residual.
"""

import os
import platform

# Keras 3 is multi-backend; this package is TensorFlow-only.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's Linux wheels turn their oneDNN CPU kernels on by default only on CPUs with
# AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; on other x86 CPUs (AVX2-only laptops and cloud VMs)
# convolutions fall back to Eigen kernels: the training step ran 0.58x as fast, the CLI 0.63x
# (BENCHMARKS.md, "AVX2 CPUs"). So oneDNN is asked for on every x86 CPU (not measured on ARM: left
# to TensorFlow there), unless the user chose: TF_ENABLE_ONEDNN_OPTS=0 keeps the Eigen kernels.
# Effective only if TensorFlow is imported after this package.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

__version__ = "0.1.0"
