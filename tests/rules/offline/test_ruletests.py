"""`rules test` and `rules check`: DESIGN §4 files, exit codes, readable failures, and the shipped library."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli.rules import app
from rules.intake.check import check_paths
from rules.offline.ruletests import run_test_file

LIBRARY = Path(__file__).resolve().parents[3] / "rules" / "library"
LIBRARY_TESTS = sorted(LIBRARY.rglob("*.test.yaml"))
runner = CliRunner()

RULES = """\
rules:
  - name: idle-gpu-2h
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 2h
    actions:
      - type: slack
        to: "{{ gpu.owner }}"
        text: "GPU {{ gpu.index }} on {{ node.name }} idle for {{ incident.firing_for }}"
"""

DESIGN_EXAMPLE = """\
rule_files: [rules/idle.yaml]
timezone: Asia/Shanghai
start: "2026-12-07T09:00:00"
tick: 30s
tests:
  - name: a held idle GPU fires after two hours
    snapshots:
      - at: 0s
        node: n1
        labels: {env: dev}
        gpus:
          - {index: 0, util_pct: 0, mem_used_mib: 20000}
          - {index: 1, util_pct: 97, mem_used_mib: 70000}
        processes:
          - {pid: 4242, user: alice, gpus: [0], age: 3h, gpu_mem_mib: 20000}
      - at: 3h
        node: n1
        gpus: [{index: 0, util_pct: 80, mem_used_mib: 20000}]
        processes: [{pid: 4242, user: alice, gpus: [0], age: 6h}]
    expect:
      - rule: idle-gpu-2h
        entity: n1/gpu0
        fires_at: 2h
        resolves_at: 3h
        actions: [slack]
      - rule: idle-gpu-2h
        entity: n1/gpu1
        never: true
"""


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "idle.yaml").write_text(RULES)
    return tmp_path


@pytest.mark.parametrize("path", LIBRARY_TESTS, ids=[str(p.relative_to(LIBRARY)) for p in LIBRARY_TESTS])
def test_library_rule_tests_pass(path: Path) -> None:
    outcome = run_test_file(path)
    assert outcome.problems == []
    failures = [f"{t.name}:\n" + "\n".join(t.failures) for t in outcome.tests if not t.passed]
    assert failures == [] and outcome.tests


def test_every_library_rule_file_has_a_test_file() -> None:
    rule_files = [p for p in LIBRARY.rglob("*.yaml") if not p.name.endswith(".test.yaml")]
    assert rule_files and all(p.with_name(p.stem + ".test.yaml").exists() for p in rule_files)


def test_the_library_passes_rules_check() -> None:
    rules, problems = check_paths([LIBRARY, LIBRARY / "demo"])
    assert problems == [] and rules is not None and len(rules) >= 11


def test_the_design_example_passes_and_exits_0(suite: Path) -> None:
    (suite / "idle.test.yaml").write_text(DESIGN_EXAMPLE)
    result = runner.invoke(app, ["test", str(suite / "idle.test.yaml")])
    assert result.exit_code == 0, result.output
    assert "PASS a held idle GPU fires after two hours" in result.output and "1 passed, 0 failed" in result.output


def test_a_failing_test_exits_1_and_shows_expected_against_actual_with_the_timeline(suite: Path) -> None:
    (suite / "idle.test.yaml").write_text(DESIGN_EXAMPLE.replace("fires_at: 2h", "fires_at: 1h")
                                          .replace("actions: [slack]", "actions: [{type: slack, to: bob}]"))
    result = runner.invoke(app, ["test", str(suite / "idle.test.yaml")])
    assert result.exit_code == 1
    out = result.output
    assert "FAIL a held idle GPU fires after two hours" in out
    assert "expected: fires at +1h (within one tick, 30s); actual: fired at +2h" in out
    assert "expected slack.to = 'bob'; actual: 'alice'" in out
    assert "+0s inactive → pending" in out and "+2h pending → firing" in out and "+3h firing → resolved" in out


def test_never_that_fires_and_count_mismatches_are_failures(suite: Path) -> None:
    text = DESIGN_EXAMPLE.replace("entity: n1/gpu1\n        never: true", "entity: n1/gpu0\n        never: true")
    text = text.replace("actions: [slack]", "actions: [slack]\n        count: 2")
    (suite / "idle.test.yaml").write_text(text)
    result = runner.invoke(app, ["test", str(suite / "idle.test.yaml")])
    assert result.exit_code == 1
    assert "expected: never fires; actual: fired at +2h" in result.output
    assert "expected: actions ran 2 time(s); actual: 1" in result.output


def test_an_invalid_test_file_exits_2(suite: Path) -> None:
    (suite / "bad.test.yaml").write_text(
        "rule_files: [rules/idle.yaml]\ntests:\n  - name: x\n    snapshots:\n      - at: soon\n        node: n1\n")
    result = runner.invoke(app, ["test", str(suite / "bad.test.yaml")])
    assert result.exit_code == 2
    assert "bad.test.yaml:5: tests.snapshots.at: must be a duration" in result.output


def test_invalid_rules_under_test_exit_2(suite: Path) -> None:
    (suite / "rules" / "idle.yaml").write_text(RULES.replace("for: 2h", "for: soon"))
    (suite / "idle.test.yaml").write_text(DESIGN_EXAMPLE)
    result = runner.invoke(app, ["test", str(suite / "idle.test.yaml")])
    assert result.exit_code == 2 and "idle.yaml:5: for: must be a duration" in result.output


def test_invalid_files_win_over_failures(suite: Path) -> None:
    (suite / "a.test.yaml").write_text(DESIGN_EXAMPLE.replace("fires_at: 2h", "fires_at: 1h"))
    (suite / "b.test.yaml").write_text("tests: []\n")
    result = runner.invoke(app, ["test", str(suite)])
    assert result.exit_code == 2


def test_gone_removes_a_node_and_resolves_its_incidents(suite: Path) -> None:
    (suite / "t.test.yaml").write_text("""\
