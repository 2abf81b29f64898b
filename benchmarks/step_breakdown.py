"""Where the AETv2 pretext step's time goes on the device: the `benchmarks.device_step` part
``breakdown`` (Keras on JAX; called by it in a child process).

The default AETv2 model (`device_model.build`: one encoder call, per-half statistics; the SVD
projection) is cut into separately jitted pieces at the step's shapes, each timed as ms per
call by repeating it ``K`` times inside ONE jitted `lax.fori_loop` whose iterations depend on
each other (so XLA cannot hoist the work out of the loop, and no per-call dispatch is counted;
a device's loop may add a few microseconds a trip, which only the smallest pieces feel):

* ``pairs``: the sampling, augmentation and warp (`HomographyPairs`) of B uint8 images;
* ``encoder_two_pass`` / ``encoder_one_pass``: the encoder's forward and backward pass on x and
  t(x), as two calls of B or as one call of 2B with per-half statistics;
* ``loss_svd`` / ``loss_newton``: the default loss's forward and backward pass on (B, 8);
* ``optimizer``: the optimizer's update of every trainable variable;
* ``step_in_loop``: the whole train step (``model.train_step``), K steps in one jit, on a batch
  already on the device; ``step_resident``: the same, each step's batch sliced from a uint8
  training set resident on the device (50,000 images; sampling and warping inside the step);
* ``step_dispatched``: the whole train step jitted alone, called from Python once per step on
  a device batch (the host's per-step dispatch included).

``fit`` in the ``keras`` part minus ``step_dispatched`` is the cost of feeding each batch from
the host; ``step_dispatched`` minus ``step_in_loop`` the per-call dispatch.
"""

from __future__ import annotations

import time


def _timer(deadline: float, seconds: float, out: dict):
    """``timed(name, fn, inputs, carry, k)``: compiles ``fn(inputs, carry) -> carry`` looped
    ``k`` times in one jit (``inputs``: arguments, not constants folded into the program), runs
    it until ``seconds`` have passed (at least twice), records ms per iteration and the compile
    time in ``out``; skips when the deadline is near."""
    import jax

    def timed(name: str, body, inputs, carry, k: int):
        if time.time() + seconds + 10 > deadline:
            out[name] = {"skipped": "the part's time limit"}
            print(f"{name}: skipped (the part's time limit)", flush=True)
            return carry
        def in_loop(a, c):
            return jax.lax.fori_loop(0, k, lambda i, x: body(a, x), c)

        def written_out(a, c):
            for _ in range(k):
                c = body(a, c)
            return c

        # XLA:CPU runs a bf16 convolution inside a while loop ~25x slower than outside it
        # (measured): on a CPU the k iterations are written out (the device's loop traced).
        cpu = jax.default_backend() == "cpu"
        if cpu:
            jax.eval_shape(in_loop, inputs, carry)
        loop = jax.jit(written_out if cpu else in_loop)
        begin = time.perf_counter()
        carry = jax.block_until_ready(loop(inputs, carry))
        compile_s = time.perf_counter() - begin
        calls, begin = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - begin < seconds:
            carry = jax.block_until_ready(loop(inputs, carry))  # (else dispatch runs ahead)
            calls += 1
        ms = (time.perf_counter() - begin) * 1e3 / (calls * k)
        out[name] = {"ms": ms, "compile_s": compile_s, "iterations": calls * k}
        print(f"{name}: {ms:.3f} ms (compile {compile_s:.1f} s, {calls * k} iterations)",
              flush=True)
        return carry

    return timed


