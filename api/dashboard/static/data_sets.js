"use strict";
(() => {
  const { api, el, num } = dprc;
  const list = document.getElementById("files");

  async function load() {
    const files = (await api("/v1/files?purpose=fine-tune")).data;
    if (files.length === 0) {
      list.replaceChildren(el("p", { class: "muted", text: "No data sets yet: upload one below." }));
      return;
    }
    list.replaceChildren(...files.map((f) => el("article", { class: "card file", "data-file-id": f.id },
      el("div", { class: "file-head" },
        el("h2", {}, el("a", { href: `/data-sets/${encodeURIComponent(f.id)}`, text: f.filename })),
        el("span", { class: "muted", text: `${f.id} · ${dprc.sizeWords(f)} · ${f.format}` })),
      f.budget
        ? [dprc.budgetBar(f.budget), dprc.budgetWords(f.budget)]
        : el("p", { class: "muted", text: "No privacy budget: jobs on it are not limited." }))));
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
      out.replaceChildren(el("p", { class: "ok", id: "uploaded", "data-file-id": f.id },
        `Uploaded ${f.filename} as ${f.id}: ${f.n_examples} examples`,
        f.budget ? `, budget ε ${num(f.budget.epsilon)} at δ ${num(f.budget.delta, 3)}.` : "."));
      ev.target.reset();
      await load();
    } catch (err) { dprc.showError(out, err); }
  });

  load().catch((err) => dprc.showError(list, err));
})();