rule_files: [rules/idle.yaml]
tests:
  - name: gone
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 1, user: u, gpus: [0]}]}
      - {at: 150m, node: n1, gone: true}
    expect:
      - {rule: idle-gpu-2h, entity: n1/gpu0, fires_at: 2h, resolves_at: 150m}
""")
    result = runner.invoke(app, ["test", str(suite / "t.test.yaml")])
    assert result.exit_code == 0, result.output


def test_idle_since_is_carried_over_while_idle(suite: Path) -> None:
    (suite / "t.test.yaml").write_text("""\
rule_files: [rules/idle.yaml]
tests:
  - name: snapshots every 30 minutes keep the idle clock
    snapshots:
""" + "".join(f"      - {{at: {m}m, node: n1, gpus: [{{index: 0, util_pct: 1}}], "
          f"processes: [{{pid: 1, user: u, gpus: [0]}}]}}\n" for m in range(0, 180, 30)) + """\
    expect:
      - {rule: idle-gpu-2h, entity: n1/gpu0, fires_at: 2h}
""")
    result = runner.invoke(app, ["test", str(suite / "t.test.yaml")])
    assert result.exit_code == 0, result.output


def test_check_cli_reports_located_problems_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULES.replace("gpu.owner", "gpu.ownr"))
    result = runner.invoke(app, ["check", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path}/r.yaml:8: to: gpu has no field 'ownr'; fields: activity_known, allocated, " in result.output


def test_check_cli_accepts_good_rules(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULES)
    result = runner.invoke(app, ["check", str(tmp_path / "r.yaml")])
    assert result.exit_code == 0 and "ok: 1 rule(s) in 1 file(s)" in result.output


DATA = Path(__file__).resolve().parent / "data"


def test_staged_actions_run_after_firing_unless_resolved_and_across_a_restart() -> None:
    result = run_test_file(DATA / "staged.test.yaml")
    assert result.problems == [] and [t.failures for t in result.tests] == [[], [], []]


def test_a_staged_expectation_that_does_not_hold_says_when_the_stage_ran(tmp_path: Path) -> None:
    (tmp_path / "staged.yaml").write_text((DATA / "staged.yaml").read_text())
    (tmp_path / "t.test.yaml").write_text("""\
rule_files: [staged.yaml]
owners: {alice: alice@example.com}
tests:
  - name: wrong time
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 7, user: alice, gpus: [0], age: 1h}]}
    expect:
      - rule: idle-staged
        entity: n1/gpu0
        staged: [{at: 3h, actions: [kill]}]
""")
    [test] = run_test_file(tmp_path / "t.test.yaml").tests
    [failure] = test.failures
    assert "expected a stage at +3h (within one tick); actual: +2h30m" in failure
    assert "expected actions run at the stage at +3h: ['kill']; actual: ['kill', 'slack']" in failure


def test_after_on_an_on_resolve_action_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("""\
rules:
  - name: r
    entity: gpu
    when: gpu.idle
    actions: [{type: log, message: x}]
    on_resolve: [{type: log, message: y, after: 5m}]
