"""The kit's ResNet-50 must be torchvision's, key for key, so its checkpoints load strictly."""

import torch

from handlers.architectures.resnet import resnet50

# Published size of torchvision.models.resnet50 (weights=None or IMAGENET1K_V1).
TORCHVISION_PARAMETERS = 25_557_032
TORCHVISION_STATE_DICT_ENTRIES = 320


def torchvision_keys() -> set[str]:
    """torchvision's naming, derived independently from its documented layout."""
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    keys = {"conv1.weight", "fc.weight", "fc.bias"} | {f"bn1.{p}" for p in bn}
    for layer, blocks in enumerate((3, 4, 6, 3), start=1):
        for block in range(blocks):
            prefix = f"layer{layer}.{block}"
            for i in (1, 2, 3):
                keys.add(f"{prefix}.conv{i}.weight")
                keys |= {f"{prefix}.bn{i}.{p}" for p in bn}
            if block == 0:
                keys.add(f"{prefix}.downsample.0.weight")
                keys |= {f"{prefix}.downsample.1.{p}" for p in bn}
    return keys


def test_state_dict_matches_torchvision_layout():
    state = resnet50().state_dict()
    assert len(state) == TORCHVISION_STATE_DICT_ENTRIES
    assert set(state) == torchvision_keys()
    assert sum(p.numel() for p in resnet50().parameters()) == TORCHVISION_PARAMETERS
    assert state["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert state["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)
    assert state["fc.weight"].shape == (1000, 2048)


def test_checkpoint_round_trip_is_strict(tmp_path):
    torch.manual_seed(1)
    source = resnet50().eval()
    torch.save(source.state_dict(), tmp_path / "resnet50.pth")
    target = resnet50().eval()
    target.load_state_dict(torch.load(tmp_path / "resnet50.pth", weights_only=True), strict=True)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


def test_relu_is_not_shared_between_calls():
    # PT2E quantizers reject one module called several times (issue notes, torchao 0.18).
    block = resnet50().layer1[0]
    assert len({id(block.relu1), id(block.relu2), id(block.relu3)}) == 3
