"""The condition compiler: allow-list, names, time dependence, and equality with Jinja2's own evaluation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.exceptions import UndefinedError

from rules.lang.expr import CLOCK_KEY, CONDITION_ENV, ExprError, compile_condition, jinja_names
from rules.lang.views import EntityView, EvalClock, GpuView, NodeView, ProcessView
from tests.quick import examples

UTC_TZ = ZoneInfo("UTC")
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def gpu_ctx(**gpu: Any) -> dict[str, Any]:
    clock = EvalClock(NOW)
    proc = ProcessView(clock, id="n1/pid7", node="n1", pid=7, name="train.py", user="alice", owner="alice",
                       create_time=NOW - timedelta(hours=30), gpus=[0], labels={}, gpu_mem_mib=100.0)
    fields: dict[str, Any] = dict(id="n1/gpu0", node="n1", index=0, util_pct=0.0, mem_used_mib=1000.0,
                                  temp_c=50.0, idle=True, idle_since=NOW - timedelta(hours=3), processes=[proc],
                                  owners=["alice"], owner="alice", pids=[7], model="H100")
    fields.update(gpu)
    g = GpuView(clock, **fields)
    n = NodeView(id="n1", name="n1", cluster="default", labels={"env": "dev", "team": "ml"}, gpu_count=8,
                 gpus_busy=7, gpus_idle=1, online=True)
    return {"gpu": g, "node": n, "entity": EntityView("n1/gpu0", "gpu", "n1", "default"), CLOCK_KEY: clock}


def test_simple_condition_is_true_and_false() -> None:
    c = compile_condition("gpu.idle and gpu.processes", "gpu", UTC_TZ)
    assert c.test(gpu_ctx()) is True
    assert c.test(gpu_ctx(idle=False)) is False
    assert c.test(gpu_ctx(processes=[])) is False


def test_idle_for_s_is_measured_at_evaluation_time() -> None:
    c = compile_condition("gpu.idle_for_s >= duration('2h')", "gpu", UTC_TZ)
    ctx = gpu_ctx(idle_since=NOW - timedelta(hours=1))
    assert c.test(ctx) is False
    ctx[CLOCK_KEY].set(NOW + timedelta(hours=1))
    assert c.test(ctx) is True


@pytest.mark.parametrize(
    ("source", "time_dependent"),
    [
        ("gpu.idle", False),
        ("gpu.idle_for_s > 10", True),
        ("node.labels.env == 'dev'", False),
        ("now.hour > 20", True),
        ("is_weekend()", True),
        ("is_workday('CN')", True),
        ("in_window('Mon-Fri 07:30-20:30')", True),
        ("gpu.temp_c > duration('1m')", False),
    ],
)
def test_time_dependence_is_known_at_compile_time(source: str, time_dependent: bool) -> None:
    assert compile_condition(source, "gpu", UTC_TZ).time_dependent is time_dependent


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("proces.age_s > 3", "unknown name 'proces'"),
        ("process.age_s > 3", "unknown name 'process'"),  # not in scope of a gpu rule
        ("gpu.idel", "gpu has no field 'idel'"),
        ("gpu.__class__", "not allowed"),
        ("node.labels.mro", "not allowed"),
        ("gpu.idle and (", "syntax error"),
        ("gpu.idle gpu.idle", "syntax error"),
        ("[x for x in gpu.pids]", "syntax error"),
        ("gpu.idle | tojson", "filter 'tojson' is not available"),
        ("gpu.idle is callable", "test 'callable' is not available"),
        ("gpu.model.format('x')", "method 'format' is not available"),
        ("duration('two hours')", "duration('two hours')"),
        ("duration", "is a helper; call it"),
        ("in_window('Mon-Fri 07:30-25:00')", "is not a time of day"),
        ("is_workday('XX')", "unknown country"),
        ("is_workday(node.name)", "takes a quoted string"),
        ("", "must be an expression"),
    ],
)
def test_compile_errors_say_what_is_wrong(source: str, message: str) -> None:
    with pytest.raises(ExprError) as e:
        compile_condition(source, "gpu", UTC_TZ)
    assert message in str(e.value)


def test_a_missing_attribute_raises_when_evaluated_so_the_core_counts_it_false() -> None:
    c = compile_condition("node.labels.tier == 'prod'", "gpu", UTC_TZ)
    with pytest.raises(UndefinedError):
        c.test(gpu_ctx())


def test_defined_and_default_see_missing_labels_as_jinja_does() -> None:
    assert compile_condition("node.labels.tier is not defined", "gpu", UTC_TZ).test(gpu_ctx())
    assert compile_condition("node.labels.tier | default('x') == 'x'", "gpu", UTC_TZ).test(gpu_ctx())
    assert compile_condition("node.labels.get('tier', 'none') == 'none'", "gpu", UTC_TZ).test(gpu_ctx())


def test_filters_methods_and_tests_from_the_allow_list() -> None:
    ctx = gpu_ctx()
    assert compile_condition("gpu.processes | map(attribute='name') | join(',') == 'train.py'", "gpu", UTC_TZ).test(ctx)
    assert compile_condition("gpu.processes | selectattr('age_s', 'gt', 86400) | list | length == 1", "gpu",
                             UTC_TZ).test(ctx)
    assert compile_condition("gpu.model.lower().startswith('h1')", "gpu", UTC_TZ).test(ctx)
    assert compile_condition("gpu.temp_c is number and gpu.mig_parent is none", "gpu", UTC_TZ).test(ctx)
    assert compile_condition("'alice' in gpu.owners and 7 in gpu.pids", "gpu", UTC_TZ).test(ctx)


def test_calendar_helpers_use_the_rules_timezone() -> None:
    # 2026-01-09 23:30 UTC is already Saturday in Shanghai.
    ctx = gpu_ctx()
    ctx[CLOCK_KEY].set(datetime(2026, 1, 9, 23, 30, tzinfo=UTC))
    assert compile_condition("is_weekend()", "gpu", ZoneInfo("Asia/Shanghai")).test(ctx)
    assert not compile_condition("is_weekend()", "gpu", UTC_TZ).test(ctx)
    assert compile_condition("now.weekday() == 5 and now.hour == 7", "gpu", ZoneInfo("Asia/Shanghai")).test(ctx)


# ---------------------------------------------------------------- property: compiled == Jinja2


NUMBER_FIELDS = ["util_pct", "temp_c", "mem_used_mib", "index", "idle_for_s"]
STR_VALUES = ["dev", "prod", "", "ml"]


def _atom() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([f"gpu.{f}" for f in NUMBER_FIELDS]),
        st.sampled_from(["gpu.idle", "gpu.processes", "gpu.owner", "gpu.model", "gpu.mig_parent", "node.online",
                         "node.labels.env", "node.labels.team", "node.labels.missing", "gpu.owners",
                         "entity.kind", "node.gpu_count"]),
        st.integers(-3, 100).map(str),
        st.floats(-10, 100, allow_nan=False).map(lambda x: repr(round(x, 2))),
        st.sampled_from([repr(s) for s in STR_VALUES]),
        st.sampled_from(["true", "false", "none"]),
    )


SEQUENCES = ["gpu.processes", "(gpu.processes + gpu.processes)", "[gpu, gpu]", "[node, gpu, entity]", "gpu.owners",
             "gpu.pids", "[1, 0, none, 'x', '']", "node.labels", "'ab'", "gpu.owner", "[]", "gpu.idle"]
SEQ_FILTERS = ["selectattr('idle')", "rejectattr('idle')", "selectattr('owner')", "rejectattr('pod')",
               "selectattr('pod')", "selectattr('missing')", "selectattr('keys')", "selectattr('a.b')",
               "selectattr('0')", "selectattr('idle', 'true')", "map(attribute='pid')", "map(attribute='owner')",
               "map(attribute='missing')", "map(attribute='0')", "map(attribute='owner', default='x')", "map('lower')",
               "select", "reject", "select('none')", "list"]
SEQ_ENDS = ["list", "list | length", "length", "first", "join(',')", "count", "sort | list", "unique | list"]


def _seq_expr() -> st.SearchStrategy[str]:
    """Sequences through the filters that have fast paths (and some that do not), ended by a consumer."""
    chain = st.lists(st.sampled_from(SEQ_FILTERS), min_size=1, max_size=2)
    return st.tuples(st.sampled_from(SEQUENCES), chain, st.sampled_from(SEQ_ENDS)).map(
        lambda t: "(" + " | ".join([t[0], *t[1], t[2]]) + ")"
    )


def _expr(depth: int = 3) -> st.SearchStrategy[str]:
    if depth == 0:
        return st.one_of(_atom(), _seq_expr())
    sub = _expr(depth - 1)
    return st.one_of(
        _atom(),
        _seq_expr(),
        st.tuples(sub, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
                  sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["and", "or"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "//", "%", "~"]),
                  sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        sub.map(lambda s: f"(not {s})"),
        sub.map(lambda s: f"(-{s})"),
        st.tuples(sub, st.sampled_from(["in", "not in"]),
                  st.sampled_from(["gpu.owners", "gpu.pids", "[1, 'dev', none]",
                                   "'developer'"])).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, sub, sub).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]} if {t[1]})"),
        st.tuples(sub, st.sampled_from(["length", "lower", "upper", "abs", "int", "float", "round", "string",
                                         "default('d')", "first", "count"])).map(lambda t: f"({t[0]} | {t[1]})"),
        st.tuples(sub,
                  st.sampled_from(["defined", "undefined", "none", "number", "string", "even",
                                   "true"])).map(lambda t: f"({t[0]} is {t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"[{t[0]}, {t[1]}]"),
    )


CONTEXT_PARAMS = st.tuples(
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
    st.one_of(st.none(), st.integers(20, 95)),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from(["alice", "bob"])),
    st.one_of(st.none(), st.sampled_from(["H100", "A100"])),
    st.booleans(),
)


def _context(params: tuple[Any, ...]) -> dict[str, Any]:
    util, temp, idle, owner, model, procs = params
    ctx = gpu_ctx(util_pct=util, temp_c=temp, idle=idle, owner=owner, model=model)
    if not procs:
        ctx["gpu"].processes = []
    return ctx


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        value = fn()
    except Exception as e:
        return ("error", type(e).__name__)
    try:
        truth = bool(value)
    except Exception as e:
        return ("error", type(e).__name__)
    if isinstance(value, float) and value != value:
        return ("nan", None)
    return ("value", (truth, repr(value)))


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=_expr(), params=CONTEXT_PARAMS)
def test_compiled_conditions_equal_jinja2_compile_expression(source: str, params: tuple[Any, ...]) -> None:
    ctx = _context(params)
    compiled = compile_condition(source, "gpu", UTC_TZ)
    jinja = CONDITION_ENV.compile_expression(source)
    names = jinja_names(ctx, UTC_TZ)
    ours = _outcome(lambda: compiled.value(ctx))
    theirs = _outcome(lambda: jinja(**names))
    assert ours == theirs, compiled.python
    # The truth the core uses: an error counts as false, like a false value.
    try:
        truth = compiled.test(ctx)
    except Exception:
        truth = False
    assert truth == (theirs[0] == "value" and theirs[1][0])
