#!/usr/bin/env bash
# The scale runs on a lent GPU, in ONE device command of at most ~9 minutes (docs/reproduction.md,
# "At scale (GPU)"): Keras on JAX, batch 512, the SAME steps for each, one after the other:
#   aetv2_recipe  configs/cifar10_aetv2.cfg (16x frame, no residual, Adam 1e-4, cosine, 1,000 warm-up)
#   aetv1_lr1e-4  configs/cifar10_aetv1.cfg at Adam 1e-4 with the recipe's schedule (B3's best AETv1:
#                 --learning_rate=1e-4 on Adam/cosine; here only the loss differs from the recipe)
#   aetv2_paper   configs/cifar10_aetv2_paper.cfg (Eq. 11 as written, Adam 1e-5), if time allows.
# Needs, in the repository root (both ignored; name them in the run tool's carry): .whl/ (keras
# 3.15.1, namex, optree wheels for the device's Python 3.12) and .devdata/cifar-10-batches-py
# (`python -m experiments.scale.make_devdata`: the first 3,800 images of each training batch = 19,000,
# 56 MiB; no test images: the encoders are scored on the CPU by the full KNN protocol).
#
# Steps: 8,000 x 512 = 4,096,000 pairs per method (82 CIFAR-10 epochs; 216 passes over the subset).
# At the H200's measured 42,000 pairs/s (BENCHMARKS.md) that is 98 s of training, at an H100's
# assumed ~30,000 137 s; each run adds ~40 s (start-up, data, jit compile: the first 50 steps took
# ~19 s on the H200): ~140 s (H200) / ~180 s (H100) a run. The recipe and AETv1 fit either way
# (<= 360 s); the paper-literal run fits on an H200 (~420 s in all), on an H100 only if it runs at
# >= ~30,000 pairs/s. So a run after the first starts only if the time left before DEADLINE_S
# (540 s after the start) is >= 1.15 x the longest run so far (`date +%s`), and every run is cut
# (SIGTERM: no encoder, skipped) at LIMIT_S = 585 s, inside the tool's 600 s.
# --steps_per_execution=10 divides 8,000 (exact step counts), as do the summary (200) and the one
# checkpoint (at the end).
# Then, with >= 90 s left before LIMIT_S: `benchmarks.keras_step` of the AlexNet flagfile (AlexNet
# 224x224 pairs/s at batch ALEX_BATCH=256 in bfloat16, the device warp included) in console.txt.
# Back (8 files at most): $OUT/<name>/encoder.weights.h5 + flags.json (what --pretrained takes;
# copy each to results/scale/<name>/) for each finished run, $OUT/logs.tar (<name>/train/log.csv,
# <name>/flags.cfg: `tar xf logs.tar -C results/scale`) and $OUT/console.txt.
# CPU test (tiny, ~40 s, 8 files; the exact commands: docs/reproduction.md): PY=.venv/bin/python
#   WHL=<wheels for the CPU's Python> SITE=/tmp/scale_site RUNS=/tmp/scale_runs STEPS=6 SPE=3
#   SUMMARY=3 BATCH=8 DEADLINE_S=3000 LIMIT_S=3000 ALEX_BATCH=2 ALEX_STEPS=2 OUT=/tmp/scale_out
#   bash experiments/scale/gpu_scale.sh
set -u -o pipefail
: "${OUT:?set OUT}"
STEPS=${STEPS:-8000} SPE=${SPE:-10} BATCH=${BATCH:-512} SUMMARY=${SUMMARY:-200}
DEADLINE_S=${DEADLINE_S:-540} LIMIT_S=${LIMIT_S:-585} PY=${PY:-python3}
WHL=${WHL:-.whl} SITE=${SITE:-/tmp/site} RUNS=${RUNS:-/tmp/scale} D=.devdata/cifar-10-batches-py
ALEX_BATCH=${ALEX_BATCH:-256} ALEX_STEPS=${ALEX_STEPS:-100}
T0=$(date +%s) longest=0

train() {  # NAME FLAGFILE [flags...]: one run, then its files to $OUT
  local name=$1 cfg=$2 t now; shift 2
  now=$(date +%s)
  if [ "$longest" -gt 0 ] && [ $((T0 + DEADLINE_S - now)) -lt $((longest * 115 / 100)) ]; then
    echo "== $name SKIPPED: $((T0 + DEADLINE_S - now)) s left, a run took $longest s"; return
  fi
  echo "== $name at +$((now - T0)) s: $cfg $*"
  rm -rf "$RUNS/$name"
  timeout -s TERM -k 8 $((T0 + LIMIT_S - now)) "$PY" -m aetv2_tf.train --flagfile="$cfg" \
    --model_dir="$RUNS/$name" --train_steps="$STEPS" --batch_size="$BATCH" --data_dir=$D \
    --steps_per_execution="$SPE" --summary_every_steps="$SUMMARY" --batch_norm=keras \
    --checkpoint_every_steps="$STEPS" --keep_checkpoints=1 --export=false --quick_knn_train=0 \
    --verbose=0 "$@"
  echo "== $name exit $? after $(( $(date +%s) - now )) s"
  t=$(( $(date +%s) - now )); [ "$t" -gt "$longest" ] && longest=$t
  tail -n 3 "$RUNS/$name/train/log.csv" 2>/dev/null
  if [ -f "$RUNS/$name/encoder.weights.h5" ]; then
    mkdir -p "$OUT/$name" && cp "$RUNS/$name/encoder.weights.h5" "$RUNS/$name/flags.json" "$OUT/$name/"
  fi
  (cd "$RUNS" && tar -cf "$OUT/logs.tar" $(ls -d */train/log.csv */flags.cfg 2>/dev/null))
}

alexnet_rate() {  # the AlexNet 224 pair-step rate, if >= 90 s are left
  local left=$((T0 + LIMIT_S - $(date +%s)))
  if [ "$left" -lt 90 ]; then echo "== alexnet_step SKIPPED: $left s left"; return; fi
  echo "== alexnet_step at +$(( $(date +%s) - T0 )) s, $left s left"
  timeout -s TERM -k 5 $((left - 5)) "$PY" -m benchmarks.keras_step \
    --flagfile=configs/imagenet_alexnet_aetv2.cfg --variants=program --batch="$ALEX_BATCH" \
    --steps="$ALEX_STEPS" --repeats=3
  echo "== alexnet_step exit $?"
}

main() {
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHL"/*.whl && export PYTHONPATH=$SITE:$PWD || exit 1
  export KERAS_BACKEND=jax PYTHONUNBUFFERED=1
  echo "== $STEPS steps x $BATCH = $((STEPS * BATCH)) pairs each, steps_per_execution $SPE"
  train aetv2_recipe configs/cifar10_aetv2.cfg
  train aetv1_lr1e-4 configs/cifar10_aetv1.cfg --optimizer=adam --learning_rate=1e-4 \
    --lr_schedule=cosine --warmup_steps=1000 --adam_beta1=0.9 --adam_beta2=0.999
  train aetv2_paper configs/cifar10_aetv2_paper.cfg
  alexnet_rate
  echo "== done at +$(( $(date +%s) - T0 )) s"; ls -l "$OUT" "$OUT"/*/
}

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) && main 2>&1 | tee "$OUT/console.txt"
