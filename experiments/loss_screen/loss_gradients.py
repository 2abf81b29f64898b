"""Where each pretext loss puts its gradient (the loss screen): CPU, no training, a few seconds.

    python -m experiments.loss_screen.loss_gradients [--pairs=4096] [--lambdas=1,3,10,30] \
        [--mse_weights=...]

For homographies ``T`` drawn by the project's sampler (32x32, integer shifts, a fixed seed) and
decoded homographies ``T_hat`` that are wrong in a known way, the gradient of each loss with
respect to the decoder's 8 outputs (the model-frame parameters of ``T_hat``, conventions.md) is
taken per pair and summarised:

* shares: the mean ``|dL/dp_i|`` over pairs of each output, divided by the sum over the 8 (so the
  8 shares sum to 1), reported per group: translation (``p2``, ``p5``), linear (``p0, p1, p3,
  p4``, summed) and perspective (``p6``, ``p7``), for ``T_hat`` = the quad of ``T`` with 1-px
  Gaussian noise on each corner coordinate, then scaled by 1.1 about the centre;
* quarter-turn ratios: the mean gradient norm of pairs whose decoded quad is ``T``'s quad with its
  corner list cyclically shifted by 1 (90 degrees) or 2 (180 degrees), over that of pairs whose
  quad is translated by 1 px in a random direction;
* blind-set ratios: the mean norm of the gradient ON THE ENTRIES THE ERROR CONCERNS (linear for a
  20% isotropic scale ``T_hat = T S``; perspective for a keystone ``S`` moving a corner by about
  1 px) over the mean norm of the whole gradient of the 1-px translation (0: blind);
* geodesic part: for the hybrids, ``|g_geodesic| / (|g_geodesic| + |g_mse|)`` on the first set
  (mean norms); 1 for the purely geodesic losses, 0 for AETv1.

Rows: AETv1 (the normalised parameter MSE), the recipe ``AETV2`` and the loss screen's variants
(``AETV2_SQ4``, ``AETV2_SQ4_UNITRES``, ``AETV2_HYBRID``), plus sweeps of the unit-frame residual's
``lambda`` and the hybrid's MSE weight. Prints a markdown table.
"""

from __future__ import annotations

import argparse

import numpy as np

import aetv2_tf  # noqa: F401  (before TensorFlow: the package asks for oneDNN)

PX = 2.0 / 32  # one pixel of a 32x32 image in model units
GROUPS = {"translation": (2, 5), "linear": (0, 1, 3, 4), "perspective": (6, 7)}


def quad_params(corners: np.ndarray) -> np.ndarray:
    """(B, 4, 2) model-frame corners -> (B, 8) float32 parameters of the square -> quad map."""
    from aetv2_tf.data.sampler import square_to_quad
    from aetv2_tf.method.geometry import matrix_to_params

    t = square_to_quad(corners[..., 0].astype(np.float32), corners[..., 1].astype(np.float32))
    return np.asarray(matrix_to_params(t), np.float32)


