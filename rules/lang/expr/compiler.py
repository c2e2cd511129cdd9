"""The condition compiler: a Jinja2 expression tree, checked against the allow-list, as one Python function.

The generated code does what Jinja2's own code generator emits for the same tree (the sandbox's
`getattr`/`getitem`, Jinja2's filter and test functions), minus the per-call runtime, so results equal the
sandboxed `compile_expression` (a property test compares the two). The compiler also finds whether a
condition depends on the time (`now`, a calendar helper, an `*_for_s` or other time field).
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from jinja2 import Undefined, nodes
from jinja2.utils import _PassArg

from gpuevents.durations import DurationError, parse_duration
from rules.lang import calendars
from rules.lang.expr import runtime as rt
from rules.lang.expr.names import (
    CLOCK_KEY,
    ENTITY_NAMES,
    FILTERS,
    HELPERS,
    MAX_DEPTH,
    METHODS,
    TESTS,
    UNSAFE_ATTRS,
    ExprError,
    parse_expression,
)
from rules.lang.views import DERIVED_READS, FIELDS_OF, TIME_FIELDS

_BINOPS = {"Div": "/", "FloorDiv": "//"}
_BOUNDED_BINOPS = {"Add": "_add", "Sub": "_sub", "Mul": "_mul", "Mod": "_mod", "Pow": "_pow"}
"""Operators that can build large values or read datetimes: they go through the runtime's bounded versions."""
_NAMED_ARG = {"map": (FILTERS, 0), "select": (TESTS, 0), "reject": (TESTS, 0), "selectattr": (TESTS, 1),
              "rejectattr": (TESTS, 1)}
"""Filters that take another filter's or test's name as a positional argument (and which position)."""
_ATTRIBUTE_ARG: dict[str, int | None] = {"attr": 0, "selectattr": 0, "rejectattr": 0, "map": None, "sort": None,
                                         "groupby": 0, "sum": None, "join": None, "unique": None, "min": None,
                                         "max": None}
"""Filters that read a field named by a string: positional index, or None for the `attribute=` keyword only."""
_OWN_FILTERS = {"replace": rt.replace_filter, "join": rt.join_filter, "string": rt.string_filter,
                "sum": rt.sum_filter}
