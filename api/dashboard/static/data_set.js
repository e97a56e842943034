"use strict";
(() => {
  const { api, el, eps, num, when } = dprc;
  const id = dprc.main().dataset.fileId;
  const base = `/v1/files/${encodeURIComponent(id)}`;
  const summary = document.getElementById("file-summary");

  // the budget's δ against this file's N (its users for a per-user budget): above 1/(10·N) it is
  // warned about, as a job's privacy.warnings does (service/budget/planning.py, delta_warnings)
  function deltaWarning(f) {
    const b = f.budget;
    const n = b && (b.unit === "user" ? f.n_users : f.n_examples);
    if (!b || !n || b.delta <= 1 / (10 * n)) return [];
    const units = b.unit === "user" ? "users" : "examples";
    return [el("p", { class: "warning", id: "delta-warning", "data-warning": "delta_large",
      text: `delta_large: the budget's δ ${num(b.delta, 3)} is above 1/(10·N) = ${num(1 / (10 * n), 2)} for N = ${n} ${units}: δ is the probability the guarantee may fail, up to releasing each of the ${units} whole (N·δ = ${num(n * b.delta, 2)} in expectation). A data owner or an admin may set a smaller δ.` })];
  }

  async function load() {
    const [f, history] = await Promise.all([api(base), api(`${base}/budget/history`)]);
    document.getElementById("file-name").textContent = f.filename;
    summary.replaceChildren(
      el("p", { class: "muted", text: `${f.id} · ${dprc.sizeWords(f)} · ${f.format} · uploaded ${when(f.created_at)}` }),
      ...(f.budget_group ? [el("p", { class: "muted small", id: "budget-group", "data-group": f.budget_group,
        text: `Budget group ${f.budget_group}: every upload that shares an example with this one shares this budget.` })] : []),
      ...(f.deleted ? [el("p", { class: "muted", id: "file-deleted", text: `Content deleted ${when(f.deleted_at)}; its budget and history remain.` })] : []),
      ...deltaWarning(f),
      ...(f.budget ? [dprc.budgetBar(f.budget), dprc.budgetWords(f.budget)]
        : [el("p", { class: "muted", text: `No privacy budget; ε below is at the default δ ${num(history.delta, 3)}.` })]));
    const t = (p) => (p.created_at - f.created_at) / 60;
    dprcChart.line(document.getElementById("history-chart"), {
      xLabel: "time since upload (minutes)", yLabel: `composed ε (δ = ${num(history.delta, 3)})`,
      xMin: 0, xMax: Math.max(t({ created_at: Date.now() / 1000 }), 1),
      series: [
        { key: "committed", label: "committed", step: true, color: 3, points: history.data.map((p) => [t(p), p.committed]) },
        { key: "spent", label: "spent", step: true, color: 2, points: history.data.map((p) => [t(p), p.spent]) },
      ],
      budget: f.budget ? { y: f.budget.epsilon, label: `budget ε ${num(f.budget.epsilon)}` } : null,
      empty: "no job has used this data set yet",
    });
    const rows = history.data.map((p) => el("tr", {},
      el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(p.job_id)}`, text: p.job_id })),
      el("td", {}, el("span", { class: `status ${p.job_status}`, text: p.job_status })),
      el("td", { text: when(p.created_at) }),
      el("td", { text: eps(p.job_epsilon_spent) }),
      el("td", { text: eps(p.spent) }),
      el("td", { text: eps(p.committed) })));
    document.getElementById("file-jobs").replaceChildren(rows.length
      ? el("div", { class: "table-wrap" }, el("table", { id: "charges" },
        el("thead", {}, el("tr", {}, ["Job", "Status", "Created", "ε of the job (ran)", "composed ε spent", "composed ε committed"].map((h) => el("th", { text: h })))),
        el("tbody", {}, rows)))
      : el("p", { class: "muted", text: "None yet." }));
  }

  // the budget change: rendered by the server for admins only (the API refuses the others);
  // the reason is required and goes to the audit log with the change
  const form = document.getElementById("budget-form");
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const out = document.getElementById("budget-result");
      const body = { reason: document.getElementById("budget-reason").value.trim() };
      const epsilon = document.getElementById("budget-epsilon").value.trim();
      const delta = document.getElementById("budget-delta").value.trim();
      if (!body.reason) {
        out.replaceChildren(el("p", { class: "error", role: "alert", text: "Give the reason for the change." }));
        return;
      }
      if (epsilon) body.epsilon_budget = Number(epsilon);
      if (delta) body.delta = Number(delta);
      try {
        const f = await api(`${base}/budget`, { method: "POST", json: body });
        out.replaceChildren(el("p", { class: "ok", id: "budget-changed" },
          f.budget ? `Budget now ε ${num(f.budget.epsilon)} at δ ${num(f.budget.delta, 3)}.` : "Budget changed."));
        form.reset();
        await load();
      } catch (err) { dprc.showError(out, err); }
    });
  }

  load().catch((err) => dprc.showError(summary, err));
})();
