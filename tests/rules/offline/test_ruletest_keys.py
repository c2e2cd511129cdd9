"""Rule-test keys of DESIGN §4 for limits and restarts: `config:`, outcomes, `resolve_actions`, `restarts`."""

from __future__ import annotations

from pathlib import Path

from rules.offline.ruletests import run_test_file

RULES = """\
rules:
  - name: idle-kill
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 10m
    limits: {max_per_hour: 2}
    actions:
      - {type: kill}
      - {type: slack, to: "{{ gpu.owner }}", text: "idle"}
    on_resolve:
      - {type: log, message: "back to work"}
"""


def run(tmp_path: Path, tests: str, config: str = "") -> list[str]:
    (tmp_path / "rules.yaml").write_text(RULES)
    f = tmp_path / "t.test.yaml"
    f.write_text(f"rule_files: [rules.yaml]\n{config}tests:\n{tests}")
    outcome = run_test_file(f)
    assert not outcome.invalid, outcome.problems
    return [failure for t in outcome.tests for failure in t.failures]


TWO_GPUS = """\
      - at: 0s
        node: n1
        gpus: [{index: 0}, {index: 1}]
        processes: [{pid: 1, user: alice, gpus: [0]}, {pid: 2, user: bob, gpus: [1]}]
"""


def test_config_protection_refuses_and_outcomes_say_so(tmp_path: Path) -> None:
    failures = run(tmp_path, """\
  - name: bob is protected
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 1}], processes: [{pid: 2, user: bob, gpus: [1]}]}
    expect:
      - rule: idle-kill
        entity: n1/gpu1
        fires_at: 10m
        actions: [{type: kill, outcome: refused}, slack]
""", config="config:\n  protect: {users: [bob]}\n")
    assert failures == []
    failures = run(tmp_path, """\
  - name: without the protection the kill runs
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 1}], processes: [{pid: 2, user: bob, gpus: [1]}]}
    expect:
      - {rule: idle-kill, entity: n1/gpu1, actions: [{type: kill, outcome: refused}, slack]}
""")
    assert len(failures) == 1 and "expected actions run at the first firing: ['slack']; actual: ['kill', 'slack']" \
        in failures[0]


def test_an_outcome_that_did_not_happen_fails_the_test(tmp_path: Path) -> None:
    failures = run(tmp_path, f"""\
  - name: nothing is refused here
    snapshots:
{TWO_GPUS}    expect:
      - rule: idle-kill
        entity: n1/gpu0
        actions: [{{type: kill, outcome: refused}}, slack]
""")
    assert len(failures) == 1 and "expected a kill decided refused at the first firing" in failures[0]


def test_dry_run_from_config_counts_as_run(tmp_path: Path) -> None:
    failures = run(tmp_path, f"""\
  - name: dry run
    snapshots:
{TWO_GPUS}    expect:
      - {{rule: idle-kill, entity: n1/gpu0, actions: [kill, slack]}}
""", config="config:\n  engine: {dry_run: true}\n")
    assert failures == []


def test_limits_hold_across_a_restart(tmp_path: Path) -> None:
    failures = run(tmp_path, """\
  - name: a restart does not reset the hour
    restarts: [15m]
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 1, user: alice, gpus: [0]}]}
      - {at: 20m, node: n1, gpus: [{index: 0}, {index: 1}],
         processes: [{pid: 1, user: alice, gpus: [0]}, {pid: 2, user: alice, gpus: [1]}]}
    expect:
      - {rule: idle-kill, entity: n1/gpu0, fires_at: 10m, count: 1}
      - rule: idle-kill
        entity: n1/gpu1
        fires_at: 30m
        actions: [{type: kill, outcome: suppressed}, {type: slack, outcome: suppressed}]
""")
    assert failures == []


def test_a_pending_for_keeps_its_start_across_a_restart(tmp_path: Path) -> None:
    failures = run(tmp_path, """\
  - name: restarted in the middle of for
    restarts: [5m]
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 1, user: alice, gpus: [0]}]}
    expect:
      - {rule: idle-kill, entity: n1/gpu0, fires_at: 10m, count: 1}
""")
    assert failures == []


def test_resolve_actions_are_checked_at_the_first_resolution(tmp_path: Path) -> None:
    failures = run(tmp_path, """\
  - name: back to work
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 1, user: alice, gpus: [0]}]}
      - {at: 20m, node: n1, gpus: [{index: 0, util_pct: 90}], processes: [{pid: 1, user: alice, gpus: [0]}]}
    expect:
      - rule: idle-kill
        entity: n1/gpu0
        resolves_at: 20m
        resolve_actions: [{type: log, message: back to work}]
""")
    assert failures == []
    failures = run(tmp_path, """\
  - name: wrong resolve action
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0}], processes: [{pid: 1, user: alice, gpus: [0]}]}
      - {at: 20m, node: n1, gpus: [{index: 0, util_pct: 90}], processes: [{pid: 1, user: alice, gpus: [0]}]}
    expect:
      - {rule: idle-kill, entity: n1/gpu0, resolve_actions: [slack]}
""")
    assert len(failures) == 1 and "at the first resolution" in failures[0]


def test_an_expectation_at_the_very_end_of_the_run_is_observed(tmp_path: Path) -> None:
    """A rule without `for` on a 30 s tick: the run must last a tick past the last expected instant."""
    (tmp_path / "rules.yaml").write_text("""\
rules:
  - name: hot
    entity: gpu
    when: gpu.temp_c > 85
    actions: [{type: log, message: hot}]
""")
    f = tmp_path / "t.test.yaml"
    f.write_text("""\
rule_files: [rules.yaml]
tests:
  - name: the last instant
    snapshots:
      - {at: 0s, node: n1, gpus: [{index: 0, temp_c: 90}]}
    expect:
      - {rule: hot, entity: n1/gpu0, fires_at: 0s}
""")
    outcome = run_test_file(f)
    assert outcome.passed, [t.failures for t in outcome.tests]


def test_an_unknown_config_section_is_a_located_error(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    f = tmp_path / "t.test.yaml"
    f.write_text("rule_files: [rules.yaml]\nconfig:\n  nats: {url: 'nats://x'}\ntests:\n  - name: x\n")
    outcome = run_test_file(f)
    assert outcome.invalid and str(outcome.problems[0]).startswith(f"{f}:3: config.nats")
