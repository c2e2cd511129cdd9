"""Loading rule sets: the format of DESIGN §3, and every error with its file and line."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import pytest

from actions import registry
from actions.protocol import Action, ActionParams, ActionUnit
from gpuevents.yamlpos import LocatedError
from rules.lang.loader import load_rule_set
from tests.rules.helpers import rules_from

GOOD = """\
rules:
  - name: idle-gpu-2h
    description: A job holds a GPU but has not used it for two hours
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 2h
    repeat: 6h
    timezone: Asia/Shanghai
    labels: {severity: warning}
    limits: {max_per_hour: 20, max_fleet_pct: 25}
    actions:
      - type: slack
        to: "{{ gpu.owner }}"
        text: "GPU {{ gpu.index }} on {{ node.name }} idle for {{ incident.firing_for }}"
    on_resolve:
      - type: log
        message: "{{ rule.name }} resolved on {{ entity.id }}"
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(LocatedError) as e:
        rules_from(tmp_path, text)
    return [str(p).replace(str(tmp_path) + "/", "") for p in e.value.problems]


def one_rule(body: str) -> str:
    return "rules:\n  - name: r1\n    entity: gpu\n" + body


def test_the_design_example_loads(tmp_path: Path) -> None:
    rs = rules_from(tmp_path, GOOD)
    r = rs.by_name["idle-gpu-2h"]
    assert (r.kind, r.for_s, r.repeat_s, r.tz_name) == ("gpu", 7200.0, 21600.0, "Asia/Shanghai")
    assert [a.type for a in r.actions] == ["slack"] and [a.type for a in r.on_resolve] == ["log"]
    assert r.spec.limits.max_fleet_pct == 25


def test_bad_yaml_is_located_and_said_in_our_words(tmp_path: Path) -> None:
    assert problems(tmp_path, "rules:\n  - name: x\n    entity: gpu\n   when: y\n") == [
        "rules.yaml:4: invalid YAML (column 4): this line's indentation does not line up: the keys of one mapping "
        "(and the `-` items of one list) start in the same column as the lines above"
    ]
    [deeper] = problems(tmp_path, "rules:\n  - name: x\n    entity: gpu\n      when: y\n")
    assert deeper.startswith("rules.yaml:4: invalid YAML (column 11): a `key: value` where none can be: this line "
                             "is indented more") and "mapping values" not in deeper


def test_a_template_typo_names_the_entity_kind_and_its_fields(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, """\
rules:
  - name: x
    entity: gpu
    when: gpu.idle
    actions:
      - type: log
        message: "GPU on {{ node.nmae }}"
""")
    assert problem.startswith("rules.yaml:7: message: node has no field 'nmae'; fields: cluster, ")
    assert " name, " in problem and "NodeView" not in problem


def test_bad_duration_is_located(tmp_path: Path) -> None:
    out = problems(tmp_path,
                   one_rule("    when: gpu.idle\n    for: two hours\n    actions: [{type: log, message: m}]\n"))
    assert out == ["rules.yaml:5: for: must be a duration like 2h, 15m or 1h30m, got 'two hours'"]


def test_unknown_action_type_is_located(tmp_path: Path) -> None:
    out = problems(tmp_path, one_rule("    when: gpu.idle\n    actions:\n      - type: pager\n        to: x\n"))
    assert len(out) == 1 and out[0].startswith("rules.yaml:6: actions[0].type: unknown action type 'pager'")


def test_action_parameters_are_checked_by_the_actions_model(tmp_path: Path) -> None:
    out = problems(tmp_path, one_rule(
        "    when: gpu.idle\n    actions:\n      - type: slack\n        text: hi\n        too: x\n"))
    assert "rules.yaml:8: slack.too: unknown parameter; check its spelling against the action's documentation" in out
    assert any(p.startswith("rules.yaml:6: slack.to: is required") for p in out)


def test_templated_parameters_are_checked_after_rendering_not_at_load(tmp_path: Path) -> None:
    rs = rules_from(tmp_path, one_rule(
        "    when: gpu.idle\n    actions:\n      - type: scale\n        name: x\n        replicas: '{{ 1 + 1 }}'\n"))
    assert rs.by_name["r1"].actions[0].type == "scale"


