"""Pictures for TensorBoard: (x, t(x)) pairs with the true and the predicted quadrilaterals."""

from __future__ import annotations

import numpy as np

from aetv2_tf.data.homographies import corners
from aetv2_tf.method.geometry import params_to_matrix

GREEN = np.array([0.1, 0.9, 0.1], np.float32)
RED = np.array([1.0, 0.1, 0.1], np.float32)


def draw_polygon(image: np.ndarray, points: np.ndarray, color: np.ndarray, zoom: int) -> None:
    """Draws the closed polygon `points` ((n, 2) pixel (x, y) of the un-zoomed image) in place."""
    size = image.shape[0]
    for a, b in zip(points, np.roll(points, -1, axis=0), strict=True):
        t = np.linspace(0.0, 1.0, 8 * size)[:, None]
        xy = ((1 - t) * a + t * b + 0.5) * zoom - 0.5
        cols, rows = np.round(xy[:, 0]).astype(int), np.round(xy[:, 1]).astype(int)
        keep = (rows >= 0) & (rows < size) & (cols >= 0) & (cols < image.shape[1])
        image[rows[keep], cols[keep]] = color


def draw_pairs(x: np.ndarray, tx: np.ndarray, true_params: np.ndarray, pred_params: np.ndarray,
               mean, std, zoom: int = 4) -> np.ndarray:
    """(B, H, W, 3) normalised x and t(x), (B, 8) params -> (B, zoom*H, 2*zoom*W, 3) in [0, 1].

    Left: x. Right: t(x) with where T (green) and T_hat (red) send the image's outline.
    """
    h, w = x.shape[1:3]
    images = []
    true_c = corners(params_to_matrix(true_params.astype(np.float64)), h, w).numpy()
    pred_c = corners(params_to_matrix(pred_params.astype(np.float64)), h, w).numpy()
    for i in range(len(x)):
        left, right = (np.clip(np.asarray(a[i]) * std + mean, 0, 1) for a in (x, tx))
        left, right = (np.kron(a, np.ones((zoom, zoom, 1), np.float32)) for a in (left, right))
        draw_polygon(right, true_c[i], GREEN, zoom)
        draw_polygon(right, np.nan_to_num(pred_c[i], posinf=1e4, neginf=-1e4), RED, zoom)
        images.append(np.concatenate([left, right], axis=1))
    return np.stack(images).astype(np.float32)
