"""Sizes the schema admits but this machine cannot hold: refused with the params, not found as a MemoryError or
minutes of swapping inside a stage."""

from __future__ import annotations

import os

from pipeline.tasks.common import SyntheticParams

MAX_BLOCKS = 1000  # residual blocks of one model (the default has 8)


def machine_memory() -> int:
    """Physical memory in bytes (what a size estimate is compared with)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


Need = tuple[str, object, int, str]  # (params key, its value, bytes it makes a stage hold, what they are)


def data_and_model_needs(params) -> list[Need]:
    """The generated tasks' pools, a model's training state and the report's item bootstrap."""
    # the generated tasks' pools at their canvas (natural images are read from their archive, not held at this size)
    pools = [(f"tasks.{t}.n", getattr(params.tasks, t).n + getattr(getattr(params.tasks, t), "transfer_n", 0),
              params.for_task(t).geometry) for t in params.tasks.names
             if isinstance(getattr(params.tasks, t), SyntheticParams)]
    needs = [(key, n, n * g.image_size**2 * g.channels, f"{n} images of {g.image_size}x{g.image_size}x"
              f"{g.channels} uint8 (geometry.image_size x the task's zoom, geometry.channels)") for key, n, g in pools]
    # weights, gradients and AdamW's two moments: four float32 copies of every parameter
    needs.append(("models.param_target", params.models.param_target, 16 * params.models.param_target,
                  f"{params.models.param_target} parameters x 16 bytes (weights, gradients, AdamW moments)"))
    # the report's item bootstrap: a (replicates x test items) float64 weight matrix and its int64 counts
    reps, items = params.report.bootstrap_samples, params.slice.test_size
    needs.append(("report.bootstrap_samples", reps, 16 * reps * items,
                  f"{reps} replicates x {items} test items x 16 bytes"))
    # a classifier head of reference_classes outputs at the narrowest width (1): what no parameter target holds
    m = params.models
    needs.append(("models.reference_classes", m.reference_classes, 16 * m.reference_classes,
                  f"a head of {m.reference_classes} outputs x 16 bytes at width 1"))
    return needs


def interface_needs(params) -> list[Need]:
    """The exact checks' largest tensors."""
    g, i = params.geometry, params.interface
    # the widest patch embedding: its weights and the Jacobian and null-space copies of them
    d, fan_in = max(i.widths), i.patch_size**2 * g.channels
    needs = [("interface.widths", d, 16 * d * fan_in, f"a width-{d} embedding of {fan_in} inputs x 16 bytes")]
    # an (n x n) attention map per head at large_tokens, a (pixels x pixels) Jacobian per probe at
    # interface.image_size, a (tokens x tokens) Swin mask at pair_counts
    pixels = i.image_size**2 * g.channels
    needs.append(("interface.large_tokens", i.large_tokens, 8 * i.large_tokens**2 * i.num_heads,
                  f"a {i.large_tokens} x {i.large_tokens} float64 attention map per head"))
    needs.append(("interface.image_size", i.image_size, 8 * pixels**2,
                  f"a ({pixels} x {pixels}) float64 Jacobian of a {i.image_size} px image"))
    needs.append(("interface.probes", i.probes, 8 * pixels**2 * i.probes,
                  f"{i.probes} Jacobians of {pixels} x {pixels} float64"))
    grid_tokens = max((i.pair_counts.image_size // p) ** 2 for p in i.pair_counts.patch_sizes)
    needs.append(("interface.pair_counts.image_size", i.pair_counts.image_size, grid_tokens**2 // 8,
                  f"a {grid_tokens} x {grid_tokens} token-pair mask"))
    needs.append(("interface.embed_dim", i.embed_dim, 16 * 12 * i.embed_dim**2 * max(i.depth, 1),
                  f"{max(i.depth, 1)} ViT blocks of width {i.embed_dim} (12 d^2 parameters each) x 16 bytes"))
    for size in i.pair_counts.extra_image_sizes:
        tokens = (size // i.pair_counts.extra_patch_size) ** 2
        needs.append(("interface.pair_counts.extra_image_sizes", size, tokens**2 // 8,
                      f"a {tokens} x {tokens} token-pair mask at {size} px"))
    return needs


def other_size_needs(params) -> list[Need]:
    """A model evaluated or fine-tuned at another size: a batch of float32 images and, per head, the (tokens x
    tokens) attention map of one block (the smallest patch any family uses: the geometry's)."""
    g, rt, ft = params.geometry, params.train.runtime, params.finetune
    # a task's zoom multiplies the pixels, not the tokens: the largest zoom's images
    k = max((getattr(params.tasks, t).zoom for t in params.tasks.names), default=1)
    sized = [("evaluation.resolution.sizes", s, "train.runtime.eval_batch_size", rt.eval_batch_size)
             for s in params.evaluation.resolution.sizes]
    sized += [("finetune.size", ft.size, "finetune.batch_size", ft.batch_size)] if ft.tasks else []
    needs = []
    for key, size, batch_key, batch in sized:
        tokens = (size // g.patch_size) ** 2
        needs.append((key, size, 4 * batch * ((k * size) ** 2 * g.channels + tokens**2),
                      f"a batch of {batch} ({batch_key}) images of {k * size} px and their {tokens} x {tokens} "
                      "attention map x 4 bytes"))
    return needs


def check_fits_in_memory(params) -> None:
    """The largest arrays each key makes a stage hold, against this machine's memory (ValueError naming the key)."""
    have = machine_memory()
    for key, value, need, what in data_and_model_needs(params) + interface_needs(params) + other_size_needs(params):
        if need > have:
            raise ValueError(f"{key}: {value} is too large: {what} take {need / 2**30:.1f} GiB, more than "
                             f"this machine's {have / 2**30:.1f} GiB of memory")
    m = params.models
    if m.reference_classes > m.param_target:  # every class needs at least one weight of the head
        raise ValueError(f"models.reference_classes: {m.reference_classes} classes need a head larger than "
                         f"models.param_target {m.param_target}")
    # building a model is about a millisecond per block and solving its width builds it ~20 times: a depth that
    # takes minutes before the first step is refused here
    blocks = sum(m.resnet.layers) if hasattr(m, "resnet") else 0
    if blocks > MAX_BLOCKS:
        raise ValueError(f"models.resnet.layers: {m.resnet.layers} are {blocks} blocks; building and solving the "
                         f"width of a model that deep takes minutes (at most {MAX_BLOCKS} blocks)")
