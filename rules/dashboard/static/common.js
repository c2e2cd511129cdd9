// What every page shares: DOM helpers (text only, never HTML), formats, fetching JSON.
"use strict";

export const $ = (id) => document.getElementById(id);

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return d + "d " + h + "h";
  if (h) return h + "h " + m + "m";
  return m + "m";
}

export function clock(iso) {
  if (!iso) return "";
  const t = new Date(iso);
  return isNaN(t) ? String(iso) : t.toLocaleString([], {month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"});
}

export function pct(value) {
  return value === null || value === undefined ? "–" : Math.round(value) + " %";
}

const formats = new Map();

export function money(value, currency) {
  const code = currency || "USD";
  let f = formats.get(code);
  if (f === undefined) {
    try {
      f = new Intl.NumberFormat("en-US", {style: "currency", currency: code});
    } catch (e) {
      f = null;  // not an ISO code: the amount, then the code
    }
    formats.set(code, f);
  }
  return f ? f.format(value) : value.toFixed(2) + " " + code;
}

export function natural(a, b) {
  return String(a).localeCompare(String(b), undefined, {numeric: true});
}

export async function getJson(path) {
  const response = await fetch(path, {cache: "no-store"});
  if (!response.ok) throw new Error(path.split("?")[0] + ": HTTP " + response.status + " " + (await response.text()));
  return response.json();
}

export function params() {
  return new URLSearchParams(window.location.search);
}

// Timings the benchmark (benchmarks/dashboard_scale.py) and the tests read.
export const timings = {firstFleetMs: null, firstTimelineMs: null, firstQuarterMs: null, updates: []};
window.gpuevents = {timings};
