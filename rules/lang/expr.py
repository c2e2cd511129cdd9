"""Conditions: Jinja2 expression syntax, parsed once by Jinja2 and compiled to one Python function.

The compiler accepts an allow-list of node types, filters, tests, helpers and methods; anything else is a
load error with its location. The generated code does what Jinja2's own code generator emits for the same
tree (the sandbox's `getattr`/`getitem`, Jinja2's filter and test functions), minus the per-call runtime,
so results equal the sandboxed `compile_expression` (a property test compares the two).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, nodes
from jinja2.parser import Parser
from jinja2.runtime import new_context
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import _PassArg

from gpuevents.durations import DurationError, parse_duration
from rules.lang import calendars
from rules.lang.views import (
    FIELDS_OF,
    TIME_FIELDS,
    EntityView,
    EvalClock,
    GpuView,
    NodeView,
    ProcessView,
)

CLOCK_KEY = "$clock"
"""Where a context dict holds its EvalClock."""

CONDITION_ENV = SandboxedEnvironment(undefined=StrictUndefined)
"""Jinja2's sandbox as conditions are defined by: it parses them, and compiled conditions equal its results."""

_VIEW_FIELDS: dict[type, frozenset[str]] = {
    GpuView: FIELDS_OF["gpu"], ProcessView: FIELDS_OF["process"], NodeView: FIELDS_OF["node"],
    EntityView: FIELDS_OF["entity"],
}


class _ConditionEnv(SandboxedEnvironment):
    """The sandbox with a shortcut for a view's public field, which it would reach the long way.

    The sandbox's `getitem(view, "idle")` tries `view["idle"]` (a TypeError: views are not subscriptable),
    then `getattr`, then checks that the value is safe: a public field of a plain object always is. The
    shortcut returns the same value without raising and catching that TypeError (filters like `selectattr`
    and `map(attribute=)` look every item up this way)."""

    def getitem(self, obj: Any, argument: Any) -> Any:
        fields = _VIEW_FIELDS.get(type(obj))
        if fields is not None and type(argument) is str and argument in fields:
            try:
                return getattr(obj, argument)
            except AttributeError:
                pass
        return super().getitem(obj, argument)


_FAST_ENV = _ConditionEnv(undefined=StrictUndefined)
_JCTX = new_context(_FAST_ENV, None, {})

ENTITY_NAMES: dict[str, frozenset[str]] = {
    "gpu": frozenset({"gpu", "node", "entity"}),
    "process": frozenset({"process", "node", "gpus", "entity"}),
    "node": frozenset({"node", "gpus", "entity"}),
}
HELPERS = frozenset({"duration", "is_weekend", "is_workday", "is_holiday", "in_window"})
TIME_HELPERS = frozenset({"is_weekend", "is_workday", "is_holiday", "in_window"})

