"""The names and the GPU annotation format shared by every component."""

from __future__ import annotations

import json

import pytest

from gpushare import protocol
from gpushare.protocol import GpuInfo, ProtocolError


def test_resource_names_are_in_the_gpushare_domain() -> None:
    assert protocol.MANAGED_RESOURCES == (
        "gpushare.io/gpu-mem",
        "gpushare.io/gpu-core",
        "gpushare.io/gpu",
    )
    assert protocol.ANNOTATION_GPUS == "gpushare.io/gpus"
    assert protocol.LABEL_ENABLED == "gpushare.io/enabled"


def test_gpus_annotation_round_trips() -> None:
    gpus = [
        GpuInfo(uuid="GPU-a", index=0, model="H200", memory_mib=144384, numa=0),
        GpuInfo(uuid="GPU-b", index=1, model="H200", memory_mib=144384, numa=1, healthy=False),
    ]
    text = protocol.encode_gpus(gpus)
    assert json.loads(text)[1] == {
        "uuid": "GPU-b",
        "index": 1,
        "model": "H200",
        "memoryMiB": 144384,
        "numa": 1,
        "healthy": False,
    }
    assert protocol.decode_gpus(text) == gpus


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not JSON"),
        ('{"uuid": "x"}', "expected a JSON list"),
        ("[1]", "expected an object"),
        ('[{"uuid":"x","index":"0","model":"m","memoryMiB":1,"numa":0,"healthy":true}]', "index"),
        ('[{"uuid":"x","index":true,"model":"m","memoryMiB":1,"numa":0,"healthy":true}]', "index"),
        ('[{"uuid":"x","index":0,"model":"m","numa":0,"healthy":true}]', "memoryMiB"),
    ],
)
def test_malformed_gpus_annotation_is_one_line_error(text: str, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem) as error:
        protocol.decode_gpus(text)
    assert "\n" not in str(error.value)


def test_label_value() -> None:
    assert protocol.label_value("H200") == "H200"
    assert protocol.label_value("Tesla V100/SXM2 32GB") == "Tesla-V100-SXM2-32GB"
    assert protocol.label_value("-x-") == "x"
    assert len(protocol.label_value("a" * 100)) == 63


def test_every_name_in_the_contract_is_documented() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
    names = {
        constant: value
        for constant, value in vars(protocol).items()
        if constant.startswith(("ANNOTATION_", "LABEL_", "RESOURCE_", "ALIYUN_"))
        and isinstance(value, str)
    }
    missing = sorted(f"{c} ({v})" for c, v in names.items() if v not in text)
    assert not missing, f"docs/protocol.md does not mention: {', '.join(missing)}"
