"""The usage reports' HTML: Jinja2 templates (rules/usage/templates/) rendered with autoescape on.

Every value a template outputs is escaped once, by Jinja2, so a team, owner or job name from a machine shows
as written and never becomes markup; markup built in Python (the SVG charts) is handed in as `Markup`.
The templates are written one element a line, indented, for reading; a line break and the indentation after
it are dropped at load, so a page comes out on one line, as compact as the file it is mailed in needs.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from jinja2 import Environment, FunctionLoader, StrictUndefined

_BREAK = re.compile(r"\n[ \t]*")


def _source(name: str) -> str:
    return _BREAK.sub("", files("rules.usage").joinpath("templates", name).read_text(encoding="utf-8"))


_env = Environment(loader=FunctionLoader(_source), autoescape=True, undefined=StrictUndefined)


def render_template(template: str, /, **names: Any) -> str:
    """The template (a file in rules/usage/templates/) rendered with `names`, every output escaped."""
    return _env.get_template(template).render(**names)