""")
    _, problems = check_paths([tmp_path / "r.yaml"])
    assert any("on_resolve[0].after" in str(p) and "r.yaml:6" in str(p) for p in problems)


PER_MODEL = """\
rule_files: [rules/idle.yaml]
config:
  agent:
    thresholds:
      idle_by_model:
        - {model: "*H100*", signal: sm_active, below: 3, power_below_w: 150}
tests:
  - name: a spinning H100 is idle by its SM activity; an A100 by its utilization
    snapshots:
      - at: 0s
        node: n1
        gpus:
          - {index: 0, model: NVIDIA H100 80GB HBM3, util_pct: 99, sm_active_pct: 1, power_w: 120}
          - {index: 1, model: NVIDIA H100 80GB HBM3, util_pct: 99, sm_active_pct: 1, power_w: 400}
          - {index: 2, model: NVIDIA A100-SXM4-80GB, util_pct: 99, sm_active_pct: 1, power_w: 120}
          - {index: 3, model: NVIDIA A100-SXM4-80GB, util_pct: 2}
        processes:
          - {pid: 1, user: alice, gpus: [0], age: 3h}
          - {pid: 2, user: bob, gpus: [1], age: 3h}
          - {pid: 3, user: carol, gpus: [2], age: 3h}
          - {pid: 4, user: dave, gpus: [3], age: 3h}
      - at: 3h
        node: n1
        gpus:
          - {index: 0, model: NVIDIA H100 80GB HBM3, util_pct: 99, sm_active_pct: 1, power_w: 120}
          - {index: 1, model: NVIDIA H100 80GB HBM3, util_pct: 99, sm_active_pct: 1, power_w: 400}
          - {index: 2, model: NVIDIA A100-SXM4-80GB, util_pct: 99, sm_active_pct: 1, power_w: 120}
          - {index: 3, model: NVIDIA A100-SXM4-80GB, util_pct: 2}
        processes:
          - {pid: 1, user: alice, gpus: [0], age: 6h}
          - {pid: 2, user: bob, gpus: [1], age: 6h}
          - {pid: 3, user: carol, gpus: [2], age: 6h}
          - {pid: 4, user: dave, gpus: [3], age: 6h}
    expect:
      - {rule: idle-gpu-2h, entity: n1/gpu0, fires_at: 2h}
      - {rule: idle-gpu-2h, entity: n1/gpu1, never: true}
      - {rule: idle-gpu-2h, entity: n1/gpu2, never: true}
      - {rule: idle-gpu-2h, entity: n1/gpu3, fires_at: 2h}
"""


def test_rule_tests_derive_idle_by_the_gpu_model_s_signal(suite: Path) -> None:
    (suite / "model.test.yaml").write_text(PER_MODEL)
    outcome = run_test_file(suite / "model.test.yaml")
    assert outcome.problems == []
    assert [t.failures for t in outcome.tests] == [[]]


def test_a_notify_text_is_compared_as_people_read_it_not_with_its_marks() -> None:
    result = run_test_file(DATA / "notify.test.yaml")
    assert result.problems == [] and [t.failures for t in result.tests] == [[]]


@pytest.mark.parametrize(("job", "says"), [
    ("{scheduler: kubernetes, namespace: a, pod: p, controller: Deployment, gpus: [0]}", "is not Kind/name"),
    ("{scheduler: kubernetes, namespace: a, controller: Deployment/x, gpus: [0]}", "needs `namespace` and `pod`"),
    ("{id: '7', pod: p, gpus: [0]}", "are for `scheduler: kubernetes` jobs"),
])
def test_a_kubernetes_job_given_wrong_is_located(tmp_path: Path, job: str, says: str) -> None:
    (tmp_path / "r.yaml").write_text((LIBRARY / "kubernetes.yaml").read_text())
    f = tmp_path / "t.test.yaml"
    f.write_text("rule_files: [r.yaml]\ntests:\n  - name: t\n    snapshots:\n      - at: 0s\n        node: n1\n"
                 f"        gpus: [{{index: 0}}]\n        jobs:\n          - {job}\n"
                 "    expect:\n      - {rule: workload-idle-2h, entity: job/kubernetes/a/Pod/p, never: true}\n")
    (problem,) = run_test_file(f).problems
    assert str(problem).startswith(f"{f}:9:") and says in str(problem)
