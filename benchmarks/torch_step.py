"""The AETv1 code's framework as a yardstick: the same NIN pretext step in PyTorch.

`python -m benchmarks.step --configs=fused/fp32/mse,torch:torch/fp32/mse` times it in the same
interleaved rounds as the Keras steps: `benchmarks.step` starts this module as a worker process
(the protocol of `benchmarks.backends`: `@@built`, `@@ready FLOPS`, `run NAME STEPS` ->
`@@timing WALL CPU`). The model is the NIN of `aetv2_tf.models.nin` written in PyTorch
(conv without bias + BN + ReLU, the PyTorch poolings of the AETv1 code), run once on the joint
batch `[x; t(x)]` in channels_last, global average pooling of block 4, the pair's features
concatenated, Linear(384, 8); the AETv1 loss (MSE on the 8 parameters), Adam 1e-3 with coupled
weight decay 5e-4 (as `benchmarks.step`'s Keras step). `torch:torch/bf16/mse` runs the forward
pass under CPU autocast to bfloat16. PyTorch is not a dependency of the project: install it for
this benchmark (`pip install torch==2.13.0`, a CPU build).
"""

from __future__ import annotations

import argparse
import time

from benchmarks import common

BLOCKS = (((192, 5), (160, 1), (96, 1)), ((192, 5), (192, 1), (192, 1)),
          ((192, 3), (192, 1), (192, 1)), ((192, 3), (192, 1), (192, 1)))
POOLING = ("max", "avg", None, None)


def import_torch():
    """`torch`, or SystemExit with how to install it."""
    try:
        import torch
    except ImportError as e:
        raise SystemExit("benchmarks.torch_step needs PyTorch, which the project does not "
                         "install: `pip install torch==2.13.0` (a CPU build) in this venv, or "
                         "drop the torch: configurations.") from e
    return torch


def build_model(torch):
    """NIN (4 blocks) + the AET decoder, `(2B, 3, 32, 32) -> (B, 8)`."""
    nn = torch.nn
    layers, channels = [], 3
    for spec, pool in zip(BLOCKS, POOLING, strict=True):
        for filters, kernel in spec:
            layers += [nn.Conv2d(channels, filters, kernel, padding=kernel // 2, bias=False),
                       nn.BatchNorm2d(filters), nn.ReLU(inplace=True)]
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

        def forward(self, images):
            first, second = self.encoder(images).chunk(2, dim=0)
            return self.decoder(torch.cat([first, second], dim=1))

    return AET()


def forward_macs(torch, model, batch) -> int:
    """Multiply-accumulates of one forward pass per pair (conv and linear layers)."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, torch.nn.Conv2d):
            kh, kw = module.kernel_size
            total += output.numel() * module.in_channels * kh * kw // module.groups
        elif isinstance(module, torch.nn.Linear):
            total += output.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules()
             if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(batch)
    for hook in hooks:
        hook.remove()
    return total // (batch.shape[0] // 2)


class TorchRunner:
    """`benchmarks.step_runner.StepRunner`'s interface for one `torch:` configuration."""

    def __init__(self, spec, batch_size: int):
        torch = self.torch = import_torch()
        if spec.loss != "mse":
            raise SystemExit(f"{spec.name}: the PyTorch step has the AETv1 loss only (mse)")
        torch.manual_seed(0)
        self.spec = spec
        self.model = build_model(torch).to(memory_format=torch.channels_last)
        self.images = torch.randn(2 * batch_size, 3, 32, 32).to(
            memory_format=torch.channels_last)
        self.params = torch.randn(batch_size, 8)
        self.optimizer = torch.optim.Adam(self.model.parameters(), 1e-3, weight_decay=5e-4)
        self.bf16 = spec.precision == "mixed_bfloat16"
        self.model.train()

    def round_steps(self, steps: int) -> int:
        return steps

    def run(self, steps: int) -> None:
        torch = self.torch
        for _ in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                output = self.model(self.images)
            loss = torch.nn.functional.mse_loss(output.float(), self.params)
            loss.backward()
            self.optimizer.step()

    def flops_per_pair(self) -> float:
        return common.train_step_flops(forward_macs(self.torch, self.model, self.images))


def main() -> None:
    """The worker (`benchmarks.backends` protocol)."""
    from benchmarks.backends import serve
    from benchmarks.step_runner import Spec

    p = argparse.ArgumentParser(description="A benchmarks.step worker of PyTorch.")
    p.add_argument("--configs", required=True)
    p.add_argument("--batch_size", type=int, required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps_per_execution", default="", help="Ignored (one step a call).")
    args = p.parse_args()
    torch = import_torch()
    runners = {}
    for config in args.configs.split(","):
        spec = Spec.parse(config)
        t0 = time.perf_counter()
        runners[spec.name] = TorchRunner(spec, args.batch_size)
        runners[spec.name].run(args.warmup)
        print(f"@@built {spec.name} {time.perf_counter() - t0:.3f} torch-{torch.__version__}-"
              f"{'bf16' if runners[spec.name].bf16 else 'fp32'}-threads"
              f"{torch.get_num_threads()}", flush=True)
    serve(runners)


if __name__ == "__main__":
    main()
