"use strict";
// The data sets: one card per budget group (a budget covers every upload that shares an example
// with it), its uploads inside; the queue of uploads waiting for a data owner, each with its
// overlap report and the owner's decisions (approve as a new budget, join a group, reject).
// The API checks the role itself: a trainer's or viewer's decision is shown its 403.
(() => {
  const { api, all, el, num } = dprc;
  const list = document.getElementById("files");
  const queue = document.getElementById("pending");
  const role = document.querySelector("main").dataset.role;
  const decides = role === "admin" || role === "data_owner";

  function noBudgetWords(files) {
    return files.every((f) => f.unbudgeted)
      ? "Validation-only data: no privacy budget, and no job may train on it."
      : "No privacy budget: this server does not require one, so jobs on it are not limited.";
  }

  function groupCard(groupId, files) {
    const budget = files[0].budget;
    const users = files[0].n_users != null;
    return el("article", { class: "card file group", "data-budget-group": groupId },
      el("div", { class: "file-head" },
        el("h2", { text: files.length === 1 ? files[0].filename : `${files[0].filename} and ${files.length - 1} more` }),
        el("span", { class: "muted", text: `budget group ${groupId}${users ? " · per user" : ""}` })),
      budget ? [dprc.budgetBar(budget), dprc.budgetWords(budget)] : el("p", { class: "muted", text: noBudgetWords(files) }),
      el("ul", { class: "uploads" }, files.map((f) => el("li", { "data-file-id": f.id },
        el("a", { href: `/data-sets/${encodeURIComponent(f.id)}`, text: f.filename }),
        el("span", { class: "muted", text: ` ${f.id} · ${dprc.sizeWords(f)} · ${f.format}` })))));
  }

  function overlapWords(f) {
    const report = f.approval.report || { groups: [] };
    if (report.groups.length === 0) return "Shares no example with an existing data set.";
    const words = (g) => `${g.shared_examples} of its ${report.distinct_examples} examples with ${g.budget_group}`
      + (g.near_duplicates ? `, and ${g.near_duplicates} near copies of its examples` : "")
      + (g.shared_users ? `, naming ${g.shared_users} of its users` : "");
    return "Shares " + report.groups.map(words).join("; ") + ".";
  }

  // the pairs of near copies (their texts reach data owners only)
  function nearPairs(f) {
    const pairs = ((f.approval.report || { groups: [] }).groups).flatMap((g) => (g.examples || []).map((e) => ({ ...e, group: g.budget_group })));
    if (pairs.length === 0) return null;
    return el("details", { class: "near-pairs" }, el("summary", { text: "Near copies, side by side" }),
      el("ul", {}, pairs.map((e) => el("li", {}, `line ${e.line}: “${e.text}” ≈ “${e.group_text}” in ${e.group} (Jaccard ${num(e.jaccard, 3)})`))));
  }

  function pendingCard(f, groups) {
    const asked = f.approval.requested_budget;
    const out = el("div", { class: "result", role: "status" });
    const reason = el("input", { type: "text", name: "reason", class: "reason", placeholder: "why (kept in the audit log)", required: true });
    const epsilon = el("input", { type: "number", name: "epsilon_budget", class: "epsilon", step: "any", min: "0", max: "100", value: asked && asked.epsilon != null ? asked.epsilon : "" });
    const delta = el("input", { type: "number", name: "delta", class: "delta", step: "any", min: "0", max: "1", placeholder: "default 1/N^1.1" });
    const join = el("select", { name: "budget_group", class: "join" },
      el("option", { value: "", text: "— a new data set, with the budget above —" }),
      groups.map((g) => el("option", { value: g, text: `join ${g}` })));
    const shared = (f.approval.report || { groups: [] }).groups;
    if (shared.length > 0) join.value = shared[0].budget_group;
    async function decide(path, body) {
      try {
        await api(`/v1/files/${encodeURIComponent(f.id)}/${path}`, { method: "POST", json: body });
        await load();
      } catch (err) { dprc.showError(out, err); }
    }
    const form = el("form", { class: "grid-form decide" },
      el("label", {}, "Budget ε ", epsilon), el("label", {}, "δ ", delta),
      el("label", {}, "or ", join), el("label", {}, "Reason ", reason),
      el("button", { type: "submit", class: "approve", text: "Approve" }),
      el("button", { type: "button", class: "reject danger", text: "Reject" }));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const body = { reason: reason.value.trim() };
      if (join.value) body.budget_group = join.value;
      else {
        if (epsilon.value.trim()) body.epsilon_budget = Number(epsilon.value);
        if (delta.value.trim()) body.delta = Number(delta.value);
      }
      decide("approve", body);
    });
    form.querySelector(".reject").addEventListener("click", () => {
      if (!window.confirm(`Reject ${f.filename}? Its content is deleted.`)) return;
      decide("reject", { reason: reason.value.trim() });
    });
    return el("article", { class: "card file pending", "data-file-id": f.id },
      el("div", { class: "file-head" },
        el("h2", {}, el("a", { href: `/data-sets/${encodeURIComponent(f.id)}`, text: f.filename })),
        el("span", { class: "muted", text: `${f.id} · ${dprc.sizeWords(f)} · ${f.format} · uploaded by ${f.created_by || "—"}` })),
      el("p", { class: "asked", text: asked && asked.epsilon != null ? `The uploader asked for ε ${num(asked.epsilon)}${asked.delta != null ? ` at δ ${num(asked.delta, 3)}` : ""}.` : "The uploader asked for no budget." }),
      el("p", { class: "overlap", text: overlapWords(f) }),
      nearPairs(f),
      decides ? [form, out] : el("p", { class: "muted read-only", text: "A data owner or an admin of the tenant decides." }));
  }

  async function load() {
    const files = await all("/v1/files?purpose=fine-tune");
    const pending = files.filter((f) => f.approval.status === "pending");
    const groups = new Map();
    for (const f of files) {
      if (f.approval.status !== "approved" || !f.budget_group) continue;
      if (!groups.has(f.budget_group)) groups.set(f.budget_group, []);
      groups.get(f.budget_group).push(f);
    }
    const budgeted = [...groups.entries()].filter(([, fs]) => fs[0].budget).map(([g]) => g);
    queue.replaceChildren(...(pending.length === 0
      ? [el("p", { class: "muted", text: "No upload is waiting for a data owner." })]
      : pending.map((f) => pendingCard(f, budgeted))));
    list.replaceChildren(...(groups.size === 0
      ? [el("p", { class: "muted", text: "No data sets yet: upload one below." })]
      : [...groups.entries()].map(([g, fs]) => groupCard(g, fs))));
  }

  document.getElementById("upload").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const out = document.getElementById("upload-result");
    const file = document.getElementById("upload-file").files[0];
    const form = new FormData();
    form.append("purpose", "fine-tune");
    form.append("file", file, file.name);
    const epsilon = document.getElementById("upload-epsilon").value.trim();
    const delta = document.getElementById("upload-delta").value.trim();
    if (epsilon) form.append("epsilon_budget", epsilon);
    if (delta) form.append("delta", delta);
    out.replaceChildren(el("p", { class: "muted", text: "Uploading…" }));
    try {
      const f = await api("/v1/files", { method: "POST", form });
      const waits = f.approval.status === "pending";
      out.replaceChildren(el("p", { class: "ok", id: "uploaded", "data-file-id": f.id },
        `Uploaded ${f.filename} as ${f.id}: ${f.n_examples} examples`,
        waits ? ": it waits for a data owner's approval before any job trains on it."
          : f.budget ? `, budget ε ${num(f.budget.epsilon)} at δ ${num(f.budget.delta, 3)}.` : "."));
      ev.target.reset();
      await load();
    } catch (err) { dprc.showError(out, err); }
  });

  load().catch((err) => dprc.showError(list, err));
})();