def compose_right(t_params: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Parameters of ``T S`` for (B, 8) ``T`` and one 3x3 ``S``."""
    t = np.concatenate([t_params, np.ones_like(t_params[:, :1])], 1).reshape(-1, 3, 3)
    m = t.astype(np.float64) @ s
    return (m.reshape(-1, 9)[:, :8] / m.reshape(-1, 9)[:, 8:]).astype(np.float32)


def error_sets(pairs: int, seed: int = 7) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{name: (y_true (B, 8), y_pred (B, 8))}`` float32: the decoded errors of the docstring."""
    from aetv2_tf.data.sampler import sample_homography_components
    from aetv2_tf.method.geometry import matrix_to_params

    parts = sample_homography_components(pairs, 32, 32, seed)
    corners = np.asarray(parts["corners"], np.float64)
    y_true = np.asarray(matrix_to_params(parts["matrix"]), np.float32)
    rng = np.random.default_rng(seed)
    angle = rng.uniform(0.0, 2 * np.pi, (pairs, 1))
    step = np.stack([np.cos(angle), np.sin(angle)], -1) * PX
    keystone = np.eye(3)
    keystone[2, 0] = PX  # corner (1, 1) -> (1, 1) / (1 + p): about 1 px
    out = {
        "mixed": corners + rng.normal(0.0, PX, corners.shape),
        "1px": corners + step,
        "turn90": np.roll(corners, 1, axis=1),
        "turn180": np.roll(corners, 2, axis=1),
    }
    out = {k: (y_true, quad_params(v * 1.1 if k == "mixed" else v)) for k, v in out.items()}
    out["scale20"] = (y_true, compose_right(y_true, np.diag([1.2, 1.2, 1.0])))
    out["keystone"] = (y_true, compose_right(y_true, keystone))
    return out


def gradients(loss, y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """(B, 8) per-pair gradient of ``loss.call`` (per-sample values, summed) w.r.t. ``y_pred``."""
    import tensorflow as tf

    y_pred = tf.Variable(y_pred)
    with tf.GradientTape() as tape:
        value = tf.reduce_sum(loss.call(tf.constant(y_true), y_pred))
    return tape.gradient(value, y_pred).numpy()


def _mean_norm(g: np.ndarray, columns: tuple[int, ...] = tuple(range(8))) -> float:
    return float(np.linalg.norm(g[:, list(columns)], axis=1).mean())


def summarise(loss, sets: dict, geodesic_only=None) -> dict[str, float]:
    """The table's numbers for one loss (module docstring). ``geodesic_only``: the same loss
    without its MSE term (a hybrid's), for the geodesic part's share of the gradient norm."""
    grads = {k: gradients(loss, *v) for k, v in sets.items()}
    mean_abs = np.abs(grads["mixed"]).mean(0)
    share = mean_abs / mean_abs.sum()
    one_px = _mean_norm(grads["1px"])
    row = {f"share {g}": float(share[list(i)].sum()) for g, i in GROUPS.items()}
    for k in ("turn90", "turn180"):
        row[f"{k} / 1px"] = _mean_norm(grads[k]) / one_px
    row["scale20 linear / 1px"] = _mean_norm(grads["scale20"], GROUPS["linear"]) / one_px
    row["keystone persp. / 1px"] = _mean_norm(grads["keystone"], GROUPS["perspective"]) / one_px
    geo = 1.0 if geodesic_only is None else _mean_norm(gradients(geodesic_only, *sets["mixed"]))
    if geodesic_only is not None:
        geo /= geo + _mean_norm(grads["mixed"] - gradients(geodesic_only, *sets["mixed"]))
    row["geodesic part"] = geo
    return row


def candidates(lambdas: list[float], mse_weights: list[float]) -> dict[str, object]:
    """``{row name: Recipe}``: AETv1, the AETv2 recipes (the default, the earlier default
    ZOOM16, the control SQ4, the hybrid) and the sweeps of the default's lambda and the
    hybrid's MSE weight."""
    from aetv2_tf.method import recipes

    rows = {"AETV1 (normalised MSE)": recipes.AETV1, "AETV2 (default)": recipes.AETV2,
            "AETV2_ZOOM16": recipes.AETV2_ZOOM16, "AETV2_SQ4": recipes.AETV2_SQ4,
            "AETV2_HYBRID": recipes.AETV2_HYBRID}
    for lam in lambdas:
        rows[f"AETV2 lambda={lam:g}"] = recipes.AETV2.replace(projection_weight=lam)
    for w in mse_weights:
        rows[f"HYBRID mse_weight={w:g}"] = recipes.AETV2_HYBRID.replace(mse_weight=w)
    return rows


def table(pairs: int, lambdas: list[float], mse_weights: list[float]) -> str:
    """The markdown table of every candidate."""
    from aetv2_tf.data.sampler import parameter_std

    sets, std = error_sets(pairs), parameter_std(32)
    lines = []
    for name, recipe in candidates(lambdas, mse_weights).items():
        if recipe.loss.kind == "mse":
            row = summarise(recipe.build_loss(32, param_std=std), sets)
            row["geodesic part"] = 0.0
        else:
            plain = recipe.replace(mse_weight=0.0) if recipe.loss.mse_weight else None
            row = summarise(recipe.build_loss(32, param_std=std), sets,
                            plain and plain.build_loss(32, param_std=std))
        if not lines:
            lines = ["| loss | " + " | ".join(row) + " |", "|---" * (len(row) + 1) + "|"]
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" if v < 10 else f"{v:.1f}"
                                                  for v in row.values()) + " |")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def main() -> None:
    from benchmarks import common

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=4096)
    p.add_argument("--lambdas", default="3,5,10,20,30", help="Sweep of the unit residual's lambda.")
    p.add_argument("--mse_weights", default="0.1,0.3,1,3", help="Sweep of the hybrid's weight.")
    args = p.parse_args()
    common.keras_quiet()
    print(table(args.pairs, _floats(args.lambdas), _floats(args.mse_weights)))


if __name__ == "__main__":
    main()
