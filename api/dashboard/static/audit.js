"use strict";
// The tenant's audit log (admins), a page at a time from /v1/organization/audit_logs, filtered
// by action and key; the API checks the role itself.
(() => {
  const { api, el, when } = dprc;
  const PAGE = 50;
  const table = document.getElementById("audit-entries");
  const next = document.getElementById("audit-next");
  const first = document.getElementById("audit-first");
  let filters = {};
  let after = null; // the cursor of the page shown (null: the first)
  let lastId = null;

  function query(cursor) {
    const q = new URLSearchParams({ limit: String(PAGE) });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    if (cursor) q.set("after", cursor);
    return `/v1/organization/audit_logs?${q}`;
  }

  function entry(e) {
    return el("tr", { "data-entry-id": e.id, "data-action": e.action, "data-resource": e.resource || "" },
      el("td", { text: when(e.created_at) }),
      el("td", {}, el("code", { text: e.action })),
      el("td", {}, e.resource ? el("code", { text: e.resource }) : "—"),
      el("td", {}, e.key_id ? el("code", { text: e.key_id }) : "—"),
      el("td", { text: e.role || "—" }),
      el("td", { class: "detail", text: JSON.stringify(e.detail || {}) }),
      el("td", {}, e.request_id ? el("code", { class: "small", text: e.request_id }) : "—"),
      el("td", {}, el("code", { class: "small", title: e.hash, text: (e.hash || "").slice(0, 12) })));
  }

  async function show(cursor) {
    const page = await api(query(cursor));
    after = cursor;
    lastId = page.last_id || (page.data.length ? page.data[page.data.length - 1].id : null);
    table.replaceChildren(page.data.length === 0
      ? el("p", { class: "muted", id: "audit-empty", text: "No entries." })
      : el("div", { class: "table-wrap" }, el("table", { id: "audit-table" },
        el("thead", {}, el("tr", {}, ["Time", "Action", "Resource", "Key", "Role", "Detail", "Request", "Hash"].map((h) => el("th", { text: h })))),
        el("tbody", {}, page.data.map(entry)))));
    next.disabled = !page.has_more;
    first.disabled = after === null;
  }

  async function keyOptions() {
    const select = document.getElementById("audit-key");
    const keys = await dprc.all("/v1/organization/api_keys");
    select.append(...keys.map((k) => el("option", { value: k.id, text: `${k.name ? `${k.name} · ` : ""}${k.id} (${k.role})` })));
  }

  const fail = (err) => dprc.showError(table, err);
  document.getElementById("audit-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    filters = {
      action: document.getElementById("audit-action").value,
      key_id: document.getElementById("audit-key").value,
    };
    show(null).catch(fail);
  });
  next.addEventListener("click", () => { if (lastId) show(lastId).catch(fail); });
  first.addEventListener("click", () => show(null).catch(fail));

  keyOptions().catch(() => {}); // the filter by key is a convenience: the log shows without it
  show(null).catch(fail);
})();
