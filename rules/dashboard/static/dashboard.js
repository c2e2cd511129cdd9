// The fleet dashboard: polls the JSON API and redraws in place; builds the DOM with textContent only.
"use strict";

import {$, clock, el, getJson, params, timings} from "./common.js";
import {legend} from "./colours.js";
import {groupChoices, groupFleet, renderGroups} from "./fleet.js";
import {refreshFree, setupFree} from "./free.js";
import {TimelineView} from "./timeline.js";
import {renderQuarter} from "./quarter.js";

const query = params();
const refreshMs = Math.max(100, parseInt(query.get("refresh") || "5000", 10) || 5000);
const timelineMs = Math.max(1000, parseInt(query.get("timeline_refresh") || "60000", 10) || 60000);
const quarterMs = Math.max(1000, parseInt(query.get("quarter_refresh") || "600000", 10) || 600000);
const MAX_INCIDENTS = 100;
const view = {group: query.get("group") || "auto", sort: query.get("sort") || "waste", show: query.get("show") || "all",
  q: query.get("q") || ""};
const ui = {expanded: new Set(), limits: new Map()};
let fleet = null;
let choices = "";

const timeline = new TimelineView($("timeline"));
$("fleet-legend").appendChild(legend([["held", "held idle (hatched, outlined)"], ["offline", "offline"]]));
$("timeline-legend").appendChild(legend([["held", "white hatching: held idle share of the hour"]]));

function fillChoices() {
  const list = groupChoices(fleet);
  const key = list.map(([v]) => v).join("|");
  if (key === choices) return;
  choices = key;
  const select = $("group-by");
  select.replaceChildren(...list.map(([value, text]) => {
    const o = el("option", "", text);
    o.value = value;
    return o;
  }));
  select.value = view.group;
}

function drawFleet() {
  if (!fleet) return;
  const grouped = groupFleet(fleet, view);
  renderGroups($("groups"), grouped, fleet.currency, ui, drawFleet);
  $("shown-count").textContent = grouped.shownNodes + " of " + fleet.nodes.length + " nodes";
}

function renderCards(f) {
  $("gpu-count").textContent = f.gpu_count;
  $("busy-count").textContent = f.busy;
  $("idle-count").textContent = f.idle;
  $("held-idle-count").textContent = f.held_idle;
  $("held-idle-cost").textContent = f.held_idle_cost_per_hour_text || f.held_idle_cost_per_hour.toFixed(2);
  // demand: the whole-cluster lines (no partition, pool or model) count each waiting job once
  const whole = (f.demand || []).filter((d) => !d.partition && !d.pool && !d.model);
  const oldest = Math.max(0, ...(f.demand || []).map((d) => d.waiting_for_s || 0));
  $("waiting-count").textContent = whole.length ? whole.reduce((n, d) => n + d.pending_gpus, 0) : "–";
  $("waiting-label").textContent = whole.length
    ? "GPUs waited for, oldest " + Math.round(oldest / 60) + " min" : "GPUs waited for (no demand reader)";
}

function fillTable(id, rows, columns, empty) {
  const body = $(id).tBodies[0];
  if (!rows.length) {
    const td = el("td", "empty", empty);
    td.colSpan = columns;
    const tr = el("tr");
    tr.appendChild(td);
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...rows);
}

function renderIncidents(data) {
  const firing = data.incidents.filter((i) => i.status === "firing");
  $("incident-count").textContent = firing.length;
  fillTable("incidents", firing.slice(0, MAX_INCIDENTS).map((i) => {
    const tr = el("tr");
    tr.dataset.rule = i.rule;
    for (const v of [clock(i.firing_since || i.started_at), i.rule, i.entity_id, i.owner || "", i.cost || ""]) {
      tr.appendChild(el("td", "", v));
    }
    return tr;
  }), 5, "nothing firing");
}

function renderAudit(data) {
  fillTable("audit", data.records.map((r) => {
    const tr = el("tr");
    const what = r.kind === "action" ? (r.action_type || "action") + (r.dry_run ? " (dry run)" : "")
      : r.kind === "transition" ? (r.from_status || "") + " → " + (r.to_status || "") : r.kind;
    const outcome = r.outcome || "";
    tr.appendChild(el("td", "", clock(r.time)));
    tr.appendChild(el("td", "", r.rule));
    tr.appendChild(el("td", "", r.entity_id));
    tr.appendChild(el("td", "", what));
    tr.appendChild(el("td", outcome ? "outcome-" + outcome : "", outcome + (r.error ? ": " + r.error : "")));
    return tr;
  }), 5, "no actions yet");
}

async function refresh() {
  const status = $("status");
  try {
    const t0 = performance.now();
    const [f, incidents, audit] = await Promise.all([
      getJson("/api/fleet"), getJson("/api/incidents"), getJson("/api/audit?limit=30")]);
    const t1 = performance.now();
    fleet = f;
    renderCards(f);
    fillChoices();
    drawFleet();
    renderIncidents(incidents);
    renderAudit(audit);
    const t2 = performance.now();
    if (timings.firstFleetMs === null) timings.firstFleetMs = t2;
    else timings.updates.push({fetchMs: t1 - t0, renderMs: t2 - t1});
    status.className = "status";
    status.textContent = "updated " + new Date().toLocaleTimeString();
    refreshFree($("free-form"));
  } catch (e) {
    status.className = "status error";
    status.textContent = "cannot reach the engine (" + e.message + "); retrying";
  } finally {
    window.setTimeout(refresh, refreshMs);
  }
}

let timelineTimer = null;

async function refreshTimeline() {
  window.clearTimeout(timelineTimer);
  try {
    const data = await getJson("/api/timeline?hours=24&per=auto&limit=100&q=" + encodeURIComponent(view.q));
    timeline.setData(data);
    $("timeline-simulated").hidden = !data.simulated;
    if (timings.firstTimelineMs === null) timings.firstTimelineMs = performance.now();
  } catch (e) {
    timeline.note.textContent = "no usage history: " + e.message;
  } finally {
    timelineTimer = window.setTimeout(refreshTimeline, timelineMs);
  }
}

async function refreshQuarter() {
  try {
    renderQuarter($("quarter"), $("quarter-simulated"), await getJson("/api/quarter?weeks=13"));
    if (timings.firstQuarterMs === null) timings.firstQuarterMs = performance.now();
  } catch (e) {
    $("quarter").replaceChildren(el("p", "legend", "no usage history: " + e.message));
  } finally {
    window.setTimeout(refreshQuarter, quarterMs);
  }
}

function setupControls() {
  const controls = {"group-by": "group", "sort-by": "sort", "show": "show"};
  for (const [id, key] of Object.entries(controls)) {
    $(id).value = view[key];
    $(id).addEventListener("change", () => {
      view[key] = $(id).value;
      ui.limits.clear();
      drawFleet();
    });
  }
  const search = $("search");
  search.value = view.q;
  let typing = null;
  search.addEventListener("input", () => {
    view.q = search.value;
    ui.limits.clear();
    drawFleet();
    window.clearTimeout(typing);
    typing = window.setTimeout(refreshTimeline, 300);
  });
  $("controls").addEventListener("submit", (e) => e.preventDefault());
}

setupControls();
setupFree($("free-form"));
refresh();
refreshTimeline();
refreshQuarter();
