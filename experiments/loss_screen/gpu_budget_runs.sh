#!/usr/bin/env bash
# Keras-on-JAX screening on a GPU machine without TensorFlow (docs/reproduction.md, "GPU").
# Needs, in the repository root: .whl/ (keras 3.15.1, namex, optree wheels for the machine's
# Python) and .devdata/cifar-10-batches-py (a CIFAR-10 subset in the official python layout:
# the first 2,400 images of each training batch = 12,000, and the first 2,000 test images).
# Usage: bash experiments/loss_screen/gpu_budget_runs.sh speed | NAME [extra flags...]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
D=.devdata/cifar-10-batches-py
if [ "$1" = speed ]; then  # throughput: batch 512, auto precision (= mixed_bfloat16 on a GPU)
  for spe in 1 10; do
    python3 -m aetv2_tf.train --flagfile=configs/budget_aetv2.cfg --model_dir=/tmp/speed$spe \
      --train_steps=300 --batch_size=512 --export=false --data_dir=$D --verbose=0 \
      --summary_every_steps=50 --steps_per_execution=$spe --checkpoint_every_steps=1000
    cat /tmp/speed$spe/train/log.csv  # pairs_per_sec per 50-step interval
  done
  exit
fi
name=$1; shift
# 460 steps x 512 pairs (about 20 epochs of the subset), then the quick KNN (12,000 vs 2,000).
python3 -m aetv2_tf.train --flagfile=configs/budget_aetv2.cfg --model_dir=/tmp/r_$name \
  --train_steps=460 --batch_size=512 --warmup_steps=40 --data_dir=$D --verbose=0 --export=false \
  --summary_every_steps=46 --steps_per_execution=10 --checkpoint_every_steps=1000 \
  --quick_knn_train=12000 --quick_knn_test=2000 "$@"
