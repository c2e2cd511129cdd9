// The fleet, grouped (cluster, team, a label, or node by node), filtered, searched and sorted by waste; built for
// a thousand nodes: only the groups, and the nodes of the groups opened, are in the page.
"use strict";

import {el, duration, money, natural, pct} from "./common.js";
import {textColour, utilColour} from "./colours.js";

export const NO_TEAM = "(no team)";
export const FLAT_MAX_NODES = 24;  // up to this many nodes, `auto` shows them one by one
const PAGE = 100;  // rows shown at first, and added by "show more"

export function gpuState(node, gpu) {
  if (!node.online) return "offline";
  if (gpu.held_idle) return "held-idle";
  return gpu.idle ? "idle" : "busy";
}

export function autoGroup(fleet) {
  if (fleet.nodes.length <= FLAT_MAX_NODES) return "node";
  const teams = fleet.nodes.some((n) => n.labels[fleet.team_label] || n.gpus.some((g) => g.team));
  return teams ? "team" : "cluster";
}

function groupOf(mode, node, gpu, teamLabel) {
  if (mode === "node") return node.name;
  if (mode === "cluster") return node.cluster;
  if (mode === "team") return gpu.team || node.labels[teamLabel] || NO_TEAM;
  if (mode.startsWith("label:")) return node.labels[mode.slice(6)] || "(none)";
  return node.cluster;
}

function searchText(node) {
  return [node.name, node.cluster, ...Object.entries(node.labels).map(([k, v]) => k + "=" + v)].join(" ").toLowerCase();
}

function gpuText(gpu) {
  return [gpu.model, gpu.owner, gpu.team, gpu.job].filter(Boolean).join(" ").toLowerCase();
}

function emptyStats() {
  return {gpus: 0, busy: 0, idle: 0, held: 0, offline: 0, heldCost: 0, utilSum: 0, utilN: 0};
}

function count(stats, node, gpu) {
  const state = gpuState(node, gpu);
  stats.gpus += 1;
  if (state === "offline") stats.offline += 1;
  else if (state === "busy") stats.busy += 1;
  else stats.idle += 1;
  if (state === "held-idle") {
    stats.held += 1;
    stats.heldCost += gpu.cost_per_hour || 0;
  }
  if (state !== "offline" && gpu.util_pct !== null && gpu.util_pct !== undefined) {
    stats.utilSum += gpu.util_pct;
    stats.utilN += 1;
  }
}

// The groups, each with its nodes (and of each node only the GPUs that pass), sorted; and what passed in all.
export function groupFleet(fleet, view) {
  const mode = view.group === "auto" ? autoGroup(fleet) : view.group;
  const q = (view.q || "").trim().toLowerCase();
  const groups = new Map();
  let shownNodes = 0;
  for (const node of fleet.nodes) {
    const nodeHit = !q || searchText(node).includes(q);
    let any = false;
    for (const gpu of node.gpus) {
      if (!nodeHit && !gpuText(gpu).includes(q)) continue;
      if (view.show !== "all" && gpuState(node, gpu) !== view.show) continue;
      const key = groupOf(mode, node, gpu, fleet.team_label);
      let g = groups.get(key);
      if (!g) groups.set(key, g = {key, stats: emptyStats(), nodes: new Map()});
      let n = g.nodes.get(node.name);
      if (!n) g.nodes.set(node.name, n = {node, gpus: [], stats: emptyStats()});
      n.gpus.push(gpu);
      count(n.stats, node, gpu);
      count(g.stats, node, gpu);
      any = true;
    }
    if (any) shownNodes += 1;
  }
  const order = sorter(view.sort);
  const list = [...groups.values()].sort(order);
  for (const g of list) g.nodeList = [...g.nodes.values()].sort((a, b) => order({key: a.node.name, stats: a.stats},
    {key: b.node.name, stats: b.stats}));
  return {mode, groups: list, shownNodes};
}

function sorter(sort) {
  const util = (s) => (s.utilN ? s.utilSum / s.utilN : Infinity);
  if (sort === "name") return (a, b) => natural(a.key, b.key);
  if (sort === "util") return (a, b) => util(a.stats) - util(b.stats) || natural(a.key, b.key);
  // waste: money held idle per hour, then held-idle GPUs, then idle ones
  return (a, b) => b.stats.heldCost - a.stats.heldCost || b.stats.held - a.stats.held
    || b.stats.idle - a.stats.idle || natural(a.key, b.key);
}

function tile(node, gpu, currency) {
  const state = gpuState(node, gpu);
  const cell = el("div", "gpu " + state);
  cell.dataset.gpu = node.name + "/" + gpu.index;
  cell.dataset.state = state;
  if (state !== "offline") {
    cell.style.backgroundColor = utilColour(gpu.util_pct);
    cell.style.color = textColour(gpu.util_pct);
  }
  cell.appendChild(el("span", "", gpu.index));
  cell.appendChild(el("small", "", state === "held-idle" ? "held" : gpu.util_pct === null ? "–" : Math.round(gpu.util_pct) + "%"));
  const tip = [node.name + " GPU " + gpu.index + (gpu.model ? " · " + gpu.model : ""),
    "utilization " + (gpu.util_pct === null ? "unknown" : Math.round(gpu.util_pct) + "%")];
  if (gpu.mem_total_mib) tip.push("memory " + Math.round(gpu.mem_used_mib || 0) + " / " + Math.round(gpu.mem_total_mib) + " MiB");
  if (gpu.idle) tip.push("idle " + duration(gpu.idle_for_s));
  if (gpu.held_idle) tip.push("HELD IDLE by " + (gpu.owner || "unknown") + " (" + gpu.processes + " processes)");
  else if (gpu.owner) tip.push("owner " + gpu.owner);
  if (gpu.job) tip.push("job " + gpu.job);
  if (gpu.team) tip.push("team " + gpu.team);
  if (gpu.cost_per_hour) tip.push(money(gpu.cost_per_hour, currency) + " per hour");
  cell.title = tip.join("\n");
  return cell;
}

