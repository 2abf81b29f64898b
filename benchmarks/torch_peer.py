"""The PyTorch peer of the AET pretext step (the AETv1 code's framework): the same NIN and
decoder, on a CPU in `benchmarks.step`'s rounds and on the device as the `benchmarks.device_step`
part ``torch``.

    python -m benchmarks.step --configs=fused/fp32/mse,torch:torch/fp32/mse   # a CPU worker
    python3 -m benchmarks.torch_peer [--batch=512] [--records=FILE]         # the device part

The model (`build`): the NIN of `aetv2_tf.models.nin` in PyTorch (conv without bias + BatchNorm
+ ReLU, the AETv1 code's poolings, global average pooling of block 4), the pair's features
concatenated, Linear(384, 8); the encoder called on x then on t(x) (``two_pass``), once on
``[x; t(x)]`` with each half normalised by its own statistics (``one_pass``), or once with
statistics over both (``joint``).

* CPU worker (`TorchRunner`, the protocol of `benchmarks.backends`): ``joint``, the AETv1 loss
  (MSE on the 8 parameters), Adam 1e-3 with coupled weight decay 5e-4 (as `benchmarks.step`'s
  Keras step), channels_last; ``torch:torch/bf16/mse``: the forward pass under CPU autocast.
* Device part (`device_part`): the default AETv2 loss (`recipes.AETV2`: theta^2 of P in the 4x
  frame + 10 x ||M - P||_F^2 in the unit frame, P by `torch.linalg.svd` or by the scaled Newton
  iteration of `aetv2_tf.method.polar`), Adam 1e-4 with coupled weight decay 5e-4, ``--batch``
  pairs of images already on the device (no sampling or warping). On CUDA: channels_last,
  bfloat16 autocast, the model compiled by ``torch.compile`` (the loss and the fused Adam
  eager); on a CPU dry run the compile only captures the graph (backend "eager").
  `DEVICE_VARIANTS` in order, each skipped when it would not end by ``--deadline`` with its
  compilation (`TORCH_COMPILE_S`, `device_step.Clock`): the first eager (a number within
  seconds), the next two sharing one compiled model. Without PyTorch the part says so.

PyTorch is not a dependency of the project: `pip install torch==2.13.0` (a CPU build) for it.
"""

from __future__ import annotations

import sys
import time

from benchmarks import common
from benchmarks.device_step import Clock, Records, part_parser

BLOCKS = (((192, 5), (160, 1), (96, 1)), ((192, 5), (192, 1), (192, 1)),
          ((192, 3), (192, 1), (192, 1)), ((192, 3), (192, 1), (192, 1)))
POOLING = ("max", "avg", None, None)
FRAME_SCALE, PROJECTION_WEIGHT = 4.0, 10.0
#: The device part's variants in order: (model, projection, compiled).
DEVICE_VARIANTS = {"one_pass_newton eager": ("one_pass", "newton", False),
                   "one_pass_newton": ("one_pass", "newton", True),
                   "one_pass_svd": ("one_pass", "svd", True),
                   "two_pass_svd": ("two_pass", "svd", True)}
#: ``torch.compile`` of the NIN's forward and backward pass on the device: an assumption (not
#: measured there yet) until the part has timed its first compilation.
TORCH_COMPILE_S = 60.0


def import_torch():
    """`torch`, or SystemExit with how to install it."""
    try:
        import torch
    except ImportError as e:
        raise SystemExit("benchmarks.torch_peer needs PyTorch, which the project does not "
                         "install: `pip install torch==2.13.0` (a CPU build) in this venv, or "
                         "drop the torch: configurations.") from e
    return torch


def build(torch, mode: str):
    """NIN + decoder (module docstring): ``model(x, tx) -> (B, 8)``, ``x``, ``tx`` (B, 3, 32,
    32); ``mode``: "two_pass", "one_pass" or "joint"."""
    nn, groups = torch.nn, 2 if mode == "one_pass" else 1

    class GroupedBatchNorm2d(nn.BatchNorm2d):
        """BatchNorm2d whose training statistics are per part of the batch (``groups`` equal
        parts; the running averages updated for each part in turn), as separate calls would."""

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
            if mode == "two_pass":
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


def forward_macs_per_pair() -> int:
    """Multiply-accumulates of one forward pass per pair: each convolution's ``H W k^2 C_in
    C_out`` on both 32x32 images (halved by each pooling), and the decoder's."""
    total, channels, side = 0, 3, 32
    for spec, pool in zip(BLOCKS, POOLING, strict=True):
        for filters, kernel in spec:
            total += side * side * kernel * kernel * channels * filters
            channels = filters
        side //= 2 if pool else 1
    return 2 * total + 2 * channels * 8


def training_step(torch, model, loss_fn, optimizer, inputs: tuple, target, autocast):
    """One training step of ``model`` on the fixed ``inputs`` (x, t(x)) as a callable: the
    forward pass under bfloat16 autocast on the device ``autocast`` (None: none), then
    ``loss_fn(target, output)``, its backward pass and the optimizer's update."""
    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(autocast or "cpu", dtype=torch.bfloat16, enabled=bool(autocast)):
            output = model(*inputs)
        loss_fn(target, output).backward()
        optimizer.step()

    return step


