// The office wall screen: big numbers, the teams by waste, who holds idle GPUs now, the last 24 hours.
"use strict";

import {$, duration, el, getJson, money, params, pct, timings} from "./common.js";
import {legend} from "./colours.js";
import {gpuState, groupFleet} from "./fleet.js";
import {TimelineView} from "./timeline.js";

const query = params();
const refreshMs = Math.max(100, parseInt(query.get("refresh") || "10000", 10) || 10000);
const BOARD_ROWS = 10;
const timeline = new TimelineView($("timeline"), {dark: true, labelW: 220, sideW: 220});
$("timeline-legend").appendChild(legend([["held", "white hatching: held idle share of the hour"],
  ["no-data", "no usage recorded"]]));

function renderBoard(fleet) {
  const grouped = groupFleet(fleet, {group: query.get("group") || "auto", sort: "waste", show: "all", q: ""});
  if (grouped.mode === "node" && fleet.nodes.length > 12) grouped.groups = grouped.groups.slice(0, BOARD_ROWS);
  $("board-title").textContent = (grouped.mode === "node" ? "Nodes" : grouped.mode === "team" ? "Teams"
    : grouped.mode === "cluster" ? "Clusters" : "Groups") + ", most waste first";
  const rows = grouped.groups.slice(0, BOARD_ROWS).map((g) => {
    const tr = el("tr");
    tr.dataset.group = g.key;
    const s = g.stats;
    tr.appendChild(el("td", "group", g.key));
    tr.appendChild(el("td", "num", s.gpus));
    tr.appendChild(el("td", "num waste", s.held));
    tr.appendChild(el("td", "num waste", s.held ? money(s.heldCost, fleet.currency) : "–"));
    tr.appendChild(el("td", "num", pct(s.utilN ? s.utilSum / s.utilN : null)));
    const td = el("td");
    const bar = el("div", "bar");
    for (const [cls, n] of [["busy", s.busy], ["idle", s.idle - s.held], ["held-idle", s.held], ["offline", s.offline]]) {
      if (!n) continue;
      const part = el("span", "part " + cls);
      part.style.flexGrow = String(n);
      bar.appendChild(part);
    }
    td.appendChild(bar);
    tr.appendChild(td);
    return tr;
  });
  $("board").tBodies[0].replaceChildren(...rows);
}

function renderOwners(fleet) {
  const owners = new Map();
  for (const node of fleet.nodes) {
    for (const gpu of node.gpus) {
      if (gpuState(node, gpu) !== "held-idle") continue;
      const who = gpu.owner || (gpu.job ? "job " + gpu.job : "unknown");
      const o = owners.get(who) || {gpus: 0, cost: 0, idle: 0};
      o.gpus += 1;
      o.cost += gpu.cost_per_hour || 0;
      o.idle = Math.max(o.idle, gpu.idle_for_s || 0);
      owners.set(who, o);
    }
  }
  const rows = [...owners.entries()].sort((a, b) => b[1].cost - a[1].cost || b[1].gpus - a[1].gpus).slice(0, BOARD_ROWS)
    .map(([who, o]) => {
      const tr = el("tr");
      tr.dataset.owner = who;
      for (const [cls, v] of [["", who], ["num", o.gpus], ["num waste", money(o.cost, fleet.currency)], ["num", duration(o.idle)]]) {
        tr.appendChild(el("td", cls, v));
      }
      return tr;
    });
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "empty", "nobody holds an idle GPU");
    td.colSpan = 4;
    tr.appendChild(td);
    rows.push(tr);
  }
  $("owners").tBodies[0].replaceChildren(...rows);
}

async function refresh() {
  try {
    const t0 = performance.now();
    const [fleet, free] = await Promise.all([getJson("/api/fleet"), getJson("/api/free?limit=1")]);
    const t1 = performance.now();
    let utilSum = 0, utilN = 0;
    for (const node of fleet.nodes) {
      for (const gpu of node.gpus) {
        if (node.online && gpu.util_pct !== null) { utilSum += gpu.util_pct; utilN += 1; }
      }
    }
    $("gpu-count").textContent = fleet.gpu_count;
    $("util-now").textContent = pct(utilN ? utilSum / utilN : null);
    $("busy-count").textContent = fleet.busy;
    $("free-count").textContent = free.free_gpus;
    $("held-idle-count").textContent = fleet.held_idle;
    $("held-idle-cost").textContent = fleet.held_idle_cost_per_hour_text || money(fleet.held_idle_cost_per_hour, fleet.currency);
    renderBoard(fleet);
    renderOwners(fleet);
    const t2 = performance.now();
    if (timings.firstFleetMs === null) timings.firstFleetMs = t2; else timings.updates.push({fetchMs: t1 - t0, renderMs: t2 - t1});
    $("status").className = "status";
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("status").className = "status error";
    $("status").textContent = "cannot reach the engine (" + e.message + "); retrying";
  } finally {
    window.setTimeout(refresh, refreshMs);
  }
}

async function refreshTimeline() {
  try {
    const data = await getJson("/api/timeline?hours=24&per=auto&limit=20");
    timeline.setData(data);
    $("timeline-simulated").hidden = !data.simulated;
    if (timings.firstTimelineMs === null) timings.firstTimelineMs = performance.now();
  } catch (e) {
    timeline.note.textContent = "no usage history: " + e.message;
  } finally {
    window.setTimeout(refreshTimeline, 60000);
  }
}

function tick() {
  $("wall-clock").textContent = new Date().toLocaleString([], {weekday: "long", hour: "2-digit", minute: "2-digit"});
}

tick();
window.setInterval(tick, 10000);
refresh();
refreshTimeline();
