"""The colour scale of utilization, readable by colour-blind people: viridis (dark purple at 0 % through teal
to yellow at 100 %), always shown with a legend that has numbers. Pure."""

from __future__ import annotations

import math

# matplotlib's viridis sampled at 0, 0.1, ..., 1; linearly interpolated in between. The dashboard's
# static/colours.js holds the same stops (a test compares them).
VIRIDIS = ("#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
           "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725")
NO_DATA = "#e9ecef"
LEGEND_TICKS = (0, 25, 50, 75, 100)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16)


_STOPS = [_rgb(c) for c in VIRIDIS]


def util_rgb(util: float) -> tuple[int, int, int]:
    """The colour of a utilization in % (clamped to 0–100)."""
    t = min(max(util, 0.0), 100.0) / 100.0 * (len(_STOPS) - 1)
    i = min(int(t), len(_STOPS) - 2)
    f = t - i
    a, b = _STOPS[i], _STOPS[i + 1]
    # halves round up, as the page's Math.round does, so both draw the same colour
    r, g, bl = (math.floor(a[k] + (b[k] - a[k]) * f + 0.5) for k in range(3))
    return r, g, bl


def util_colour(util: float | None) -> str:
    """`#rrggbb` for a utilization in %; light grey where nothing was counted."""
    if util is None:
        return NO_DATA
    return "#{:02x}{:02x}{:02x}".format(*util_rgb(util))


def text_colour(util: float | None) -> str:
    """Black or white, whichever reads better on `util_colour(util)` (viridis is dark below about 60 %)."""
    if util is None:
        return "#111111"
    r, g, b = util_rgb(util)
    return "#111111" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


def legend_svg(width: int = 240, label: str = "utilization") -> str:
    """A gradient bar with ticks at 0, 25, 50, 75 and 100 %: the scale is read by number, not colour alone."""
    stops = "".join(f'<stop offset="{i / (len(VIRIDIS) - 1):.2f}" stop-color="{c}"/>' for i, c in enumerate(VIRIDIS))
    pad = 20  # room for the first and last tick's label
    ticks = "".join(
        f'<line x1="{pad + t / 100 * width:.1f}" y1="22" x2="{pad + t / 100 * width:.1f}" y2="26" stroke="#333"/>'
        f'<text x="{pad + t / 100 * width:.1f}" y="37" text-anchor="middle">{t} %</text>'
        for t in LEGEND_TICKS
    )
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 2 * pad}" height="40" font-size="10" '
            f'role="img" aria-label="{label}: dark purple 0 % to yellow 100 %">'
            f'<defs><linearGradient id="viridis">{stops}</linearGradient></defs>'
            f'<rect x="{pad}" y="8" width="{width}" height="14" fill="url(#viridis)"/>{ticks}</svg>')
