/* Shared by every page: the JSON API through fetch (the session cookie, the CSRF header),
   DOM helpers, number formats. */
"use strict";
const dprc = (() => {
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

  class ApiError extends Error {
    constructor(status, body) {
      const e = body && body.error;
      super(e && e.message ? e.message : `HTTP ${status}`);
      this.status = status;
      this.param = e ? e.param : null;
      this.code = e ? e.code : null;
    }
  }

  async function api(path, { method = "GET", json, form } = {}) {
    const headers = { "X-DPRC-Dashboard": "1", Accept: "application/json" };
    let body;
    if (form) body = form;
    else if (json !== undefined) { headers["Content-Type"] = "application/json"; body = JSON.stringify(json); }
    const r = await fetch(path, { method, headers, body, credentials: "same-origin" });
    const raw = await r.text();
    let data = null;
    try { data = raw ? JSON.parse(raw) : null; } catch (_) { data = null; }
    if (r.status === 401 && data && data.error && data.error.code === "invalid_session") {
      location.assign("/sign-in");
    }
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
  }

  // every item of a cursor-paginated list (``after`` + ``has_more``)
  async function all(path, limit = 100) {
    const out = [];
    let after = null;
    for (;;) {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api(`${path}${sep}limit=${limit}${after ? `&after=${encodeURIComponent(after)}` : ""}`);
      out.push(...page.data);
      if (!page.has_more || page.data.length === 0) return out;
      after = page.data[page.data.length - 1].id;
    }
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const main = () => document.getElementById("main");
  const eps = (v) => (v === null || v === undefined ? "∞ (no finite bound)" : Number(v).toFixed(3));
  const num = (v, p = 4) => (v === null || v === undefined ? "—" : String(Number(Number(v).toPrecision(p))));
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "—");

  function showError(target, err) {
    target.replaceChildren(el("p", { class: "error", role: "alert", text: err.message || String(err) }));
  }

  // a bar of the budget: spent | reserved | remaining, widths proportional to ε
  function budgetBar(budget) {
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("class", "bar");
    svg.setAttribute("viewBox", "0 0 1000 22");
    svg.setAttribute("preserveAspectRatio", "none");
    const total = budget.epsilon;
    const spent = budget.spent === null ? total : Math.min(budget.spent, total);
    const committed = budget.committed === null ? total : Math.min(budget.committed, total);
    const parts = [
      ["spent", 0, spent], ["reserved", spent, committed - spent], ["remaining", committed, total - committed],
    ];
    for (const [cls, from, width] of parts) {
      const r = document.createElementNS(NS, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", String((from / total) * 1000));
      r.setAttribute("width", String(Math.max(0, (width / total) * 1000)));
      r.setAttribute("y", "0");
      r.setAttribute("height", "22");
      r.setAttribute("data-epsilon", String(width));
      svg.appendChild(r);
    }
    return svg;
  }

  function budgetWords(budget) {
    return el("p", { class: "budget-words" },
      el("span", { class: "key spent", text: "spent" }), ` ε ${eps(budget.spent)} · `,
      el("span", { class: "key reserved", text: "reserved" }), ` ε ${eps(budget.reserved)} · `,
      el("span", { class: "key remaining", text: "remaining" }), ` ε ${eps(budget.remaining)} `,
      `of ε ${num(budget.epsilon)} at δ ${num(budget.delta, 3)}`,
      budget.unit === "user" ? " per user (all of one user's lines)" : " per example");
  }

  // "N examples", and "from U users (at most M lines each)" when the lines name their users
  function sizeWords(f) {
    const users = f.n_users != null ? ` from ${f.n_users} users (at most ${f.max_lines_per_user} lines each, field ${f.user_field})` : "";
    return `${f.n_examples} examples${users}`;
  }

  // call ``fn`` now and every ``ms`` until it returns true; errors are shown in ``errorBox``
  function poll(fn, ms, errorBox) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      try {
        if (await fn()) { stopped = true; return; }
      } catch (err) { if (errorBox) showError(errorBox, err); }
      setTimeout(tick, ms);
    }
    tick();
    return () => { stopped = true; };
  }

  return { api, all, el, main, eps, num, when, showError, budgetBar, budgetWords, sizeWords, poll, TERMINAL, ApiError };
})();
