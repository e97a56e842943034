"use strict";
(() => {
  const { api, el, eps, num, when } = dprc;
  const $ = (id) => document.getElementById(id);
  const body = document.querySelector("#synthetic-jobs tbody");

  dprc.poll(async () => {
    const jobs = await dprc.all("/v1/synthetic_data/jobs");
    if (jobs.length === 0) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted", text: "No synthetic-data jobs yet." })));
      return false;
    }
    body.replaceChildren(...jobs.map((j) => {
      const pct = j.n ? (100 * j.records_done) / j.n : 0;
      const bar = el("span", { class: "progress" }, el("span", {}));
      bar.firstChild.style.width = `${pct}%`;
      return el("tr", { "data-job-id": j.id, "data-status": j.status },
        el("td", {}, el("a", { href: `/synthetic/${encodeURIComponent(j.id)}`, text: j.id })),
        el("td", {}, el("span", { class: `status ${j.status}`, text: j.status })),
        el("td", { text: j.format }),
        el("td", { class: "records" }, bar, `${j.records_done} / ${j.n}`),
        el("td", { class: "epsilon", text: `${eps(j.privacy.epsilon)} at δ ${num(j.privacy.delta, 3)}` }),
        el("td", { text: when(j.created_at) }));
    }));
    return false;
  }, 2000, body);

  // suggestions: the tenant's fine-tune data sets and the allow-listed causal LMs
  api("/v1/files?purpose=fine-tune").then((page) => {
    $("syn-files").replaceChildren(...page.data.map((f) => el("option", { value: f.id, text: f.filename })));
  }, () => {});
  api("/v1/models").then((page) => {
    $("syn-models").replaceChildren(...page.data.filter((m) => !m.id.startsWith("ft:"))
      .map((m) => el("option", { value: m.id })));
  }, () => {});

  $("synthetic-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const errorBox = $("syn-error");
    errorBox.hidden = true;
    const file = $("syn-training-file").value.trim();
    const model = $("syn-model").value.trim();
    const request = { n: Number($("syn-n").value), labels: $("syn-labels").value };
    if (file && model) {
      errorBox.textContent = "Give a training file or an ft: model, not both.";
      errorBox.hidden = false;
      return;
    }
    if (model) request.model = model;
    else {
      request.training_file = file;
      request.fine_tuning = { model: $("syn-base-model").value.trim(),
        privacy: { target_epsilon: Number($("syn-epsilon").value) } };
    }
    try {
      const job = await api("/v1/synthetic_data/jobs", { method: "POST", json: request });
      location.assign(`/synthetic/${encodeURIComponent(job.id)}`);
    } catch (err) {
      errorBox.textContent = err.message + (err.param ? ` (${err.param})` : "");
      errorBox.hidden = false;
    }
  });
})();