"""Filters replaced by bounded versions with Jinja2's results (no autoescape in conditions)."""
_CMP = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in", "notin": "not in"}
_CONST_TYPES = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class Condition:
    """A compiled `when`: `test(ctx)` is its truth (raises on an evaluation error), `value(ctx)` its value."""

    source: str
    test: Callable[[Mapping[str, Any]], bool]
    value: Callable[[Mapping[str, Any]], Any]
    time_dependent: bool
    names: frozenset[str]
    python: str
    reads: frozenset[str] | None = None
    """Every field name the condition may read (attributes, names given as strings to filters); None when it
    cannot tell (a name worked out at evaluation time). A change to other fields cannot change its result."""


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
            "_ga": rt.sandbox_getattr,
            "_gad": rt.getattr_mapping,
            "_gi": rt.FAST_ENV.getitem,
            "_env": rt.FAST_ENV,
            "_selattr": rt.select_attr,
            "_sel": rt.select,
            "_mapattr": rt.map_attr,
            "_Undefined": Undefined,
            "_jctx": rt.JINJA_CONTEXT,
            "_u2n": rt.undefined_to_none,
            "_join": rt.str_join,
            "_add": rt.add,
            "_sub": rt.sub,
            "_mul": rt.mul,
            "_mod": rt.mod,
            "_pow": rt.power,
            "_call": rt.call_method,
            "_range": rt.safe_range,
            "_tz": tz,
            "_cal": calendars,
        }
        self.used: set[str] = set()
        self.reads: set[str] = set()
        self.reads_unknown = False
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
        method: Callable[[nodes.Node], str] | None = getattr(self, f"v_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"unsupported syntax in a condition: {type(node).__name__}")
        return method(node)

    def v_Const(self, node: nodes.Const) -> str:
        if not isinstance(node.value, _CONST_TYPES):
            raise self.fail(node, f"unsupported constant {node.value!r}")
        if type(node.value) is str:
            self.note_field_name(node.value)
        return self.bind(node.value)

    def note_field_name(self, name: str) -> None:
        """A string that may name a field (`map(attribute='age_s')`, `x['idle_for_s']`): a time field read this
        way makes the condition time-dependent too."""
        for part in name.split("."):
            self.reads.add(part)
            self.reads |= DERIVED_READS.get(part, frozenset())
            if part in TIME_FIELDS or part.endswith("_for_s"):
                self.time = True

    def v_Name(self, node: nodes.Name) -> str:
        name = node.name
        if name in HELPERS:
            raise self.fail(node, f"{name} is a helper; call it, like {name}(...)")
        if name not in self.names:
            known = ", ".join(sorted(self.names | HELPERS))
            raise self.fail(node, f"unknown name {name!r} in the condition; names in scope: {known}")
        self.used.add(name)
        self.reads.add(name)
        if name == "now":
            self.time = True
            return "_clk.local(_tz)"
        return f"v_{name}"

    def v_Getattr(self, node: nodes.Getattr) -> str:
        attr = node.attr
        if attr.startswith("_") or attr in UNSAFE_ATTRS:
            raise self.fail(node, f"attribute {attr!r} is not allowed")
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS_OF:
            fields = FIELDS_OF[node.node.name]
            if node.node.name in self.names and attr not in fields:
                raise self.fail(
                    node, f"{node.node.name} has no field {attr!r}; fields: {', '.join(sorted(fields))}"
                )
        if attr in TIME_FIELDS or attr.endswith("_for_s"):
            self.time = True
        self.reads.add(attr)
        self.reads |= DERIVED_READS.get(attr, frozenset())
        obj = self.visit(node.node)
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS_OF:
            return f"{obj}.{attr}"  # a view's field, checked above: plain attribute access
        if attr in rt.DICT_ATTRS:
            return f"_ga({obj}, {attr!r})"
        return f"_gad({obj}, {attr!r})"

    def v_Getitem(self, node: nodes.Getitem) -> str:
        if isinstance(node.arg, nodes.Slice):
            s = node.arg
            parts = [self.visit(p) if p is not None else "None" for p in (s.start, s.stop, s.step)]
            return f"_gi({self.visit(node.node)}, slice({', '.join(parts)}))"
        if not isinstance(node.arg, nodes.Const):
            self.time = True  # a key worked out at evaluation time could name a time field
            self.reads_unknown = True
        return f"_gi({self.visit(node.node)}, {self.visit(node.arg)})"

    def v_Compare(self, node: nodes.Compare) -> str:
        parts = [self.visit(node.expr)]
        for op in node.ops:
            parts.append(_CMP[op.op])
            parts.append(self.visit(op.expr))
        return "(" + " ".join(parts) + ")"

    def _chain(self, node: nodes.And | nodes.Or, op: str) -> str:
        """A chain of `and` (or `or`) as one flat Python expression: Jinja2 nests them left to right, and 200
        terms nested 200 deep would break Python's parser."""
        terms: list[nodes.Node] = []
        todo: list[nodes.Node] = [node]
        while todo:
            n = todo.pop()
            if type(n) is type(node):
                todo += [n.right, n.left]
            else:
                terms.append(n)
        return "(" + f" {op} ".join(self.visit(t) for t in terms) + ")"

    def v_And(self, node: nodes.And) -> str:
        return self._chain(node, "and")

    def v_Or(self, node: nodes.Or) -> str:
        return self._chain(node, "or")

    def v_Not(self, node: nodes.Not) -> str:
        return f"(not {self.visit(node.node)})"

    def v_Neg(self, node: nodes.Neg) -> str:
        return f"(-{self.visit(node.node)})"

    def v_Pos(self, node: nodes.Pos) -> str:
        return f"(+{self.visit(node.node)})"

    def _binop(self, node: nodes.BinExpr) -> str:
        name = type(node).__name__
        if name in _BOUNDED_BINOPS:
            return f"{_BOUNDED_BINOPS[name]}({self.visit(node.left)}, {self.visit(node.right)})"
        return f"({self.visit(node.left)} {_BINOPS[name]} {self.visit(node.right)})"

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
        seen: set[str] = set()
        for kw in node.kwargs:
            if not isinstance(kw.key, str) or not kw.key.isidentifier() or keyword.iskeyword(kw.key):
                raise self.fail(node, f"{kw.key!r} cannot be a keyword argument")
            if kw.key in seen:
                raise self.fail(node, f"keyword argument {kw.key!r} is given twice")
            seen.add(kw.key)
            args.append(f"{kw.key}={self.visit(kw.value)}")
        return ", ".join(args)

    def _check_named_args(self, node: nodes.Filter | nodes.Test) -> None:
        """The filter or test a `map`/`select`/`selectattr` applies must be on the allow-list too, and named as
        a quoted string; a field named by a computed string could be a time field."""
        named = _NAMED_ARG.get(node.name)
        if named is not None:
            allowed, pos = named
            if len(node.args) > pos:
                arg = node.args[pos]
                what = "filter" if allowed is FILTERS else "test"
                if not isinstance(arg, nodes.Const) or not isinstance(arg.value, str):
                    raise self.fail(node, f"{node.name} takes the {what} to apply as a quoted name")
                if arg.value not in allowed:
                    raise self.fail(node, f"{what} {arg.value!r} (in {node.name}) is not available in conditions; "
                                          f"available: {', '.join(sorted(allowed))}")
        attr_pos = _ATTRIBUTE_ARG.get(node.name, -1)
        if attr_pos != -1:
            fields = [a for i, a in enumerate(node.args) if i == attr_pos] + [k.value for k in node.kwargs
                                                                         if k.key == "attribute"]
            if any(not isinstance(f, nodes.Const) for f in fields):
                self.time = True
                self.reads_unknown = True

    def _filter_or_test(self, node: nodes.Filter | nodes.Test, table: Mapping[str, Any], allowed: frozenset[str],
                        what: str) -> str:
        if node.name not in allowed or node.name not in table:
            raise self.fail(node,
                            f"{what} {node.name!r} is not available in conditions; available: "
                            f"{', '.join(sorted(allowed))}")
        self._check_named_args(node)
        func = _OWN_FILTERS.get(node.name, table[node.name]) if what == "filter" else table[node.name]
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
        return self._filter_or_test(node, rt.FAST_ENV.filters, FILTERS, "filter")

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
            self.note_field_name(args[0].value)
            return f"_selattr({self.visit(node.node)}, {args[0].value!r}, {name == 'selectattr'})"
        if (
            name == "map" and not args and len(kwargs) == 1 and kwargs[0].key == "attribute"
            and _simple_attr(kwargs[0].value)
        ):
            value = kwargs[0].value
            assert isinstance(value, nodes.Const)
            self.note_field_name(value.value)
            return f"_mapattr({self.visit(node.node)}, {value.value!r})"
        return None

    def v_Test(self, node: nodes.Test) -> str:
        return self._filter_or_test(node, rt.FAST_ENV.tests, TESTS, "test")

    def v_Call(self, node: nodes.Call) -> str:
        target = node.node
        if isinstance(target, nodes.Name) and target.name in HELPERS:
            return self._helper(node, target.name)
        if isinstance(target, nodes.Getattr) and target.attr in METHODS:
            obj = self.visit(target.node)
            sig = self._signature(node)
            return f"_call({obj}, {target.attr!r}{', ' + sig if sig else ''})"
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
        if name == "range":
            if node.kwargs or not 1 <= len(node.args) <= 3:
                raise self.fail(node, "range() takes one to three numbers, like range(4)")
            return f"_range({self._signature(node)})"
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
    _check_depth(tree)
    c = _Compiler(kind, tz)
    try:
        body = c.visit(tree)
    except RecursionError:
        raise ExprError(f"the condition nests too deeply; at most {MAX_DEPTH} levels") from None
    prelude = "".join(f"    v_{n} = ctx[{n!r}]\n" for n in sorted(c.used - {"now"}))
    if c.time:
        prelude += f"    _clk = ctx[{CLOCK_KEY!r}]\n"
    code = (
        f"def _test(ctx):\n{prelude}    return True if {body} else False\n"
        f"def _value(ctx):\n{prelude}    return _u2n({body})\n"
    )
    try:
        exec(compile(code, f"<when: {source[:60]}>", "exec"), c.ns)
    except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
        raise ExprError(f"the condition is too complex to compile ({type(e).__name__}): simplify it") from None
    return Condition(
        source=source,
        test=c.ns["_test"],
        value=c.ns["_value"],
        time_dependent=c.time,
        names=frozenset(c.used),
        python=code,
        reads=None if c.reads_unknown else frozenset(c.reads),
    )


def _check_depth(tree: nodes.Node) -> None:
    """Refuse trees nested deeper than MAX_DEPTH (an `and`/`or` chain counts as one level)."""
    todo: list[tuple[nodes.Node, int]] = [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"the condition nests too deeply; at most {MAX_DEPTH} levels", node.lineno or 1)
        for child in node.iter_child_nodes():
            chained = isinstance(node, nodes.And | nodes.Or) and type(child) is type(node)
            todo.append((child, depth if chained else depth + 1))