def breakdown_part(args, deadline: float) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from aetv2_tf.models.batch_groups import batch_statistics_groups
    from benchmarks.device_model import build, run_config

    config = run_config(args.batch, args.spe)
    encoder, model = build(config, True, "svd")
    out: dict = {"batch": args.batch, "devices": [str(d) for d in jax.devices()]}
    timed = _timer(deadline, args.seconds / 2, out)
    k = 1 if args.tiny else 20
    b, size = args.batch, config.image_size
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.integers(0, 256, (b, size, size, 3), np.uint8))
    values = lambda vs: [v.value for v in vs]  # noqa: E731

    pairs = model.get_layer("pairs")
    x, tx, params = pairs(images, training=True)

    def pairs_body(batch, c):
        state, total = c
        (x, tx, p), state = pairs.stateless_call([], state, batch)
        return state, total + jnp.sum(x) + jnp.sum(tx) + jnp.sum(p)

    timed("pairs", pairs_body, images, (values(pairs.non_trainable_variables), jnp.float32(0)),
          k)

    feature = "block4"

    def features(tv, ntv, batch, groups):
        with batch_statistics_groups(groups):
            out, ntv = encoder.stateless_call(tv, ntv, batch, training=True)
        return jnp.mean(out[feature].astype("float32")), ntv

    def encoder_loss(tv, ntv, pair, shift, groups):
        x, tx = pair
        if groups == 2:
            return features(tv, ntv, jnp.concatenate([x, tx]) + shift, 2)
        first, ntv = features(tv, ntv, x + shift, 1)
        second, ntv = features(tv, ntv, tx + shift, 1)
        return first + second, ntv

    for name, groups in (("encoder_two_pass", 1), ("encoder_one_pass", 2)):
        grad = jax.value_and_grad(
            lambda tv, ntv, pair, s, g=groups: encoder_loss(tv, ntv, pair, s, g), has_aux=True)

        def encoder_body(a, c, grad=grad):
            tv, pair = a
            ntv, shift = c
            (value, ntv), grads = grad(tv, ntv, pair, shift)
            return ntv, shift + 1e-12 * (value + sum(jnp.sum(g) for g in grads))

        timed(name, encoder_body, (values(encoder.trainable_variables), (x, tx)),
              (values(encoder.non_trainable_variables), jnp.float32(0)), k)

    loss_fn = model.loss
    y_true = jnp.asarray(params)
    y_pred = y_true + 0.01 * jnp.asarray(rng.standard_normal(y_true.shape), jnp.float32)
    for name, projection in (("loss_svd", "svd"), ("loss_newton", "newton")):
        loss_fn.projection = projection  # (read when the loss is traced)
        grad = jax.value_and_grad(lambda t, p: loss_fn(t, p), argnums=1)
        timed(name, lambda a, c, grad=grad: c + 1e-12 * sum(
            jnp.sum(v) for v in grad(a[0], a[1] + c)), (y_true, y_pred), jnp.float32(0), k)
    loss_fn.projection = "svd"

    optimizer = model.optimizer
    tv = values(model.trainable_variables)
    fake = [1e-3 * jnp.ones_like(v) for v in tv]
    timed("optimizer", lambda grads, c: optimizer.stateless_apply(c[1], grads, c[0]), fake,
          (tv, values(optimizer.variables)), k)

    state = tuple(values(vs) for vs in (model.trainable_variables, model.non_trainable_variables,
                                        optimizer.variables, model.metrics_variables))
    step = lambda s, batch: model.train_step(s, (batch, None, None))[1]  # noqa: E731
    once = jax.jit(step)
    state = jax.block_until_ready(once(state, images))  # (the metrics' variables built)
    state = timed("step_in_loop", lambda batch, s: step(s, batch), images, state, k)
    resident = jnp.asarray(rng.integers(0, 256, (64 if args.tiny else 50_000, size, size, 3),
                                        np.uint8))
    batches = resident.shape[0] // b

    def resident_body(data, c):
        s, i = c
        batch = jax.lax.dynamic_slice_in_dim(data, (i % batches) * b, b)
        return step(s, batch), i + 1

    state, _ = timed("step_resident", resident_body, resident, (state, jnp.int32(0)), k)
    out["resident_bytes"] = int(resident.nbytes)
    if time.time() + args.seconds + 10 < deadline:
        state = jax.block_until_ready(once(state, images))  # (the loop's carry: recompiled)
        calls, begin = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - begin < args.seconds / 2:
            state = once(state, images)
            calls += 1
            if calls % 20 == 0 or args.tiny:  # a queue of at most 20 steps, as fit's
                jax.block_until_ready(state)
        jax.block_until_ready(state)
        ms = (time.perf_counter() - begin) * 1e3 / calls
        out["step_dispatched"] = {"ms": ms, "iterations": calls}
        print(f"step_dispatched: {ms:.3f} ms ({calls} calls)", flush=True)
    pieces = ("pairs", "encoder_one_pass", "loss_svd", "optimizer")
    if all("ms" in out.get(p, {}) for p in (*pieces, "step_in_loop")):
        parts = sum(out[p]["ms"] for p in pieces)
        out["pieces_sum_ms"] = parts
        print(f"pieces (pairs + encoder_one_pass + loss_svd + optimizer): {parts:.3f} ms of "
              f"step_in_loop {out['step_in_loop']['ms']:.3f} ms; per pair "
              f"{out['step_in_loop']['ms'] * 1e3 / b:.2f} us = "
              f"{b / out['step_in_loop']['ms'] * 1e3:,.0f} pairs/s on the device alone",
              flush=True)
    return out
