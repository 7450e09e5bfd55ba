"""The ResNet family: timm's ``ResNet`` with BasicBlocks, a 3x3 stride-1 stem and no max-pool, 1-4 stages.

Option ``downsample``: 'stride' (timm's stride-2 convs) | 'none' (every stride 1: every map at full resolution,
shift-equivariant up to the border) | 'blur' (timm's BlurPool ``aa_layer`` in the blocks and before the 1x1
shortcut, as Zhang 2019). timm's default stem (7x7 stride 2 + max-pool) would shrink a 16-px image to 4 px
before the first block; its 'deep' stem outputs ``2 * stem_width``, which is how the first stage's input
width is set to ``width`` here before the stem itself is replaced.
"""

from __future__ import annotations

from timm.layers import BlurPool2d
from timm.models.resnet import BasicBlock, ResNet
from torch import nn

from pipeline.config import Params
from pipeline.families.common import Family, Layer, linear, no_position_table

# Seconds per optimizer step against vit's, evaluation included (the study of 492dbde).
STEP_COST = {"resnet": 2.0, "resnet_s1": 6.6, "resnet_aa": 2.9}
PLOT_COLOUR = {"resnet": "#117733", "resnet_s1": "#777777", "resnet_aa": "#DDAA33"}
EXPECTED_TOKENS = lambda params, **options: params.geometry.image_size**2  # noqa: E731  the tests' rule: every pixel


def build(params: Params, num_classes: int, width: int, downsample: str = "stride") -> nn.Module:
    g, r = params.geometry, params.models.resnet
    channels = tuple(width * 2**i for i in range(len(r.layers)))
    model = ResNet(
        block=BasicBlock, layers=tuple(r.layers), channels=channels, num_classes=num_classes,
        in_chans=g.channels, stem_type="deep", stem_width=width // 2,
        aa_layer=BlurPool2d if downsample == "blur" else None,
    )
    model.conv1 = nn.Conv2d(g.channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as timm's init_weights
    model.maxpool = nn.Identity()
    for i in range(len(r.layers) + 1, 5):
        # timm's forward_features calls layer1..layer4 by name; absent stages become identities.
        model.add_module(f"layer{i}", nn.Identity())
    if downsample == "blur":
        _blur_shortcuts(model)
    if downsample == "none":
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.stride = (1, 1)  # 3x3 convs keep padding 1 and 1x1 shortcuts padding 0: same-size maps
    return model


def _blur_shortcuts(model: ResNet) -> None:
    """Every strided 1x1 projection shortcut becomes BlurPool (stride 2) then the 1x1 conv at stride 1."""
    for block in model.modules():
        shortcut = getattr(block, "downsample", None)
        if isinstance(shortcut, nn.Sequential) and shortcut[0].stride == (2, 2):
            shortcut[0].stride = (1, 1)
            shortcut.insert(0, BlurPool2d(shortcut[0].in_channels, stride=2))


def flops(params: Params, width: int, num_classes: int, downsample: str = "stride", **_: object) -> int:
    """3x3 stride-1 stem, BasicBlocks (two 3x3 convs), 1x1 projection where the shape changes, fc head.

    'blur': first conv at stride 1 on the larger map, then a depthwise 3x3 stride-2 BlurPool on its output and
    on the shortcut's input (9 multiply-adds per output value).
    """
    g, r = params.geometry, params.models.resnet
    res, c_in = g.image_size, width
    total = linear(res * res, 9 * g.channels, width)
    for i, blocks in enumerate(r.layers):
        c, before = width * 2**i, res
        if i > 0 and downsample != "none":
            res = (res + 1) // 2  # a stride-2 3x3 conv with padding 1 (or a 3x3 blur, padded 1) rounds up
        blurred = downsample == "blur" and res != before
        for j in range(blocks):
            first_in = c_in if j == 0 else c
            conv1_res = before if j == 0 and blurred else res
            total += linear(conv1_res**2, 9 * first_in, c) + linear(res * res, 9 * c, c)
            if j == 0 and (i > 0 or c_in != c):
                total += linear(res * res, c_in, c)  # projection shortcut
            if j == 0 and blurred:
                total += linear(res * res, 9, c) + linear(res * res, 9, c_in)  # block blur + shortcut blur
        c_in = c
    return total + linear(1, c_in, num_classes)


def chain(model: ResNet, image_size: int) -> list[Layer]:
    """Stem then every residual block (absent stages are identities and skipped)."""

    def stem(x):  # as ResNet.forward_features, before layer1
        return model.maxpool(model.act1(model.bn1(model.conv1(x))))

    layers = [Layer("stem", stem, "nchw", "nchw")]
    for i in range(1, 5):
        stage = getattr(model, f"layer{i}", None)
        if isinstance(stage, nn.Sequential):
            layers += [Layer(f"stage{i}.block{j + 1}", blk, "nchw", "nchw") for j, blk in enumerate(stage)]
    return layers


FAMILY = Family(
    name="resnet", classes=(ResNet,),
    build=build, width_step=lambda params, **_: 2,  # the stem width goes through timm's deep stem (2 * stem_width)
    flops=flops, tokens=lambda params, **_: params.geometry.image_size ** 2,  # pixel positions
    chain=chain, position=lambda model: "conv", size_step=lambda model: 1,
    resize=lambda model, size, params, arch: None,  # convolutions and a global pool: nothing to map
    position_checks=no_position_table,
    contract={"conv": "convolutional, no position parameters: nothing to map (global average pool after the last "
                      "stage)"},
    step_cost=STEP_COST, plot_colour=PLOT_COLOUR, expected_tokens=EXPECTED_TOKENS,
)
