// "Which GPU is free for my job?": the same answer as `gpuevents free`, from GET /api/free.
"use strict";

import {$, el, duration, getJson, pct} from "./common.js";

const REASONS = {offline: "on offline nodes", cordoned: "on cordoned nodes", lost: "lost",
  allocated: "allocated by a scheduler", held: "held by a process", busy: "in use", filtered: "not matching"};

export function freeQuery(form) {
  const q = new URLSearchParams();
  for (const name of ["count", "min_free_mem", "model"]) {
    const v = form.elements[name].value.trim();
    if (v) q.set(name, v);
  }
  for (const label of form.elements.label.value.split(",").map((s) => s.trim()).filter(Boolean)) q.append("label", label);
  q.set("limit", "20");
  return q;
}

export async function refreshFree(form) {
  const summary = $("free-summary");
  let answer;
  try {
    answer = await getJson("/api/free?" + freeQuery(form));
  } catch (e) {
    summary.className = "status error";
    summary.textContent = e.message;
    return;
  }
  summary.className = "status";
  const gpus = answer.nodes.reduce((n, node) => n + node.gpus.length, 0);
  const not = Object.entries(answer.excluded).map(([k, n]) => n + " " + (REASONS[k] || k)).join(", ");
  summary.textContent = (gpus ? gpus + " GPU(s) on " + answer.nodes.length + " node(s), most idle first"
    : "No GPU is free that matches") + (not ? " · not offered: " + not : "");
  $("free-count").textContent = answer.free_gpus;
  const rows = [];
  for (const node of answer.nodes) {
    for (const g of node.gpus) {
      const tr = el("tr");
      tr.dataset.gpu = node.node + "/" + g.index;
      for (const v of [node.node, g.index, g.model || "", duration(g.idle_for_s), pct(g.util_pct),
        g.mem_free_mib === null ? "–" : (g.mem_free_mib / 1024).toFixed(1) + " GiB"]) tr.appendChild(el("td", "", v));
      rows.push(tr);
    }
  }
  $("free-table").tBodies[0].replaceChildren(...rows);
  $("free-env").textContent = answer.nodes.map((n) => n.node + ": " + n.env).join("\n");
}

export function setupFree(form) {
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    refreshFree(form);
  });
}
