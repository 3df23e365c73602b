"""The engine's device choices, resolved once: the device's defaults, each overridden by the config."""
from __future__ import annotations

import torch

from torchrec_frugal.config import FrugalConfig
from torchrec_frugal.engine.placement import Placement


def test_placement_follows_the_device_unless_the_config_sets_it() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert Placement.resolve(cpu, FrugalConfig()) == Placement(0, False, True)
    assert Placement.resolve(cuda, FrugalConfig()) == Placement(1, True, False)
    accelerator_on_cpu = FrugalConfig(flush_workers=1, update_uncached_in_host=False, lookahead_thread=True)
    assert Placement.resolve(cpu, accelerator_on_cpu) == Placement(1, True, False)
    assert Placement.resolve(cuda, FrugalConfig(lookahead=0)).lookahead_thread is False  # no window, nothing to publish
