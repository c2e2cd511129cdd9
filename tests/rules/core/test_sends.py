"""Action requests: rendered with escaped values, decided by limits, protection and dry run."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from rules.core.core import Core, Tick
from tests.rules.helpers import at, config, gpu, held_idle, idle_core, proc, rules_from, snapshot


def test_values_from_the_machine_are_escaped_for_the_destination_but_the_authors_text_is_not(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(held_idle(name="<!channel>"), at(0)).actions
    assert req.params["text"] == "GPU 0 held by &lt;!channel&gt; <b>"


def test_max_per_hour_suppresses_the_rest(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "limits: {max_per_hour: 2}")
    out = core.step(snapshot(at(0), gpus=[gpu(i) for i in range(3)], processes=[proc(42, gpus=[0, 1, 2])]), at(0))
    assert [a.decision for a in out.actions] == ["run", "run", "suppressed"]
    assert "max_per_hour" in (out.actions[2].reason or "")


def test_fleet_wide_limits_per_action_type(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"kill": {"max_per_hour": 1}}}})
    core = Core(rules_from(tmp_path, """\
rules:
  - name: k
    entity: process
    when: process.user == 'bob'
    actions: [{type: kill}]
"""), cfg)
    out = core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(1, user="bob"), proc(2, user="bob")]), at(0))
    assert sorted(a.decision for a in out.actions) == ["run", "suppressed"]


def test_protected_processes_are_never_killed(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: k
    entity: process
    when: true
    actions: [{type: kill}, {type: log, message: m}]
"""))
    out = core.step(snapshot(at(0), gpus=[gpu(0)] + [gpu(i, 90) for i in range(1, 8)],
                             processes=[proc(1, user="root")]), at(0))
    assert [(a.type, a.decision) for a in out.actions] == [("kill", "refused"), ("log", "run")]
    assert "protected: user root" in (out.actions[0].reason or "")


def test_dry_run_renders_but_does_not_run(tmp_path: Path) -> None:
    core = idle_core(tmp_path, cfg=config(dry_run=True))
    (req,) = core.step(held_idle(), at(0)).actions
    assert (req.decision, req.dry_run, req.params["to"]) == ("dry_run", True, "alice")


def test_a_missing_owner_does_not_render_as_none(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42, user=None)]), at(0)).actions
    assert req.decision == "refused" and req.params["to"] == "" and "to:" in (req.reason or "")


def test_templates_see_the_incident_its_start_status_and_count(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: hot
    entity: gpu
    when: gpu.util_pct > 50
    repeat: 1m
    actions:
      - type: log
        message: "{{ incident.id }} {{ incident.status }} {{ incident.started_at }} {{ incident.count }}
          {{ incident.firing_for }}"
"""), Config.model_validate({"agent": {"snapshot_interval": "1h"}}))
    (first,) = core.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0)).actions
    inc = core.open_incidents()[0]
    assert first.params["message"] == f"{inc.id} firing {at(0)} 1 0s"
    (again,) = core.step(Tick(), at(90)).actions
    assert again.params["message"] == f"{inc.id} firing {at(0)} 2 1m 30s"


def test_a_scale_command_is_refused_when_a_machine_value_would_start_an_option(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: s
    entity: process
    when: true
    actions:
      - {type: scale, provider: command, replicas: 0, argv: [scale-pool, "{{ process.name }}", "{replicas}"]}
"""))
    (req,) = core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(7, name="--all-pools")]), at(0)).actions
    assert req.decision == "refused" and "starts with '-'" in (req.reason or "")
