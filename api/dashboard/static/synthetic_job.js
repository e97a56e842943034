"use strict";
(() => {
  const { api, el, eps, num, when } = dprc;
  const $ = (id) => document.getElementById(id);
  const id = dprc.main().dataset.jobId;
  const base = `/v1/synthetic_data/jobs/${encodeURIComponent(id)}`;
  let job = null;
  let reportShown = false;

  const link = (href, text, extra) => el("a", { href, text, ...(extra || {}) });

  function render() {
    const p = job.privacy;
    $("job-id").textContent = job.id;
    $("job-status").textContent = job.status;
    $("job-status").className = `status ${job.status}`;
    const pct = job.n ? (100 * job.records_done) / job.n : 0;
    const bar = el("span", { class: "progress" }, el("span", {}));
    bar.firstChild.style.width = `${pct}%`;
    const result = job.result_file
      ? link(`/v1/files/${encodeURIComponent(job.result_file)}/content`, `${job.result_file} (download, JSONL)`,
        { id: "result-file", class: "download", download: `${job.id}.jsonl`, "data-file-id": job.result_file })
      : el("span", { class: "muted", text: "written when the job succeeds" });
    const labels = job.labels || {};
    $("job-summary").replaceChildren(el("dl", {},
      el("dt", { text: "Status" }), el("dd", { id: "status-words", text: job.status }),
      el("dt", { text: "Progress" }), el("dd", { id: "progress" }, bar, `${job.records_done} / ${job.n} records`),
      el("dt", { text: "Format" }), el("dd", { id: "format", text: job.format }),
      el("dt", { text: "Model" }), el("dd", { id: "model", text: job.model || "— (its fine-tuning job runs first)" }),
      el("dt", { text: "Fine-tuning job" }), el("dd", {}, link(`/jobs/${encodeURIComponent(job.fine_tuning_job)}`, job.fine_tuning_job), ` (${job.fine_tuning_status})`),
      el("dt", { text: "Training file" }), el("dd", {}, link(`/data-sets/${encodeURIComponent(job.training_file)}`, job.training_file)),
      el("dt", { text: "Labels" }), el("dd", { text: labels.type === "dp" ? `dp: a label histogram released under DP (ε ${num(labels.epsilon)}${labels.noise_multiplier != null ? `, σ ${num(labels.noise_multiplier)}` : ""})` : (labels.type || "—") }),
      el("dt", { text: "Sampling" }), el("dd", { text: `temperature ${num(job.sampling.temperature)}, top-p ${num(job.sampling.top_p)}, at most ${job.sampling.max_tokens} tokens a record; seed ${job.seed}` }),
      el("dt", { text: "Result file" }), el("dd", {}, result),
      el("dt", { text: "Created" }), el("dd", { text: when(job.created_at) }),
      job.error ? [el("dt", { text: "Error" }), el("dd", { class: "error", text: `${job.error.code}: ${job.error.message}` })] : null));
    $("cancel").disabled = dprc.TERMINAL.has(job.status);

    const unit = p.privacy_unit === "user" ? "user (all of their lines)" : "example";
    $("privacy").replaceChildren(
      "(ε = ", el("strong", { id: "epsilon", text: eps(p.epsilon) }), `, δ = ${num(p.delta, 3)})`,
      `-differential privacy for each ${unit} of the training file (budget group ${p.budget_group}).`);
    const ft = link(`/jobs/${encodeURIComponent(job.fine_tuning_job)}`, "the fine-tuning job", { id: "fine-tuning-link" });
    $("composed").replaceChildren(...(labels.type === "dp"
      ? ["One ε, composed from ", ft, " and the label histogram; the records are post-processing and cost nothing more."]
      : ["The ε of ", ft, " alone (no label histogram is released); the records are post-processing."]));

    const hist = p.label_histogram;
    $("histogram").replaceChildren(!hist
      ? el("p", { class: "muted", text: labels.type === "dp" ? "Not drawn yet." : "None: the labels are not drawn from the data." })
      : el("div", { class: "table-wrap" }, el("table", { id: "histogram-table" },
        el("thead", {}, el("tr", {}, el("th", { text: "Class" }), el("th", { text: "Noised count" }))),
        el("tbody", {}, hist.classes.map((c, i) => el("tr", { "data-class": c },
          el("td", { text: c }), el("td", { text: num(hist.noisy_counts[i], 4) })))))));
  }

  async function renderEvents() {
    const page = await api(`${base}/events`);
    $("events").replaceChildren(...page.data.map((e) => el("li", { class: e.level },
      el("time", { text: when(e.created_at) }), e.message)));
  }

  function reportRows(r) {
    const f = r.fidelity, u = r.utility, l = r.leakage || {};
    const d = (k, v, key) => [el("dt", { text: k }), el("dd", { "data-key": key, text: v })];
    const noHoldout = "— (no held-out file: only the leakage checks are computed)";
    const c = r.counts || {}, compared = r.compared_records || {};
    const sub = (l.longest_shared_substring || {}).length;
    return el("dl", { id: "report-table" },
      d("Records compared", `${compared.synthetic ?? c.synthetic} synthetic, ${compared.training ?? c.real_train} training${c.holdout != null ? `, ${c.holdout} held out` : ""}`, "counts"),
      d("Fidelity: two-sample AUC", !f ? noHoldout : f.two_sample_auc == null ? `— ${f.embedding_reason || ""}`
        : `${num(f.two_sample_auc, 3)} (0.5: a classifier cannot tell synthetic from held-out records)`, "auc"),
      d("Fidelity: Fréchet distance", !f ? noHoldout : f.frechet_distance == null ? "—"
        : `${num(f.frechet_distance, 4)} (between the embeddings of synthetic and held-out records; 0: the same)`, "frechet"),
      d("Utility: TSTR vs TRTR", u
        ? `train on synthetic ${num(u.tstr_accuracy, 3)} vs train on real ${num(u.trtr_accuracy, 3)} (majority class ${num(u.majority_accuracy, 3)}; ${u.n_test} held-out records)`
        : f ? "— (classification with an embedding model only)" : noHoldout, "utility"),
      d("Leakage: exact copies", `${l.exact_copies} of the training records`, "exact"),
      d("Leakage: near copies", l.near_copies == null ? "—" : `${l.near_copies} (similarity ≥ ${num(l.near_threshold, 3)}; max ${num(l.max_similarity, 3)})`, "near"),
      d("Leakage: longest shared substring", sub == null ? "—" : `${sub} character${sub === 1 ? "" : "s"}`, "substring"));
  }

  async function showReport() {
    if (reportShown) return;
    const box = $("report");
    try {
      const r = await api(`${base}/report`);
      box.replaceChildren(el("p", { class: "muted small", id: "report-note", text: r.note }), reportRows(r));
      reportShown = true;
    } catch (err) {
      if (err.status === 403) {
        box.replaceChildren(el("p", { class: "muted", id: "report-forbidden", text: "Only admins and data owners see the report." }));
        reportShown = true;
      } else if (err.status === 404 && err.code === "report_not_ready") {
        box.replaceChildren(el("p", { class: "muted", text: "The report is written when the job succeeds." }));
        reportShown = dprc.TERMINAL.has(job.status); // a failed or cancelled job has none
      } else throw err;
    }
  }

  async function refresh() {
    job = await api(base);
    render();
    await renderEvents();
    await showReport();
    dprc.main().dataset.status = job.status;
    return dprc.TERMINAL.has(job.status) && reportShown;
  }

  let stop = dprc.poll(refresh, 1500, $("action-result"));
  $("cancel").addEventListener("click", async () => {
    if (!window.confirm("Cancel this synthetic-data job? What its fine-tuning spent stays spent.")) return;
    const out = $("action-result");
    try {
      job = await api(`${base}/cancel`, { method: "POST" });
      out.replaceChildren(el("p", { class: "ok", text: `cancel: the job is ${job.status}.` }));
      stop();
      stop = dprc.poll(refresh, 1500, out);
    } catch (err) { dprc.showError(out, err); }
  });
})();