function statCells(tr, stats, currency) {
  for (const v of [stats.gpus, stats.busy, stats.idle, stats.held]) tr.appendChild(el("td", "num", v));
  tr.appendChild(el("td", "num waste", stats.held ? money(stats.heldCost, currency) : "–"));
  tr.appendChild(el("td", "num", pct(stats.utilN ? stats.utilSum / stats.utilN : null)));
}

function bar(stats) {
  const b = el("div", "bar");
  b.setAttribute("role", "img");
  b.setAttribute("aria-label", stats.busy + " busy, " + (stats.idle - stats.held) + " idle, " + stats.held + " held idle, "
    + stats.offline + " offline");
  for (const [cls, n] of [["busy", stats.busy], ["idle", stats.idle - stats.held], ["held-idle", stats.held], ["offline", stats.offline]]) {
    if (!n) continue;
    const part = el("span", "part " + cls);
    part.style.flexGrow = String(n);
    b.appendChild(part);
  }
  return b;
}

function nodeRow(n, currency, cls) {
  const tr = el("tr", cls);
  tr.dataset.node = n.node.name;
  const name = el("td", "node" + (n.node.online ? "" : " offline"), n.node.name);
  name.title = n.node.cluster + (n.node.online ? "" : " (offline)") + (n.node.cordoned ? " (cordoned)" : "");
  tr.appendChild(name);
  statCells(tr, n.stats, currency);
  const td = el("td");
  const gpus = el("div", "gpus");
  gpus.dataset.node = n.node.name;
  for (const gpu of n.gpus) gpus.appendChild(tile(n.node, gpu, currency));
  td.appendChild(gpus);
  tr.appendChild(td);
  return tr;
}

function moreRow(left, onMore) {
  const tr = el("tr", "more");
  const td = el("td");
  td.colSpan = 8;
  const button = el("button", "more-button", "show " + Math.min(left, PAGE) + " more (" + left + " not shown)");
  button.type = "button";
  button.addEventListener("click", onMore);
  td.appendChild(button);
  tr.appendChild(td);
  return tr;
}

// Draws the grouped fleet into the table; `ui` holds what the person opened and how far they scrolled ("show more").
export function renderGroups(table, grouped, currency, ui, redraw) {
  const body = table.tBodies[0];
  const rows = [];
  table.dataset.mode = grouped.mode;
  if (grouped.mode === "node") {
    const nodes = grouped.groups.flatMap((g) => g.nodeList);
    const limit = ui.limits.get("") || PAGE;
    for (const n of nodes.slice(0, limit)) rows.push(nodeRow(n, currency, "node-row flat"));
    if (nodes.length > limit) rows.push(moreRow(nodes.length - limit, () => { ui.limits.set("", limit + PAGE); redraw(); }));
  } else {
    for (const g of grouped.groups.slice(0, ui.limits.get("") || 2 * PAGE)) {
      const open = ui.expanded.has(g.key);
      const tr = el("tr", "group-row" + (open ? " open" : ""));
      tr.dataset.group = g.key;
      const name = el("td", "group");
      const button = el("button", "toggle", (open ? "▾ " : "▸ ") + g.key);
      button.type = "button";
      button.setAttribute("aria-expanded", String(open));
      button.addEventListener("click", () => {
        if (open) ui.expanded.delete(g.key); else ui.expanded.add(g.key);
        redraw();
      });
      name.appendChild(button);
      name.appendChild(el("small", "nodes", g.nodeList.length + (g.nodeList.length === 1 ? " node" : " nodes")));
      tr.appendChild(name);
      statCells(tr, g.stats, currency);
      const td = el("td");
      td.appendChild(bar(g.stats));
      tr.appendChild(td);
      rows.push(tr);
      if (open) {
        const limit = ui.limits.get(g.key) || PAGE / 2;
        for (const n of g.nodeList.slice(0, limit)) rows.push(nodeRow(n, currency, "node-row nested"));
        if (g.nodeList.length > limit) {
          rows.push(moreRow(g.nodeList.length - limit, () => { ui.limits.set(g.key, limit + PAGE); redraw(); }));
        }
      }
    }
  }
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "empty", "nothing matches");
    td.colSpan = 8;
    tr.appendChild(td);
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

// The group-by choices: the fixed ones, then every label key seen on a node (at most 20).
export function groupChoices(fleet) {
  const keys = new Set();
  for (const node of fleet.nodes) {
    for (const k of Object.keys(node.labels)) {
      if (keys.size >= 20) break;
      keys.add(k);
    }
  }
  return [["auto", "auto"], ["cluster", "cluster"], ["team", "team"], ["node", "node (no grouping)"],
    ...[...keys].sort(natural).map((k) => ["label:" + k, "label " + k])];
}
