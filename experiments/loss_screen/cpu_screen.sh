#!/usr/bin/env bash
# The loss screen on the CPU: the AETv2 recipe and the three variants that see the whole homography,
# at B1 (390 steps x 128 pairs) on configs/budget_aetv2.cfg (Adam 1e-3, 40 warm-up steps, cosine,
# per-branch BatchNorm), two seeds, one training at a time; each run is scored by the authors' KNN
# and the quarter-turn diagnostics (experiments.loss_screen.screen), then every encoder by the linear read-out
# of the transformation (experiments.loss_screen.readout). AETv1 (the project's and the official target) are
# the rows v1_perbranch_s{0,1} / v1_official_s{0,1} of the same budget (configs/budget_aetv1.cfg,
# same optimiser: only the loss differs); pass --with_aetv1 to retrain them here too.
#
#     nohup bash experiments/loss_screen/cpu_screen.sh > runs/screen/cpu_screen.log 2>&1 &
#
# Rows go to runs/screen/rows.md, the read-out to runs/screen/readout.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
STEPS=${STEPS:-390}
SEEDS=${SEEDS:-"0 1"}
declare -A VARIANT=(
  [v2_recipe]="--projection_weight=0 --loss_frame_scale=16"
  [v2_sq4]="--projection_weight=0 --angle_power=2 --loss_frame_scale=4"
  [v2_sq4_unitres]="--angle_power=2 --loss_frame_scale=4 --projection_weight=10 --residual_frame=unit"
  [v2_hybrid]="--projection_weight=0 --angle_power=2 --loss_frame_scale=4 --mse_weight=0.3"
)
ORDER=(v2_recipe v2_sq4 v2_sq4_unitres v2_hybrid)
encoders=()
for seed in $SEEDS; do
  if [[ "${1:-}" == "--with_aetv1" ]]; then
    for v1 in "v1_perbranch:" "v1_official:--mse_target=official"; do
      name=${v1%%:*}_s$seed; extra=${v1#*:}
      $PY -m experiments.loss_screen.screen --name="$name" --flagfile=configs/budget_aetv1.cfg \
        --steps="$STEPS" --train_flag=--warmup_steps=40 --train_flag=--seed="$seed" \
        ${extra:+--train_flag=$extra}
    done
  fi
  for v in "${ORDER[@]}"; do
    args=()
    for f in ${VARIANT[$v]}; do args+=("--train_flag=$f"); done
    $PY -m experiments.loss_screen.screen --name="${v}_s$seed" --flagfile=configs/budget_aetv2.cfg \
      --steps="$STEPS" --train_flag=--warmup_steps=40 --train_flag=--seed="$seed" "${args[@]}"
    encoders+=("runs/screen/${v}_s$seed")
  done
done
for seed in $SEEDS; do
  encoders+=("runs/screen/v1_perbranch_s$seed" "runs/screen/v1_official_s$seed")
done
$PY -m experiments.loss_screen.readout "${encoders[@]}" none --json | tee runs/screen/readout.md
