"""Where the AETv2 pretext step's time goes on the device: the `benchmarks.device_step` part
``breakdown`` (Keras on JAX).

    python3 -m benchmarks.step_breakdown [--batch=512] [--records=FILE] [--deadline=T]

The default AETv2 model (`keras_step.build`: one encoder call, per-half statistics; the SVD
projection) cut into separately jitted pieces at the step's shapes, each timed as ms per call by
repeating it ``K`` times inside ONE jitted `lax.fori_loop` whose iterations depend on each other
(so XLA cannot hoist the work out of the loop, and no per-call dispatch is counted; a device's
loop may add a few microseconds a trip, which only the smallest pieces feel). In the order of
what they tell, each skipped when it would not end by the deadline, compilation counted
(`device_step.Clock`):

* ``step_dispatched``: the whole train step (``model.train_step``) jitted alone, called from
  Python once per step (``fit``'s time less this: the host's feeding);
* ``step_in_loop``: the whole step, K steps in one jit, on a batch on the device (and its rate:
  the device alone; ``step_dispatched`` less this: the per-call dispatch); ``step_resident``:
  each step's batch sliced from a uint8 training set resident on the device (50,000 images);
* ``pairs``: the sampling, augmentation and warp (`HomographyPairs`) of B uint8 images;
* ``encoder_two_pass`` / ``encoder_one_pass``: the encoder's forward and backward pass on x and
  t(x), as two calls of B or one call of 2B with per-half statistics;
* ``loss_svd`` / ``loss_newton``: the default loss's forward and backward pass on (B, 8);
* ``optimizer``: the optimizer's update of every trainable variable.
"""

from __future__ import annotations

import functools
import sys
import time

from benchmarks.device_step import Clock, Records, part_parser

#: Each piece's compilation in step-sized compilations (`device_step.STEP_COMPILE_S`): an
#: estimate for `Clock` until the step's own is measured.
COMPILES = {"step_dispatched": 1.0, "step_in_loop": 1.0, "step_resident": 1.0, "pairs": 0.1,
            "encoder_two_pass": 0.6, "encoder_one_pass": 0.6, "loss_svd": 0.1,
            "loss_newton": 0.1, "optimizer": 0.1}


def _timer(clock: Clock, records: Records, seconds: float, k: int, ms: dict):
    """``timed(name, fn, inputs, carry, pairs=0, dispatched=False)``: compiles ``fn(inputs,
    carry) -> carry`` looped ``k`` times in one jit (``inputs``: arguments, not constants folded
    into the program; ``dispatched``: jitted alone and called once per iteration, waited for
    every ``k`` calls, as ``fit`` queues steps), runs it until ``seconds`` have passed (at least
    twice), records ms per iteration (into ``ms`` too; and the rate when an iteration is a step
    of ``pairs``) and the compile time; skips it when the clock says so."""
    import jax

    def timed(name: str, body, inputs, carry, pairs: int = 0, dispatched: bool = False):
        if not clock.allows(records, name, COMPILES[name], seconds + 2):
            return carry

        def in_loop(a, c):
            return jax.lax.fori_loop(0, k, lambda i, x: body(a, x), c)

        def written_out(a, c):
            for _ in range(k):
                c = body(a, c)
            return c

        # XLA:CPU runs a bf16 convolution inside a while loop ~25x slower than outside it
        # (measured): on a CPU the k iterations are written out (the device's loop traced);
        # one iteration written out is the body itself, compiled once for all its uses.
        cpu = jax.default_backend() == "cpu"
        if cpu and not dispatched:
            jax.eval_shape(in_loop, inputs, carry)
        alone = dispatched or (cpu and k == 1)
        loop = jax.jit(body if alone else written_out if cpu else in_loop)
        begin = time.perf_counter()
        carry = jax.block_until_ready(loop(inputs, carry))
        compile_s = time.perf_counter() - begin
        if dispatched:  # the step's own compilation: later estimates use it
            clock.compiled(compile_s)
        calls, per_call, begin = 0, 1 if dispatched else k, time.perf_counter()
        while calls < 2 or time.perf_counter() - begin < seconds:
            carry = loop(inputs, carry)
            calls += 1
            if not dispatched or calls % k == 0:  # (else dispatch runs ahead)
                jax.block_until_ready(carry)
        jax.block_until_ready(carry)
        ms[name] = (time.perf_counter() - begin) * 1e3 / (calls * per_call)
        rate = {"pairs_per_s": pairs / ms[name] * 1e3} if pairs else {}
        shown = f"; {rate['pairs_per_s']:,.0f} pairs/s" if pairs else ""
        records.add(name, "ms", f"{name}: {ms[name]:.3f} ms (compile {compile_s:.1f} s, "
                    f"{calls * per_call} iterations{shown})", ms=ms[name], compile_s=compile_s,
                    iterations=calls * per_call, **rate)
        return carry

    return timed