class TorchRunner:
    """`benchmarks.step_runner.StepRunner`'s interface for one `torch:` configuration."""

    def __init__(self, spec, batch_size: int):
        torch = import_torch()
        if spec.loss != "mse":
            raise SystemExit(f"{spec.name}: the PyTorch CPU step has the AETv1 loss only (mse)")
        torch.manual_seed(0)
        self.spec, self.bf16 = spec, spec.precision == "mixed_bfloat16"
        model = build(torch, "joint").to(memory_format=torch.channels_last)
        inputs = tuple(torch.randn(batch_size, 3, 32, 32).to(memory_format=torch.channels_last)
                       for _ in range(2))
        self.step = training_step(
            torch, model, lambda target, output: torch.nn.functional.mse_loss(output.float(),
                                                                              target),
            torch.optim.Adam(model.parameters(), 1e-3, weight_decay=5e-4), inputs,
            torch.randn(batch_size, 8), "cpu" if self.bf16 else None)

    def round_steps(self, steps: int) -> int:
        return steps

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def flops_per_pair(self) -> float:
        return common.train_step_flops(forward_macs_per_pair())


def device_step(torch, model, method: str, batch: int, device: str):
    """One training step of ``model`` on fixed device data (module docstring): a callable."""
    cuda = device == "cuda"
    x, tx = (torch.randn(batch, 3, 32, 32, device=device) for _ in range(2))
    if cuda:
        x, tx = (v.to(memory_format=torch.channels_last) for v in (x, tx))
    identity = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0], device=device)
    y_true = identity + 0.1 * torch.randn(batch, 8, device=device) * torch.tensor(
        [1, 1, 1, 1, 1, 1, 0.1, 0.1], device=device)
    optimizer = torch.optim.Adam(model.parameters(), 1e-4, weight_decay=5e-4,
                                 **({"fused": True} if cuda else {}))
    return training_step(torch, model, lambda t, y: geodesic_loss(torch, t, y, method),
                         optimizer, (x, tx), y_true, device if cuda else None)


def device_part(torch, args, clock: Clock, records: Records) -> None:
    """`DEVICE_VARIANTS` in order (module docstring), each recorded as it is measured."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    records.add("setup", "setup", f"torch {torch.__version__} on {device}"
                f"{f' ({torch.cuda.get_device_name()})' if cuda else ''}, batch {args.batch}",
                torch=torch.__version__, device=device, batch=args.batch)
    models: dict = {}
    for name, (mode, method, compiled) in DEVICE_VARIANTS.items():
        new_compile = compiled and (mode, True) not in models
        if not clock.allows(records, name, float(new_compile), args.seconds + 5):
            continue
        if (mode, False) not in models:
            torch.manual_seed(0)
            model = build(torch, mode).to(device)
            models[mode, False] = model.to(memory_format=torch.channels_last) if cuda else model
        if compiled and new_compile:
            models[mode, True] = torch.compile(models[mode, False],
                                               backend="inductor" if cuda else "eager")
        step = device_step(torch, models[mode, compiled], method, args.batch, device)
        begin = time.perf_counter()
        for _ in range(3):
            step()
        sync()
        first = time.perf_counter() - begin
        if new_compile:
            clock.compiled(first)
        begin, steps = time.perf_counter(), 0
        while steps < 2 or time.perf_counter() - begin < args.seconds:
            step()
            steps += 1
            if steps % 10 == 0:
                sync()
        sync()
        rate = steps * args.batch / (time.perf_counter() - begin)
        records.add(name, "rate", f"torch {name}: {rate:,.0f} pairs/s ({steps} steps; the first "
                    f"3 steps {first:.1f} s{', compilation included' if new_compile else ''})",
                    pairs_per_s=rate, steps=steps, first_steps_s=first, compiled=compiled,
                    device=device)


def worker(argv: list[str]) -> None:
    """The CPU worker of `benchmarks.step` (module docstring)."""
    from benchmarks.backends import serve, worker_parser
    from benchmarks.step_runner import Spec

    args = worker_parser("PyTorch").parse_args(argv)
    torch = import_torch()
    serve([Spec.parse(config) for config in args.configs.split(",")],
          lambda spec: TorchRunner(spec, args.batch_size), args.warmup,
          lambda runner: f"torch-{torch.__version__}-{'bf16' if runner.bf16 else 'fp32'}-"
                         f"threads{torch.get_num_threads()}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a.startswith("--configs") for a in argv):
        worker(argv)
        return 0
    args = part_parser(__doc__).parse_args(argv)  # (--spe: one step a call here)
    records = Records(args.records, "torch")
    try:
        torch = import_torch()
    except SystemExit:
        records.add("setup", "setup", "torch: torch not installed (PyTorch is not a dependency "
                    "of the project)", torch="torch not installed")
        return 0
    device_part(torch, args, Clock(args.deadline, TORCH_COMPILE_S), records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
