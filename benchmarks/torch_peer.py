"""The PyTorch peer of the AETv2 pretext step (the `benchmarks.device_step` part ``torch``).

The NIN of `benchmarks.torch_step` (its blocks and poolings) with per-branch BatchNorm, the
decoder Linear(384, 8) and the default AETv2 loss (`recipes.AETV2`: theta^2 of P in the 4x
zoomed frame + 10 x ||M - P||_F^2 of M in the unit frame, M = T^-1 T_hat scaled to det +1),
Adam with coupled weight decay 5e-4; batch ``--batch`` pairs of normalised 32x32 images already
on the device (no sampling or warping: `benchmarks.step_breakdown`'s ``pairs`` times that part
of the Keras step). On CUDA: ``torch.compile``, channels_last, bfloat16 autocast; elsewhere
(``--tiny``) eager float32. `VARIANTS`:

* ``two_pass_svd``: the encoder called on x, then on t(x) (the AETv1 code's way), P by
  ``torch.linalg.svd`` (its own autograd);
* ``one_pass_svd``: one call on ``[x; t(x)]`` whose BatchNorm layers normalise each half by its
  own statistics (`GroupedBatchNorm2d`), the same SVD;
* ``one_pass_newton``: that with P by the scaled Newton iteration of `aetv2_tf.method.polar`
  (autograd through the iterations): whether the 3x3 SVD is what limits the step.

Without PyTorch the part reports ``{"torch": "torch not installed"}`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

VARIANTS = {"two_pass_svd": (1, "svd"), "one_pass_svd": (2, "svd"),
            "one_pass_newton": (2, "newton")}
FRAME_SCALE, PROJECTION_WEIGHT = 4.0, 10.0


def build(torch, groups: int):
    """NIN + decoder; ``groups``: 1 (two encoder calls) or 2 (one call, per-half BN)."""
    from benchmarks.torch_step import BLOCKS, POOLING

    nn = torch.nn

    class GroupedBatchNorm2d(nn.BatchNorm2d):
        """BatchNorm2d whose training statistics are per half of the batch (running averages
        updated for each half in turn), as two calls would."""

        def forward(self, x):
            if groups == 1 or not self.training:
                return super().forward(x)
            return torch.cat([super(GroupedBatchNorm2d, self).forward(p)
                              for p in x.chunk(groups)])

    layers, channels = [], 3
    for spec, pool in zip(BLOCKS, POOLING, strict=True):
        for filters, kernel in spec:
            layers += [nn.Conv2d(channels, filters, kernel, padding=kernel // 2, bias=False),
                       GroupedBatchNorm2d(filters, momentum=0.1, eps=1e-5), nn.ReLU()]
            channels = filters
        if pool == "max":
            layers.append(nn.MaxPool2d(3, stride=2, padding=1))
        elif pool == "avg":
            layers.append(nn.AvgPool2d(3, stride=2, padding=1))
    encoder = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())

    class AET(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.decoder = encoder, nn.Linear(2 * channels, 8)

        def forward(self, x, tx):
            if groups == 1:
                first, second = self.encoder(x), self.encoder(tx)
            else:
                first, second = self.encoder(torch.cat([x, tx])).chunk(2)
            return self.decoder(torch.cat([first, second], dim=1))

    return AET()


def relative(torch, t, t_hat, scale: float):
    """``M = cbrt-normalised (F T F^-1)^-1 (F T_hat F^-1)``, F = diag(scale, scale, 1)."""
    f = torch.diag(torch.tensor([scale, scale, 1.0], device=t.device))
    f_inv = torch.diag(torch.tensor([1 / scale, 1 / scale, 1.0], device=t.device))
    m = torch.linalg.solve(f @ t @ f_inv, f @ t_hat @ f_inv)
    det = torch.linalg.det(m)
    return m / (det.sign() * det.abs().pow(1 / 3))[:, None, None]


def project(torch, m, method: str):
    if method == "svd":
        u, _, vh = torch.linalg.svd(m)
        d = torch.linalg.det(u @ vh)
        flip = torch.stack([torch.ones_like(d), torch.ones_like(d), d], -1)
        return (u * flip[:, None, :]) @ vh
    x = m
    for _ in range(6):  # aetv2_tf.method.polar.ITERATIONS, Frobenius scaling
        inverse_t = torch.linalg.inv(x).transpose(-1, -2)
        zeta = (inverse_t.square().sum((-2, -1)) / x.square().sum((-2, -1))).pow(0.25)
        x = 0.5 * (zeta[:, None, None] * x + inverse_t / zeta[:, None, None])
    return x


def geodesic_loss(torch, y_true, y_pred, method: str):
    """The default AETv2 loss (module docstring), mean over the batch, float32."""
    ones = torch.ones_like(y_true[:, :1])
    t = torch.cat([y_true, ones], 1).view(-1, 3, 3)
    t_hat = torch.cat([y_pred.float(), ones], 1).view(-1, 3, 3)
    m4 = relative(torch, t, t_hat, FRAME_SCALE)
    p4 = project(torch, m4, method)
    sin = (p4 - p4.transpose(-1, -2)).square().sum((-2, -1)).clamp_min(1e-30).sqrt() / 2 ** 1.5
    cos = (p4.diagonal(dim1=-2, dim2=-1).sum(-1) - 1) / 2
    m1 = relative(torch, t, t_hat, 1.0)
    residual = (m1 - project(torch, m1, method)).square().sum((-2, -1))
    return (torch.atan2(sin, cos).square() + PROJECTION_WEIGHT * residual).mean()


def time_variant(torch, name: str, args, device: str) -> dict:
    groups, method = VARIANTS[name]
    torch.manual_seed(0)
    cuda = device == "cuda"
    model = build(torch, groups).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), 1e-4, weight_decay=5e-4,
                                 **({"fused": True} if cuda else {}))
    b = args.batch
    x, tx = (torch.randn(b, 3, 32, 32, device=device) for _ in range(2))
    if cuda:
        x, tx = (v.to(memory_format=torch.channels_last) for v in (x, tx))
    identity = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0], device=device)
    y_true = identity + 0.1 * torch.randn(b, 8, device=device) * torch.tensor(
        [1, 1, 1, 1, 1, 1, 0.1, 0.1], device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            y_pred = model(x, tx)
        loss = geodesic_loss(torch, y_true, y_pred, method)
        loss.backward()
        optimizer.step()
        return loss

    if cuda:
        step = torch.compile(step)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    begin = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    row = {"first_steps_s": time.perf_counter() - begin, "device": device,
           "compiled": cuda}
    begin, steps = time.perf_counter(), 0
    while steps < 2 or time.perf_counter() - begin < args.seconds:
        step()
        steps += 1
        if steps % 10 == 0:
            sync()
    sync()
    row.update(steps=steps, pairs_per_s=steps * b / (time.perf_counter() - begin))
    print(f"torch {name}: {row['pairs_per_s']:,.0f} pairs/s ({steps} steps; first 3 steps "
          f"{row['first_steps_s']:.1f} s, compiled {cuda})", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--json", type=pathlib.Path, required=True)
    p.add_argument("--deadline", type=float, default=0.0)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--spe", type=int, default=1, help="(ignored: one step a call)")
    args = p.parse_args(argv)
    deadline = args.deadline or time.time() + 600
    try:
        import torch
    except ImportError:
        print("torch: torch not installed (PyTorch is not a dependency of the project)",
              flush=True)
        args.json.write_text(json.dumps({"torch": "torch not installed"}))
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"torch": torch.__version__, "device": device, "batch": args.batch, "variants": {}}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    for name in ("one_pass_newton", "one_pass_svd", "two_pass_svd"):
        if time.time() + args.seconds + 40 > deadline:
            out["variants"][name] = {"skipped": "the part's time limit"}
            print(f"torch {name}: skipped (the part's time limit)", flush=True)
            continue
        out["variants"][name] = time_variant(torch, name, args, device)
        args.json.write_text(json.dumps(out, indent=1))
    args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
