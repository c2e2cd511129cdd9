// The fleet dashboard: polls the JSON API and redraws; builds the DOM with textContent only.
"use strict";

(function () {
  const params = new URLSearchParams(window.location.search);
  const refreshMs = Math.max(100, parseInt(params.get("refresh") || "5000", 10) || 5000);
  const auditLimit = 30;
  const $ = (id) => document.getElementById(id);

  function utilColour(util) {
    if (util === null || util === undefined) return "#e9ecef";
    const u = Math.min(Math.max(util, 0), 100);
    return "hsl(" + Math.round(u * 1.2) + ",70%," + Math.round(48 + (100 - u) * 0.04) + "%)";
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "";
    const s = Math.max(0, Math.round(seconds));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    return m + "m";
  }

  function clock(iso) {
    if (!iso) return "";
    const t = new Date(iso);
    return isNaN(t) ? String(iso) : t.toLocaleString([], {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"});
  }

  function gpuState(node, gpu) {
    if (!node.online) return "offline";
    if (gpu.held_idle) return "held-idle";
    return gpu.idle ? "idle" : "busy";
  }

  function renderFleet(fleet) {
    $("gpu-count").textContent = fleet.gpu_count;
    $("busy-count").textContent = fleet.busy;
    $("idle-count").textContent = fleet.idle;
    $("held-idle-count").textContent = fleet.held_idle;
    $("held-idle-cost").textContent = fleet.held_idle_cost_per_hour_text || fleet.held_idle_cost_per_hour.toFixed(2);
    const grid = $("heatmap");
    const rows = [];
    for (const node of fleet.nodes) {
      const name = el("div", "node" + (node.online ? "" : " offline"), node.name);
      name.title = node.cluster + (node.online ? "" : " (offline)");
      const gpus = el("div", "gpus");
      gpus.dataset.node = node.name;
      for (const gpu of node.gpus) {
        const state = gpuState(node, gpu);
        const cell = el("div", "gpu " + (state === "held-idle" ? "held" : state === "offline" ? "offline" : ""));
        cell.dataset.gpu = node.name + "/" + gpu.index;
        cell.dataset.state = state;
        if (state !== "offline") cell.style.backgroundColor = utilColour(gpu.util_pct);
        cell.appendChild(el("span", "", gpu.index));
        cell.appendChild(el("small", "", gpu.util_pct === null ? "–" : Math.round(gpu.util_pct) + "%"));
        const tip = [node.name + " GPU " + gpu.index + (gpu.model ? " · " + gpu.model : ""),
          "utilization " + (gpu.util_pct === null ? "unknown" : Math.round(gpu.util_pct) + "%")];
        if (gpu.mem_total_mib) tip.push("memory " + Math.round(gpu.mem_used_mib || 0) + " / " + Math.round(gpu.mem_total_mib) + " MiB");
        if (gpu.idle) tip.push("idle " + duration(gpu.idle_for_s));
        if (gpu.held_idle) tip.push("HELD IDLE by " + (gpu.owner || "unknown") + " (" + gpu.processes + " processes)");
        else if (gpu.owner) tip.push("owner " + gpu.owner);
        cell.title = tip.join("\n");
        gpus.appendChild(cell);
      }
      rows.push(name, gpus);
    }
    grid.replaceChildren(...rows);
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
    fillTable("incidents", firing.map((i) => {
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
      const td = el("td", outcome ? "outcome-" + outcome : "", outcome + (r.error ? ": " + r.error : ""));
      tr.appendChild(td);
      return tr;
    }), 5, "no actions yet");
  }

  async function getJson(path) {
    const response = await fetch(path, {cache: "no-store"});
    if (!response.ok) throw new Error(path + ": HTTP " + response.status);
    return response.json();
  }

  async function refresh() {
    const status = $("status");
    try {
      const [fleet, incidents, audit] = await Promise.all([
        getJson("/api/fleet"), getJson("/api/incidents"), getJson("/api/audit?limit=" + auditLimit)]);
      renderFleet(fleet);
      renderIncidents(incidents);
      renderAudit(audit);
      status.className = "status";
      status.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      status.className = "status error";
      status.textContent = "cannot reach the engine (" + e.message + "); retrying";
    } finally {
      window.setTimeout(refresh, refreshMs);
    }
  }

  refresh();
})();
