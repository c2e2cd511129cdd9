"""The utilization scale: viridis, the same stops in the page and the report, text that reads on every colour."""

from __future__ import annotations

import re
from pathlib import Path

from rules.usage.colours import VIRIDIS, legend_svg, text_colour, util_colour

STATIC = Path(__file__).resolve().parents[3] / "rules" / "dashboard" / "static"


def test_the_page_and_the_report_use_the_same_viridis_stops() -> None:
    js = (STATIC / "colours.js").read_text()
    stops = re.search(r"export const VIRIDIS = \[(.*?)\];", js, re.S)
    assert stops is not None
    assert tuple(re.findall(r'"(#[0-9a-f]{6})"', stops.group(1))) == VIRIDIS


def test_the_scale_runs_from_dark_purple_to_yellow_and_grey_is_no_data() -> None:
    assert util_colour(0) == "#440154"
    assert util_colour(100) == "#fde725"
    assert util_colour(55) == "#229d88"  # halfway between #21918c and #22a884, halves rounded up as in the page
    assert util_colour(-5) == util_colour(0) and util_colour(250) == util_colour(100)
    assert util_colour(None) == "#e9ecef"


def test_text_is_white_on_the_dark_end_and_black_on_the_light_end() -> None:
    assert text_colour(0) == "#ffffff" and text_colour(30) == "#ffffff"
    assert text_colour(90) == "#111111" and text_colour(None) == "#111111"


def test_the_legend_has_numbers_not_colour_alone() -> None:
    svg = legend_svg()
    assert [int(t) for t in re.findall(r">(\d+) %</text>", svg)] == [0, 25, 50, 75, 100]
    assert 'aria-label="utilization: dark purple 0 % to yellow 100 %"' in svg
