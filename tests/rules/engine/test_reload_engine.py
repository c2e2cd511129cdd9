"""The engine's reload against a real nats-server: a description edit keeps the incident; a real change closes it
with an audited `rule_changed` transition, the old rule's on_resolve request and the KV record removed."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js import JetStreamContext

from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from gpuevents.config import Config, NatsConfig
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import act_requests, audit_records, incident, publish, running
from tests.waiting import wait_for

RULE = """\
rules:
  - name: held-gpu
    description: {description}
    entity: gpu
    when: gpu.idle and {extra}gpu.processes
    actions: [{{type: log, message: fire}}]
    on_resolve: [{{type: log, message: "resolve {{{{ rule.description }}}}"}}]
"""


@pytest.fixture
def config(nats_config: NatsConfig, tmp_path: Path) -> Config:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(RULE.format(description="first", extra=""))
    return Config.model_validate({
        "cluster": "c1", "nats": nats_config.model_dump(),
        "engine": {"rules": [str(rules)], "tick": "30s", "lease_ttl": "10s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
    })


async def test_reload_keeps_or_closes_incidents_through_the_normal_path(config: Config, bus: Bus,
                                                                     jetstream: JetStreamContext) -> None:
    rule_file = Path(config.engine.rules[0]) / "r.yaml"
    clock = ManualClock(T0)
    async with running(await Engine.open(config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a firing incident")
        firing = incident(engine, "n1/gpu0")
        assert firing.status == "firing"
        rule_file.write_text(RULE.format(description="second", extra=""))
        assert await engine.reload() is True
        assert incident(engine, "n1/gpu0") == firing  # only the description changed
        rule_file.write_text(RULE.format(description="third", extra="gpu.util_pct < 5 and "))
        assert await engine.reload() is True
        now = incident(engine, "n1/gpu0")
        assert now is None or now.id != firing.id  # closed; the changed rule may already have opened anew
        assert firing.id not in {i.id for i in (await engine.committer.stores.incidents.load()).values()}
        transitions = [(r.from_status, r.to_status, r.detail) for r in await audit_records(bus)
                       if r.kind == "transition" and r.incident_id == firing.id]
        assert transitions[-1] == ("firing", "resolved", "rule_changed")
        requests = [(r.phase, r.params.get("message")) for r in await act_requests(jetstream)
                    if r.incident_id == firing.id]
        assert requests == [("fire", "fire"), ("resolve", "resolve second")]  # the old rule's on_resolve
        clock.advance(1)
        await engine.tick()  # the changed rule is evaluated in full (the engine ticks at once): a new incident
        assert incident(engine, "n1/gpu0").status == "firing" and incident(engine, "n1/gpu0").id != firing.id


async def test_a_reload_rejected_by_rules_check_keeps_the_running_rules(config: Config, bus: Bus) -> None:
    """A template typo (`gpu.ownr`) fails `rules check`; the engine must not load it and close the working
    rule's incident as rule_removed."""
    rule_file = Path(config.engine.rules[0]) / "r.yaml"
    clock = ManualClock(T0)
    async with running(await Engine.open(config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="the rule to fire")
        firing = incident(engine, "n1/gpu0")
        rule_file.write_text(RULE.format(description="typo", extra="").replace("message: fire",
                                                                                 "message: '{{ gpu.ownr }}'"))
        assert await engine.reload() is False
        assert engine.metrics.reloads.labels(result="failed")._value.get() == 1
        assert incident(engine, "n1/gpu0") == firing
        assert engine.core.rules.by_name["held-gpu"].spec.description == "first"


SLOW = """\
rules:
  - name: slow
    entity: gpu
    when: gpu.idle
    actions:
      - type: log
        message: "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
"""
"""A rule whose check renders 10^10 loop turns that write nothing: cheap YAML, costly in time (not memory) to load."""

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
) + "rules: *i\n"


async def test_an_alias_bomb_dropped_into_the_rules_folder_is_refused_and_the_old_rules_keep_running(
        config: Config, bus: Bus) -> None:
    rules = Path(config.engine.rules[0])
    async with running(await Engine.open(config, bus, clock=ManualClock(T0))) as engine:
        (rules / "bomb.yaml").write_text(BOMB)
        await wait_for(lambda: failed_reloads(engine) == 1, timeout=30, what="the reload refused")
        assert list(engine.core.rules.by_name) == ["held-gpu"]
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="the old rule firing after the refused reload")


async def test_a_reload_that_costs_too_much_time_is_refused_while_the_engine_keeps_consuming(
        config: Config, bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    rules = Path(config.engine.rules[0])
    async with running(await Engine.open(config, bus, clock=ManualClock(T0))) as engine:
        engine.rule_files.reload_timeout = 10
        (rules / "slow.yaml").write_text(SLOW)
        await wait_for(lambda: not engine.rule_files.changed(), what="the reload to start")
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="an event handled during the reload")
        assert failed_reloads(engine) == 0  # the child still grinds: the engine's loop never ran the file's cost
        await wait_for(lambda: failed_reloads(engine) == 1, timeout=30, what="the reload refused")
        assert "took longer than 10s to load" in caplog.text
        assert list(engine.core.rules.by_name) == ["held-gpu"]


def failed_reloads(engine: Engine) -> float:
    return float(engine.metrics.reloads.labels(result="failed")._value.get())
