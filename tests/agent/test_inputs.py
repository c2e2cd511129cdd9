"""A node's changing inputs reach its core with each sample, frozen; a sample without them keeps the last."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from agent.inputs import NodeInputs
from tests.agent.test_core import T0, core, reading


def test_the_inputs_are_frozen_and_a_step_without_them_keeps_the_last() -> None:
    c = core()
    inputs = NodeInputs(labels={"pool": "a100"}, cordoned=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.cordoned = False  # type: ignore[misc]  # what the test shows cannot be done
    c.step(T0, reading([]), {}, inputs)
    c.step(T0 + timedelta(seconds=15), reading([]), {})
    info = c.node_info()
    assert (info.labels, info.cordoned) == ({"pool": "a100"}, True)
    c.step(T0 + timedelta(seconds=30), reading([]), {}, dataclasses.replace(inputs, cordoned=False))
    assert c.node_info().cordoned is False