def test_duplicate_names_across_files_are_located(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(one_rule("    when: gpu.idle\n    actions: [{type: log, message: m}]\n"))
    (tmp_path / "b.yaml").write_text("# second\n" + one_rule("    when: gpu.idle\n    actions: [{type: log, message: m}]\n"))  # noqa: E501 - data as its reader sees it
    with pytest.raises(LocatedError) as e:
        load_rule_set([tmp_path])
    assert [str(p) for p in e.value.problems] == [
        f"{tmp_path}/b.yaml:3: duplicate rule name 'r1' (first defined at {tmp_path}/a.yaml:2)"
    ]


def test_bad_cron_is_located(tmp_path: Path) -> None:
    out = problems(tmp_path, "rules:\n  - name: r1\n    entity: node\n    when: node.online\n"
                   "    schedule: '0 25 * * *'\n    actions: [{type: log, message: m}]\n")
    assert len(out) == 1 and out[0].startswith("rules.yaml:5: schedule: '0 25 * * *'")


def test_unknown_timezone_is_located(tmp_path: Path) -> None:
    out = problems(tmp_path,
                   one_rule("    when: gpu.idle\n    timezone: Mars/Olympus\n    actions: [{type: log, message: m}]\n"))
    assert out == ["rules.yaml:5: timezone: unknown timezone 'Mars/Olympus'; use an IANA name like Asia/Shanghai"]


def test_unknown_name_in_when_is_located(tmp_path: Path) -> None:
    out = problems(tmp_path,
                   one_rule("    when: gpu.idle and proces.age_s > 3\n    actions: [{type: log, message: m}]\n"))
    assert len(out) == 1 and out[0].startswith("rules.yaml:4: when: unknown name 'proces'")


def test_an_error_on_a_later_line_of_a_block_when_is_located_there(tmp_path: Path) -> None:
    out = problems(tmp_path,
                   one_rule("    when: |\n      gpu.idle\n      and gpu.nope\n    actions: [{type: log, message: m}]\n"))  # noqa: E501 - data as its reader sees it
    assert len(out) == 1 and out[0].startswith("rules.yaml:6: when: gpu has no field 'nope'")
    # folded blocks are one line to Jinja2: the block's first line
    out = problems(tmp_path,
                   one_rule("    when: >-\n      gpu.idle\n      and gpu.nope\n    actions: [{type: log, message: m}]\n"))  # noqa: E501 - data as its reader sees it
    assert len(out) == 1 and out[0].startswith("rules.yaml:5: when: gpu has no field 'nope'")


def test_for_and_schedule_together_is_an_error(tmp_path: Path) -> None:
    out = problems(tmp_path, one_rule("    when: gpu.idle\n    for: 1h\n    schedule: '0 * * * *'\n"
                                      "    actions: [{type: log, message: m}]\n"))
    assert len(out) == 1 and out[0].startswith("rules.yaml:5: for: a rule with `schedule` cannot have `for`")


def test_template_errors_are_located(tmp_path: Path) -> None:
    out = problems(tmp_path, one_rule("    when: gpu.idle\n    actions:\n      - type: log\n"
                                      "        message: '{{ gpu.index '\n      - type: log\n        message: '{{ owner }}'\n"))  # noqa: E501 - data as its reader sees it
    assert out[0].startswith("rules.yaml:7: message: template syntax error")
    assert out[1].startswith("rules.yaml:9: message: unknown name 'owner' in the template")


def test_an_action_for_another_kind_of_entity_is_an_error(tmp_path: Path) -> None:
    out = problems(tmp_path,
                   "rules:\n  - name: r1\n    entity: node\n    when: node.online\n    actions: [{type: kill}]\n")
    assert out == ["rules.yaml:5: actions[0]: a kill action does not apply to a node rule (it acts on gpu, process)"]


def test_missing_keys_and_bad_names_are_reported_together(tmp_path: Path) -> None:
    out = problems(tmp_path, "rules:\n  - name: Bad_Name\n    entity: gpu\n    when: gpu.idle\n"
                   "    actions: [{type: log, message: m}]\n  - name: r2\n    entity: disk\n    on: x\n")
    assert "rules.yaml:2: name: must be lowercase letters, digits and dashes, like idle-gpu-2h" in out
    assert any(p.startswith("rules.yaml:7: entity:") for p in out)
    assert any(p.startswith("rules.yaml:6: when: is required") for p in out)
    assert any(p.startswith("rules.yaml:6: actions: is required") for p in out)
    assert any(p.startswith("rules.yaml:8: true: YAML reads `on`") for p in out)


def test_a_set_loads_whole_or_not_at_all(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text(one_rule("    when: gpu.idle and\n    actions: [{type: log, message: m}]\n"))
    with pytest.raises(LocatedError):
        load_rule_set([tmp_path])


def test_directories_skip_rule_test_files(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "good.test.yaml").write_text("rule_files: [good.yaml]\ntests: []\n")
    assert [r.name for r in load_rule_set([tmp_path])] == ["idle-gpu-2h"]


def test_the_hash_is_stable_and_changes_with_the_rule(tmp_path: Path) -> None:
    a = rules_from(tmp_path, GOOD).by_name["idle-gpu-2h"].hash
    b = rules_from(tmp_path, GOOD).by_name["idle-gpu-2h"].hash
    c = rules_from(tmp_path, GOOD.replace("for: 2h", "for: 3h")).by_name["idle-gpu-2h"].hash
    assert a == b != c


def test_a_missing_path_is_an_error() -> None:
    with pytest.raises(LocatedError) as e:
        load_rule_set([Path("/nonexistent/rules.yaml")])
    assert "no such file" in str(e.value)


def test_the_library_loads() -> None:
    lib = Path(__file__).resolve().parents[3] / "rules" / "library"
    rs = load_rule_set([lib, lib / "demo"])
    assert {"idle-gpu-2h", "idle-gpu-4h-kill", "process-older-24h", "ghost-process-dm", "ghost-process-kill",
            "holiday-cordon-cn", "staging-weekend-scale-down", "gpu-hot-10m"} <= set(rs.by_name)


NATURES = """\
rules:
  - name: hot
    entity: gpu
    when: gpu.temp_c > 85
    actions: [{type: cordon}, {type: kill}, {type: log, message: hot}, {type: drain-test}]
    on_resolve: [{type: uncordon}]
"""


class _DrainParams(ActionParams):
    type: Literal["drain-test"] = "drain-test"


class _DrainAction(Action[_DrainParams]):
    """A plugin's action, declared as a built-in declares its nature."""

    type: ClassVar[str] = "drain-test"
    params = _DrainParams
    destructive: ClassVar[bool] = True
    unit: ClassVar[ActionUnit] = "node"


@pytest.fixture
def drain_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.load()
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register(_DrainAction)


def test_an_actions_nature_is_what_its_class_declares_plugins_included(tmp_path: Path, drain_plugin: None) -> None:
    rule = rules_from(tmp_path, NATURES).by_name["hot"]
    assert [(a.type, a.destructive, a.unit) for a in rule.actions] == [
        ("cordon", True, "node"), ("kill", True, "entity"), ("log", False, "entity"), ("drain-test", True, "node")]
    assert [(a.type, a.destructive, a.unit) for a in rule.on_resolve] == [("uncordon", False, "node")]


def test_an_upgrade_does_not_change_the_hash_of_a_rule_that_uses_no_new_field(tmp_path: Path) -> None:
    # Open incidents carry their rule's hash; a changed hash closes them as rule_changed on reload. `after`
    # (staged actions) and `snooze_max` came later: at their defaults they must not move the hash. The values
    # are what the engine computed for this rule before those fields existed.
    (tmp_path / "r.yaml").write_text("""\
rules:
  - name: pinned
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 2h
    actions: [{type: log, message: "idle {{ gpu.index }}"}]
""")
    r = load_rule_set([tmp_path / "r.yaml"]).rules[0]
    assert (r.hash, r.legacy_hash) == ("0b2784384b3161a0", "f7c1db259e10c7f8")