def whole_step(model, images, timed, tiny: bool) -> int:
    """``step_dispatched``, ``step_in_loop`` and ``step_resident`` (module docstring); returns
    the resident set's bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def variables():
        return tuple([v.value for v in vs] for vs in (
            model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
            model.metrics_variables))

    step = lambda batch, s: model.train_step(s, (batch, None, None))[1]  # noqa: E731
    jax.eval_shape(step, images, variables())  # the trace builds the metrics' last variables:
    state = variables()  # a state with them compiles once (without: twice, measured)
    b, size = images.shape[:2]
    state = timed("step_dispatched", step, images, state, pairs=b, dispatched=True)
    state = timed("step_in_loop", step, images, state, pairs=b)
    resident = jnp.asarray(np.random.default_rng(1).integers(
        0, 256, (64 if tiny else 50_000, size, size, 3), np.uint8))
    batches = resident.shape[0] // b

    def resident_body(data, c):
        return step(jax.lax.dynamic_slice_in_dim(data, (c[1] % batches) * b, b), c[0]), c[1] + 1

    timed("step_resident", resident_body, resident, (state, jnp.int32(0)), pairs=b)
    return int(resident.nbytes)


def pieces(encoder, model, images, timed) -> None:
    """``pairs``, the encoders, the losses and the optimizer (module docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from aetv2_tf.models.batch_groups import batch_statistics_groups

    values = lambda vs: [v.value for v in vs]  # noqa: E731
    pairs = model.get_layer("pairs")
    x, tx, params = pairs(images, training=True)

    def pairs_body(batch, c):
        (x, tx, p), state = pairs.stateless_call([], c[0], batch)
        return state, c[1] + jnp.sum(x) + jnp.sum(tx) + jnp.sum(p)

    timed("pairs", pairs_body, images, (values(pairs.non_trainable_variables), jnp.float32(0)))

    def features(tv, ntv, batch, groups):
        with batch_statistics_groups(groups):
            out, ntv = encoder.stateless_call(tv, ntv, batch, training=True)
        return jnp.mean(out["block4"].astype("float32")), ntv

    def encoder_loss(tv, ntv, pair, shift, groups):
        if groups == 2:
            return features(tv, ntv, jnp.concatenate(pair) + shift, 2)
        first, ntv = features(tv, ntv, pair[0] + shift, 1)
        second, ntv = features(tv, ntv, pair[1] + shift, 1)
        return first + second, ntv

    for name, groups in (("encoder_two_pass", 1), ("encoder_one_pass", 2)):
        grad = jax.value_and_grad(functools.partial(encoder_loss, groups=groups), has_aux=True)

        def encoder_body(a, c, grad=grad):
            (value, ntv), grads = grad(a[0], c[0], a[1], c[1])
            return ntv, c[1] + 1e-12 * (value + sum(jnp.sum(g) for g in grads))

        timed(name, encoder_body, (values(encoder.trainable_variables), (x, tx)),
              (values(encoder.non_trainable_variables), jnp.float32(0)))

    loss_fn, y_true = model.loss, jnp.asarray(params)
    y_pred = y_true + 0.01 * jnp.asarray(np.random.default_rng(0).standard_normal(
        y_true.shape), jnp.float32)
    for name, projection in (("loss_svd", "svd"), ("loss_newton", "newton")):
        loss_fn.projection = projection  # (read when the loss is traced)
        grad = jax.value_and_grad(lambda t, p: loss_fn(t, p), argnums=1)
        timed(name, lambda a, c, grad=grad: c + 1e-12 * sum(
            jnp.sum(v) for v in grad(a[0], a[1] + c)), (y_true, y_pred), jnp.float32(0))
    loss_fn.projection = "svd"
    optimizer, tv = model.optimizer, values(model.trainable_variables)
    timed("optimizer", lambda grads, c: optimizer.stateless_apply(c[1], grads, c[0]),
          [1e-3 * jnp.ones_like(v) for v in tv], (tv, values(optimizer.variables)))


def breakdown(args, clock: Clock, records: Records) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.keras_step import build, run_config

    config = run_config(args.batch, args.spe)
    encoder, model = build(config, True, "svd")
    records.add("setup", "setup", f"step_breakdown: batch {args.batch} on {jax.devices()}",
                batch=args.batch, devices=[str(d) for d in jax.devices()])
    ms: dict[str, float] = {}
    timed = _timer(clock, records, args.seconds / 2, 1 if args.tiny else 20, ms)
    size = config.image_size
    images = jnp.asarray(np.random.default_rng(0).integers(
        0, 256, (args.batch, size, size, 3), np.uint8))
    resident_bytes = whole_step(model, images, timed, args.tiny)
    records.add("step_resident", "bytes", f"resident set: {resident_bytes:,} bytes",
                resident_bytes=resident_bytes)
    pieces(encoder, model, images, timed)
    parts = ("pairs", "encoder_one_pass", "loss_svd", "optimizer")
    if all(p in ms for p in (*parts, "step_in_loop")):
        records.add("pieces", "sum", f"pieces ({' + '.join(parts)}): "
                    f"{sum(ms[p] for p in parts):.3f} ms of step_in_loop's "
                    f"{ms['step_in_loop']:.3f} ms", ms=sum(ms[p] for p in parts))


def main(argv: list[str] | None = None) -> int:
    args = part_parser(__doc__).parse_args(argv)
    breakdown(args, Clock(args.deadline), Records(args.records, "breakdown"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
