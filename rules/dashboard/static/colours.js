// Utilization as colour, readable by colour-blind people: viridis, always with a legend that has numbers.
"use strict";

import {el} from "./common.js";

// matplotlib's viridis at 0, 0.1, ..., 1 (the same stops as rules/visibility/colours.py; a test compares them)
export const VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
  "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725"];
export const NO_DATA = "#e9ecef";
// On the dark wall: a cell with no data is a shade above the page, not a light grey that glares.
export const NO_DATA_DARK = "#222a32";
const STOPS = VIRIDIS.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));

export function utilRgb(util) {
  const t = Math.min(Math.max(util, 0), 100) / 100 * (STOPS.length - 1);
  const i = Math.min(Math.floor(t), STOPS.length - 2);
  const f = t - i;
  return [0, 1, 2].map((k) => Math.round(STOPS[i][k] + (STOPS[i + 1][k] - STOPS[i][k]) * f));
}

export function utilColour(util) {
  if (util === null || util === undefined) return NO_DATA;
  const [r, g, b] = utilRgb(util);
  return "rgb(" + r + "," + g + "," + b + ")";
}

export function textColour(util) {
  if (util === null || util === undefined) return "#111";
  const [r, g, b] = utilRgb(util);
  return 0.299 * r + 0.587 * g + 0.114 * b > 140 ? "#111" : "#fff";
}

// A gradient bar with ticks at 0, 25, 50, 75, 100 % and the other marks explained in words.
export function legend(extra) {
  const box = el("span", "legend");
  const scale = el("span", "scale");
  const bar = el("span", "scale-bar");
  bar.style.backgroundImage = "linear-gradient(to right, " + VIRIDIS.join(", ") + ")";
  scale.appendChild(bar);
  const ticks = el("span", "scale-ticks");
  for (const t of [0, 25, 50, 75, 100]) ticks.appendChild(el("span", "", t + " %"));
  scale.appendChild(ticks);
  box.appendChild(el("span", "legend-label", "utilization"));
  box.appendChild(scale);
  for (const [cls, text] of extra || []) {
    const item = el("span", "legend-item");
    item.appendChild(el("i", "swatch " + cls));
    item.appendChild(document.createTextNode(text));
    box.appendChild(item);
  }
  return box;
}
