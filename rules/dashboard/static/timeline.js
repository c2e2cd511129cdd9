// The heatmap over time: GPU (or node) × hour on a canvas, colour = utilization, white hatching = the share of
// the hour held idle; hovering tells the GPU, owner, utilization and cost of that hour.
"use strict";

import {el, money, pct} from "./common.js";
import {NO_DATA, NO_DATA_DARK, utilColour} from "./colours.js";

const AXIS_H = 18;

function hatch(ctx) {
  const tile = document.createElement("canvas");
  tile.width = tile.height = 6;
  const t = tile.getContext("2d");
  t.strokeStyle = "#fff";
  t.lineWidth = 1.6;
  t.beginPath();
  t.moveTo(-1, 7);
  t.lineTo(7, -1);
  t.stroke();
  return ctx.createPattern(tile, "repeat");
}

function hourText(iso, withDay) {
  const t = new Date(iso);
  return t.toLocaleString([], withDay ? {weekday: "short", hour: "2-digit", minute: "2-digit"} : {hour: "2-digit", minute: "2-digit"});
}

export class TimelineView {
  constructor(box, options) {
    this.box = box;
    this.options = Object.assign({labelW: 190, sideW: 170, dark: false}, options || {});
    this.canvas = el("canvas", "timeline-canvas");
    this.canvas.setAttribute("role", "img");
    this.tip = el("div", "timeline-tip");
    this.tip.setAttribute("role", "tooltip");
    this.tip.hidden = true;
    this.note = el("p", "legend timeline-note");
    box.replaceChildren(this.canvas, this.tip, this.note);
    this.data = null;
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    window.addEventListener("resize", () => this.draw());
  }

  layout() {
    const rows = this.data ? this.data.rows.length : 0;
    const rowH = rows <= 40 ? 16 : rows <= 120 ? 10 : 5;
    const width = Math.max(400, this.box.clientWidth);
    const hours = this.data ? this.data.hours.length : 24;
    const cellW = (width - this.options.labelW - this.options.sideW) / hours;
    return {rowH, width, cellW, height: AXIS_H + rows * rowH + 2};
  }

  setData(data) {
    this.data = data;
    this.draw();
  }

  draw() {
    if (!this.data) return;
    const d = this.data, L = this.layout(), o = this.options;
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(L.width * ratio);
    this.canvas.height = Math.round(L.height * ratio);
    this.canvas.style.width = L.width + "px";
    this.canvas.style.height = L.height + "px";
    this.canvas.dataset.rows = String(d.rows.length);
    this.canvas.setAttribute("aria-label", "utilization and held-idle share per " + d.per + " and hour, last "
      + d.hours.length + " hours; " + d.rows.length + " rows, most held-idle cost first");
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, L.width, L.height);
    const fg = o.dark ? "#e9ecef" : "#1d232a";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = fg;
    ctx.textBaseline = "middle";
    for (let i = 0; i < d.hours.length; i += 3) {
      ctx.fillText(hourText(d.hours[i], i === 0), o.labelW + i * L.cellW, AXIS_H / 2);
    }
    const pattern = hatch(ctx);
    const gap = L.cellW > 6 ? 1 : 0;
    d.rows.forEach((row, r) => {
      const y = AXIS_H + r * L.rowH;
      if (L.rowH >= 9) {
        ctx.fillStyle = fg;
        ctx.textAlign = "right";
        ctx.fillText(row.label, o.labelW - 6, y + L.rowH / 2, o.labelW - 8);
        ctx.textAlign = "left";
        ctx.fillText(row.held_h.toFixed(1) + " h held idle · " + money(row.held_cost_total, d.currency),
          L.width - o.sideW + 6, y + L.rowH / 2, o.sideW - 8);
      }
      for (let i = 0; i < row.util.length; i++) {
        const x = o.labelW + i * L.cellW;
        ctx.fillStyle = row.util[i] === null ? (o.dark ? NO_DATA_DARK : NO_DATA) : utilColour(row.util[i]);
        ctx.fillRect(x, y, L.cellW - gap, L.rowH - 1);
        const share = row.held[i];
        if (share > 0.05) {
          ctx.globalAlpha = Math.min(1, 0.25 + share);
          ctx.fillStyle = pattern;
          ctx.fillRect(x, y, L.cellW - gap, L.rowH - 1);
          ctx.globalAlpha = 1;
        }
      }
    });
    this.note.textContent = d.rows.length ? (d.left_out ? d.left_out + " more rows not shown (the least wasteful)." : "")
      : "No usage recorded in the last " + d.hours.length + " hours.";
    this.layoutCache = L;
  }

  cellAt(x, y) {
    const L = this.layoutCache;
    if (!L || !this.data) return null;
    const r = Math.floor((y - AXIS_H) / L.rowH);
    const i = Math.floor((x - this.options.labelW) / L.cellW);
    if (r < 0 || r >= this.data.rows.length || i < 0 || i >= this.data.hours.length) return null;
    return {r, i};
  }

  describe(r, i) {
    const d = this.data, row = d.rows[r];
    const owner = row.owner[i] >= 0 ? d.owners[row.owner[i]] : "nobody";
    const start = new Date(d.hours[i]);
    const end = new Date(start.getTime() + 3600e3);
    const gpu = row.gpu === null ? row.label + " (" + row.gpus + " GPUs)" : row.label;
    return [
      gpu + (row.model ? " · " + row.model : ""),
      start.toLocaleString([], {weekday: "short", hour: "2-digit", minute: "2-digit"}) + "–"
        + end.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit"}),
      "owner: " + owner + (row.team ? " (team " + row.team + ")" : ""),
      "utilization: " + pct(row.util[i]),
      "held idle: " + Math.round(row.held[i] * 100) + " % of the hour",
      "cost: " + money(row.cost[i], d.currency) + " (held idle " + money(row.held_cost[i], d.currency) + ")",
    ];
  }

  hover(event) {
    const rect = this.canvas.getBoundingClientRect();
    const cell = this.cellAt(event.clientX - rect.left, event.clientY - rect.top);
    if (!cell) {
      this.tip.hidden = true;
      return;
    }
    this.tip.textContent = this.describe(cell.r, cell.i).join("\n");
    this.tip.dataset.row = this.data.rows[cell.r].key;
    this.tip.dataset.hour = String(cell.i);
    this.tip.hidden = false;
    const boxRect = this.box.getBoundingClientRect();
    const left = event.clientX - boxRect.left + 14;
    this.tip.style.left = Math.min(left, this.box.clientWidth - 260) + "px";
    this.tip.style.top = (event.clientY - boxRect.top + 14) + "px";
  }
}
