"use strict";
// The tenant's API keys (admins): list, create (the secret shown once), revoke after a
// confirmation — all through /v1/organization/api_keys, which checks the role itself.
(() => {
  const { api, el, when } = dprc;
  const BASE = "/v1/organization/api_keys";
  const mine = dprc.main().dataset.keyId;
  const list = document.getElementById("keys");
  const errors = document.getElementById("keys-error");

  function row(k) {
    const revoked = k.revoked_at !== null && k.revoked_at !== undefined;
    const revoke = revoked ? null : el("button", {
      type: "button", class: "danger revoke", "data-key-id": k.id, text: "Revoke",
    });
    if (revoke) revoke.addEventListener("click", () => revokeKey(k));
    return el("tr", { "data-key-id": k.id, "data-role": k.role, "data-state": revoked ? "revoked" : "active" },
      el("td", { text: k.name || "—" }),
      el("td", {}, el("code", { text: k.id }), k.id === mine ? el("span", { class: "muted", text: " (this session)" }) : null),
      el("td", {}, el("code", { text: `${k.prefix}…` })),
      el("td", {}, el("span", { class: `role ${k.role}`, text: k.role })),
      el("td", { text: when(k.created_at) }),
      el("td", { text: k.created_by || "server shell" }),
      el("td", {}, el("span", { class: `status ${revoked ? "cancelled" : "succeeded"}`, text: revoked ? `revoked ${when(k.revoked_at)}` : "active" })),
      el("td", {}, revoke));
  }

  async function load() {
    const keys = await dprc.all(BASE);
    list.replaceChildren(keys.length === 0 ? el("p", { class: "muted", text: "No keys." })
      : el("div", { class: "table-wrap" }, el("table", { id: "key-table" },
        el("thead", {}, el("tr", {}, ["Name", "Id", "Prefix", "Role", "Created", "Created by", "State", ""].map((h) => el("th", { text: h })))),
        el("tbody", {}, keys.map(row)))));
  }

  async function revokeKey(k) {
    const self = k.id === mine ? " It is the key of this session: you will be signed out." : "";
    if (!window.confirm(`Revoke the ${k.role} key ${k.name || k.id}? It stops working at once.${self}`)) return;
    try {
      await api(`${BASE}/${encodeURIComponent(k.id)}`, { method: "DELETE" });
      errors.replaceChildren();
      await load();
    } catch (err) { dprc.showError(errors, err); }
  }

  document.getElementById("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = document.getElementById("key-result");
    const name = document.getElementById("key-name").value.trim();
    const body = { role: document.getElementById("key-role").value };
    if (name) body.name = name;
    try {
      const k = await api(BASE, { method: "POST", json: body });
      out.replaceChildren(el("div", { class: "card secret", id: "new-key", "data-key-id": k.id },
        el("p", { class: "ok", text: `Created the ${k.role} key ${k.id}. Copy its secret now: it is not shown again.` }),
        el("p", {}, el("code", { id: "new-key-secret", text: k.key }))));
      ev.target.reset();
      await load();
    } catch (err) { dprc.showError(out, err); }
  });

  load().catch((err) => dprc.showError(list, err));
})();