FILTERS = frozenset({
    "abs", "attr", "count", "d", "default", "first", "float", "int", "join", "last", "length", "list",
    "lower", "map", "max", "min", "reject", "rejectattr", "replace", "round", "select", "selectattr",
    "sort", "string", "sum", "trim", "unique", "upper",
})
TESTS = frozenset({
    "boolean", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge", "gt",
    "greaterthan", "in", "integer", "iterable", "le", "lower", "lt", "lessthan", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper",
})
METHODS = frozenset({
    "startswith", "endswith", "lower", "upper", "strip", "split", "get", "keys", "values", "items",
    "weekday", "isoweekday", "date", "time", "isoformat",
})
_UNSAFE_ATTRS = frozenset({"mro", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_code", "ag_frame", "format", "format_map"})
_BINOPS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "Mod": "%", "Pow": "**"}
_CMP = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in", "notin": "not in"}
_CONST_TYPES = (int, float, str, bool, type(None))
_MISS = object()


class ExprError(ValueError):
    """An expression that does not compile; `line` is 1-based within the expression."""

    def __init__(self, message: str, line: int = 1) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Condition:
    """A compiled `when`: `test(ctx)` is its truth (raises on an evaluation error), `value(ctx)` its value."""

    source: str
    test: Callable[[Mapping[str, Any]], bool]
    value: Callable[[Mapping[str, Any]], Any]
    time_dependent: bool
    names: frozenset[str]
    python: str


def parse_expression(source: str) -> nodes.Expr:
    """Jinja2's own parse of one expression (what `compile_expression` does)."""
    try:
        parser = Parser(CONDITION_ENV, source, state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            tok = parser.stream.current
            raise TemplateSyntaxError(f"unexpected {tok.value!r} after the expression", tok.lineno, None, None)
    except TemplateSyntaxError as e:
        raise ExprError(f"syntax error: {e.message}", e.lineno) from None
    return expr


_DICT_ATTRS = frozenset(dir(dict))


def _getattr(obj: Any, name: str) -> Any:
    """The sandbox's getattr: the attribute, else the item, else undefined."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    try:
        return obj[name]
    except (TypeError, LookupError):
        return CONDITION_ENV.undefined(obj=obj, name=name)


def _getattr_mapping(obj: Any, name: str) -> Any:
    """`_getattr` with a fast path for a dict and a name that is no dict attribute (`labels.env`)."""
    if type(obj) is dict:
        value = obj.get(name, _MISS)
        return value if value is not _MISS else CONDITION_ENV.undefined(obj=obj, name=name)
    return _getattr(obj, name)


def _u2n(value: Any) -> Any:
    return None if isinstance(value, Undefined) else value


def _str_join(seq: tuple[Any, ...]) -> str:
    return "".join(map(str, seq))


def _select_attr(value: Any, attr: str, keep: bool) -> Iterator[Any]:
    """`selectattr(attr)` (keep) / `rejectattr(attr)`: Jinja2's `select_or_reject` with no test, unrolled."""
    if value:
        get = _FAST_ENV.getitem
        for item in value:
            if bool(get(item, attr)) is keep:
                yield item


def _select(value: Any, keep: bool) -> Iterator[Any]:
    """`select` (keep) / `reject` with no test: Jinja2's `select_or_reject`, unrolled."""
    if value:
        for item in value:
            if bool(item) is keep:
                yield item


def _map_attr(value: Any, attr: str) -> Iterator[Any]:
    """`map(attribute=attr)`: Jinja2's `sync_do_map` with an attribute and no default, unrolled."""
    if value:
        get = _FAST_ENV.getitem
        for item in value:
            yield get(item, attr)


def _simple_attr(node: nodes.Node) -> bool:
    """A constant attribute name Jinja2 looks up in one step (no dots, not an index)."""
    return (
        isinstance(node, nodes.Const) and type(node.value) is str and "." not in node.value
        and not node.value.isdigit()
    )


class _Compiler:
    def __init__(self, kind: str, tz: tzinfo) -> None:
        self.names = ENTITY_NAMES[kind] | {"now"}
        self.tz = tz
        self.ns: dict[str, Any] = {
            "_ga": _getattr,
            "_gad": _getattr_mapping,
            "_gi": _FAST_ENV.getitem,
            "_env": _FAST_ENV,
            "_selattr": _select_attr,
            "_sel": _select,
            "_mapattr": _map_attr,
            "_Undefined": Undefined,
            "_jctx": _JCTX,
            "_u2n": _u2n,
            "_join": _str_join,
            "_tz": tz,
            "_cal": calendars,
        }
        self.used: set[str] = set()
        self.time = False
        self._n = 0

    def bind(self, value: Any) -> str:
        self._n += 1
        name = f"_k{self._n}"
        self.ns[name] = value
        return name

    def tmp(self) -> str:
        self._n += 1
        return f"_t{self._n}"

    def fail(self, node: nodes.Node, message: str) -> ExprError:
        return ExprError(message, node.lineno or 1)

    def visit(self, node: nodes.Node) -> str:
        method = getattr(self, f"v_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"unsupported syntax in a condition: {type(node).__name__}")
        return method(node)  # type: ignore[no-any-return]

    def v_Const(self, node: nodes.Const) -> str:
        if not isinstance(node.value, _CONST_TYPES):
            raise self.fail(node, f"unsupported constant {node.value!r}")
        return self.bind(node.value)

    def v_Name(self, node: nodes.Name) -> str:
        name = node.name
        if name in HELPERS:
            raise self.fail(node, f"{name} is a helper; call it, like {name}(...)")
        if name not in self.names:
            known = ", ".join(sorted(self.names | HELPERS))
            raise self.fail(node, f"unknown name {name!r} in the condition; names in scope: {known}")
        self.used.add(name)
        if name == "now":
            self.time = True
            return "_clk.local(_tz)"
        return f"v_{name}"

    def v_Getattr(self, node: nodes.Getattr) -> str:
        attr = node.attr
        if attr.startswith("_") or attr in _UNSAFE_ATTRS:
            raise self.fail(node, f"attribute {attr!r} is not allowed")
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS_OF:
            fields = FIELDS_OF[node.node.name]
            if node.node.name in self.names and attr not in fields:
                raise self.fail(
                    node, f"{node.node.name} has no field {attr!r}; fields: {', '.join(sorted(fields))}"
                )
        if attr in TIME_FIELDS or attr.endswith("_for_s"):
            self.time = True
        obj = self.visit(node.node)
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS_OF:
            return f"{obj}.{attr}"  # a view's field, checked above: plain attribute access
        if attr in _DICT_ATTRS:
            return f"_ga({obj}, {attr!r})"
        return f"_gad({obj}, {attr!r})"

    def v_Getitem(self, node: nodes.Getitem) -> str:
        if isinstance(node.arg, nodes.Slice):
            raise self.fail(node, "slices are not supported in conditions")
        return f"_gi({self.visit(node.node)}, {self.visit(node.arg)})"

    def v_Compare(self, node: nodes.Compare) -> str:
        parts = [self.visit(node.expr)]
        for op in node.ops:
            parts.append(_CMP[op.op])
            parts.append(self.visit(op.expr))
        return "(" + " ".join(parts) + ")"

    def v_And(self, node: nodes.And) -> str:
        return f"({self.visit(node.left)} and {self.visit(node.right)})"

    def v_Or(self, node: nodes.Or) -> str:
        return f"({self.visit(node.left)} or {self.visit(node.right)})"

    def v_Not(self, node: nodes.Not) -> str:
        return f"(not {self.visit(node.node)})"

    def v_Neg(self, node: nodes.Neg) -> str:
        return f"(-{self.visit(node.node)})"

    def v_Pos(self, node: nodes.Pos) -> str:
        return f"(+{self.visit(node.node)})"

    def _binop(self, node: nodes.BinExpr) -> str:
        return f"({self.visit(node.left)} {_BINOPS[type(node).__name__]} {self.visit(node.right)})"

    v_Add = v_Sub = v_Mul = v_Div = v_FloorDiv = v_Mod = v_Pow = _binop

    def v_Concat(self, node: nodes.Concat) -> str:
        return "_join((" + ", ".join(self.visit(n) for n in node.nodes) + ",))"

    def v_CondExpr(self, node: nodes.CondExpr) -> str:
        if node.expr2 is None:
            msg = self.bind("the inline if-expression evaluated to false and no else section was defined.")
            other = f"_Undefined({msg})"  # what Jinja2 emits: the lenient Undefined, whatever the environment's
        else:
            other = self.visit(node.expr2)
        return f"({self.visit(node.expr1)} if {self.visit(node.test)} else {other})"

    def v_List(self, node: nodes.List) -> str:
        return "[" + ", ".join(self.visit(n) for n in node.items) + "]"

    def v_Tuple(self, node: nodes.Tuple) -> str:
        return "(" + "".join(self.visit(n) + ", " for n in node.items) + ")"

    def v_Dict(self, node: nodes.Dict) -> str:
        return "{" + ", ".join(f"{self.visit(p.key)}: {self.visit(p.value)}" for p in node.items) + "}"

    def _signature(self, node: nodes.Filter | nodes.Test | nodes.Call) -> str:
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            raise self.fail(node, "*args and **kwargs are not supported in conditions")
        args = [self.visit(a) for a in node.args]
        for kw in node.kwargs:
            if not isinstance(kw.key, str) or not kw.key.isidentifier():
                raise self.fail(node, f"bad keyword {kw.key!r}")
            args.append(f"{kw.key}={self.visit(kw.value)}")
        return ", ".join(args)

    def _filter_or_test(self, node: nodes.Filter | nodes.Test, table: Mapping[str, Any], allowed: frozenset[str], what: str) -> str:
        if node.name not in allowed or node.name not in table:
            raise self.fail(node, f"{what} {node.name!r} is not available in conditions; available: {', '.join(sorted(allowed))}")
        func = table[node.name]
        fn = self.bind(func)
        pass_arg = _PassArg.from_obj(func)
        first = {
            _PassArg.context: "_jctx, ",
            _PassArg.eval_context: "_jctx.eval_ctx, ",
            _PassArg.environment: "_env, ",
        }.get(pass_arg, "") if pass_arg is not None else ""
        assert node.node is not None
        sig = self._signature(node)
        return f"{fn}({first}{self.visit(node.node)}{', ' + sig if sig else ''})"

    def v_Filter(self, node: nodes.Filter) -> str:
        fast = self._fast_filter(node)
        if fast is not None:
            return fast
        return self._filter_or_test(node, _FAST_ENV.filters, FILTERS, "filter")

    def _fast_filter(self, node: nodes.Filter) -> str | None:
        """The common filters with their usual arguments as direct Python, with Jinja2's exact semantics."""
        if node.node is None or node.dyn_args is not None or node.dyn_kwargs is not None:
            return None
        name, args, kwargs = node.name, node.args, node.kwargs
        if name == "list" and not args and not kwargs:
            return f"list({self.visit(node.node)})"
        if name in ("select", "reject") and not args and not kwargs:
            return f"_sel({self.visit(node.node)}, {name == 'select'})"
        if name in ("selectattr", "rejectattr") and len(args) == 1 and not kwargs and _simple_attr(args[0]):
            assert isinstance(args[0], nodes.Const)
            return f"_selattr({self.visit(node.node)}, {args[0].value!r}, {name == 'selectattr'})"
        if (
            name == "map" and not args and len(kwargs) == 1 and kwargs[0].key == "attribute"
            and _simple_attr(kwargs[0].value)
        ):
            value = kwargs[0].value
            assert isinstance(value, nodes.Const)
            return f"_mapattr({self.visit(node.node)}, {value.value!r})"
        return None

    def v_Test(self, node: nodes.Test) -> str:
        return self._filter_or_test(node, _FAST_ENV.tests, TESTS, "test")

    def v_Call(self, node: nodes.Call) -> str:
        target = node.node
        if isinstance(target, nodes.Name) and target.name in HELPERS:
            return self._helper(node, target.name)
        if isinstance(target, nodes.Getattr) and target.attr in METHODS:
            obj = self.visit(target.node)
            return f"_ga({obj}, {target.attr!r})({self._signature(node)})"
        if isinstance(target, nodes.Name):
            raise self.fail(node, f"unknown function {target.name!r}; functions: {', '.join(sorted(HELPERS))}")
        if isinstance(target, nodes.Getattr):
            raise self.fail(node, f"method {target.attr!r} is not available; available: {', '.join(sorted(METHODS))}")
        raise self.fail(node, f"only helpers ({', '.join(sorted(HELPERS))}) and string/dict methods can be called")

    def _const_arg(self, node: nodes.Call, name: str, count: int) -> list[Any]:
        if node.kwargs or node.dyn_args or node.dyn_kwargs or len(node.args) != count:
            want = "no arguments" if count == 0 else f"{count} argument"
            raise self.fail(node, f"{name}() takes {want}")
        out = []
        for a in node.args:
            if not isinstance(a, nodes.Const) or not isinstance(a.value, str):
                raise self.fail(node, f"{name}() takes a quoted string, like {name}('...')")
            out.append(a.value)
        return out

    def _helper(self, node: nodes.Call, name: str) -> str:
        if name == "duration":
            (text,) = self._const_arg(node, name, 1)
            try:
                return self.bind(parse_duration(text))
            except DurationError as e:
                raise self.fail(node, f"duration({text!r}): {e}") from None
        self.time = True
        if name == "is_weekend":
            self._const_arg(node, name, 0)
            return "(_clk.local(_tz).weekday() >= 5)"
        (arg,) = self._const_arg(node, name, 1)
        try:
            if name == "in_window":
                window = self.bind(calendars.parse_window(arg))
                return f"{window}.contains(_clk.utc, _tz)"
            calendars.country_calendar(arg)
        except calendars.CalendarError as e:
            raise self.fail(node, str(e)) from None
        return f"_cal.{name}({self.bind(arg)}, _clk.local(_tz).date())"


def compile_condition(source: str, kind: str, tz: tzinfo) -> Condition:
    """Compile `source` for entities of `kind`, evaluated in zone `tz`. Raises ExprError."""
    if not isinstance(source, str) or not source.strip():
        raise ExprError("must be an expression, like gpu.idle and gpu.processes")
    tree = parse_expression(source)
    c = _Compiler(kind, tz)
    body = c.visit(tree)
    prelude = "".join(f"    v_{n} = ctx[{n!r}]\n" for n in sorted(c.used - {"now"}))
    if c.time:
        prelude += f"    _clk = ctx[{CLOCK_KEY!r}]\n"
    code = (
        f"def _test(ctx):\n{prelude}    return True if {body} else False\n"
        f"def _value(ctx):\n{prelude}    return _u2n({body})\n"
    )
    exec(compile(code, f"<when: {source[:60]}>", "exec"), c.ns)
    return Condition(
        source=source,
        test=c.ns["_test"],
        value=c.ns["_value"],
        time_dependent=c.time,
        names=frozenset(c.used),
        python=code,
    )


def jinja_names(ctx: Mapping[str, Any], tz: tzinfo) -> dict[str, Any]:
    """The same context as Jinja2 names (with helpers as callables), for `compile_expression` and templates."""
    clock: EvalClock = ctx[CLOCK_KEY]
    out = {k: v for k, v in ctx.items() if k != CLOCK_KEY}
    day = clock.local(tz).date()
    out.update(
        now=clock.local(tz),
        duration=parse_duration,
        is_weekend=lambda: day.weekday() >= 5,
        is_workday=lambda country: calendars.is_workday(country, day),
        is_holiday=lambda country: calendars.is_holiday(country, day),
        in_window=lambda spec: calendars.in_window(spec, clock.utc, tz),
    )
    return out
