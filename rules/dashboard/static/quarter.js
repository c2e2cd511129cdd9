// Each team's utilization week by week (13 weeks by default) as an SVG line, its target dashed: /api/quarter.
// Built with DOM calls only (no HTML strings); a store holding simulated usage is said above the lines.
"use strict";

import {el, money, pct} from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 360, H = 130, PAD = 30;

function svg(tag, attrs, title) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (title) {
    const t = document.createElementNS(SVG, "title");
    t.textContent = title;
    e.appendChild(t);
  }
  return e;
}

const y = (value) => H - PAD / 2 - (H - PAD) * Math.max(0, Math.min(100, value)) / 100;

function day(iso) {
  return new Date(iso).toISOString().slice(0, 10);
}

function teamName(team) {
  return team === null ? "Fleet" : team === "" ? "(no team)" : team;
}

export function lineChart(series) {
  const n = Math.max(series.points.length, 1);
  const step = (W - 2 * PAD) / Math.max(n - 1, 1);
  const chart = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", class: "quarter-svg",
    "aria-label": teamName(series.team) + ": utilization per week, " + series.change});
  chart.appendChild(svg("line", {x1: PAD, y1: y(0), x2: W - PAD, y2: y(0), class: "axis"}));
  chart.appendChild(svg("text", {x: 2, y: y(0) + 3, class: "tick"}));
  chart.lastChild.textContent = "0 %";
  chart.appendChild(svg("text", {x: 2, y: y(100) + 3, class: "tick"}));
  chart.lastChild.textContent = "100";
  if (series.target_util_pct !== null) {
    const ty = y(series.target_util_pct);
    chart.appendChild(svg("line", {x1: PAD, y1: ty, x2: W - PAD, y2: ty, class: "target",
      "data-target": series.target_util_pct}, "target " + pct(series.target_util_pct)));
    const label = svg("text", {x: W - PAD + 2, y: ty + 3, class: "tick target-label"});
    label.textContent = pct(series.target_util_pct);
    chart.appendChild(label);
  }
  const pts = [];
  let d = "", pen = false;
  series.points.forEach((p, i) => {
    if (p.util_pct === null) {
      pen = false;  // a week with no reading breaks the line: nothing is drawn across it
      return;
    }
    const [px, py] = [PAD + i * step, y(p.util_pct)];
    pts.push([px, py, p]);
    d += (d ? " " : "") + (pen ? "L" : "M") + px.toFixed(1) + "," + py.toFixed(1);
    pen = true;
  });
  if (d.includes("L")) chart.appendChild(svg("path", {d, class: "util-line"}));
  for (const [px, py, p] of pts) {
    chart.appendChild(svg("circle", {cx: px, cy: py, r: 3, class: "util-point", "data-week": day(p.week_start),
      "data-util": p.util_pct}, "week of " + day(p.week_start) + ": " + pct(p.util_pct) + " utilization, "
      + p.held_idle_h.toFixed(1) + " GPU-hours held idle"));
  }
  return chart;
}

export function renderQuarter(box, note, q) {
  note.hidden = !q.simulated;
  note.textContent = q.simulated
    ? "Includes simulated usage (gpuevents simulate --history): not a real fleet's figures." : "";
  const cards = [q.fleet, ...q.teams].map((s) => {
    const card = el("div", "quarter-card");
    card.dataset.team = s.team === null ? "" : s.team;
    if (s.team === null) card.dataset.fleet = "1";
    card.appendChild(el("h3", "", teamName(s.team)));
    const idle = s.points.reduce((sum, p) => sum + p.held_idle_cost, 0);
    const state = s.on_target === null ? "" : s.on_target ? " · on target" : " · below target";
    const line = el("p", "quarter-change " + (s.on_target === false ? "miss" : s.on_target ? "met" : ""),
      s.change + state);
    card.appendChild(line);
    card.appendChild(el("p", "legend", "held idle " + money(idle, q.currency) + " over " + q.weeks.length + " weeks"));
    card.appendChild(lineChart(s));
    return card;
  });
  box.replaceChildren(...cards);
}
