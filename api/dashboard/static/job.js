"use strict";
(() => {
  const { api, el, eps, num, when } = dprc;
  const id = dprc.main().dataset.jobId;
  const base = `/v1/fine_tuning/jobs/${encodeURIComponent(id)}`;
  const seen = new Set(); // ids of the events in ``events``
  const events = []; // every event seen, oldest first (the API's order, reversed)
  let planned = null; // [[step, ε]] from the accountant, computed once per job
  let job = null;
  let ckptPoints = []; // [[step, ε]] of the checkpoints: the exact ε at their steps

  const STEP = /^Step \d+\/\d+$/; // the worker's progress events (service/job_runs.record_progress)
  const WORDS = {
    exact: "exact per-example gradient norms",
    hutch: "randomized: each example's gradient norm is estimated with a Hutchinson sketch",
    hutchpp: "randomized: each example's gradient norm is estimated with a Hutch++ sketch",
    auto: "chosen per layer (exact or a sketch); accounted as the randomized sketch, the larger ε",
  };

  // the API lists the newest first: page back to an event already seen, then append
  async function newEvents() {
    const fresh = [];
    let after = null;
    for (;;) {
      const page = await api(`${base}/events?limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`);
      let known = false;
      for (const e of page.data) {
        if (seen.has(e.id)) { known = true; break; }
        fresh.push(e);
      }
      if (known || !page.has_more || page.data.length === 0) break;
      after = page.data[page.data.length - 1].id;
    }
    for (const e of fresh.reverse()) { seen.add(e.id); events.push(e); }
  }

  async function plannedCurve(p) {
    const acc = p.accountant || {};
    if (p.noise.mechanism !== "gaussian") return [[p.steps, p.planned_epsilon]];
    const n = Math.min(12, p.steps);
    const steps = [...new Set(Array.from({ length: n }, (_, i) => Math.max(1, Math.round(((i + 1) * p.steps) / n))))];
    const results = await Promise.all(steps.map((s) => api("/v1/accountant/epsilon", {
      method: "POST",
      json: {
        noise_multiplier: p.noise_multiplier, sample_rate: p.sample_rate, steps: s, delta: p.target_delta,
        clipping: acc.clipping, k: acc.k, sketch: acc.sketch || "shared",
      },
    })));
    return [[0, 0], ...results.map((r) => [r.steps, r.epsilon])];
  }

  function privacyWords(p) {
    const acc = p.accountant || {};
    const rows = [
      ["Guarantee", `(ε = ${num(p.target_epsilon)}, δ = ${num(p.target_delta, 3)})-differential privacy at most, for adding or removing one example of the data set (planned ε ${num(p.planned_epsilon)}).`],
      ["δ", `${num(p.target_delta, 3)}: the small probability allowed for the guarantee to fail; at most 1/N for N = ${p.dataset_size} examples.`],
      ["Noise σ", `${num(p.noise_multiplier)} × the clipping norm ${num(p.max_grad_norm)}: the standard deviation of the Gaussian noise added once per batch to the summed, clipped gradients.`],
      ["Noise mechanism", p.noise.mechanism === "gaussian"
        ? "Gaussian (DP-SGD): independent noise at each step."
        : `ν-DP-FTRL: noise correlated across steps (ν = ${num(p.noise.nu)}), examples in a fixed shuffled order, no sampling amplification.`],
      ["Sampling q", p.noise.mechanism === "gaussian"
        ? `${num(p.sample_rate)}: each example joins each batch independently with this probability (Poisson sampling), about ${Math.round(p.sample_rate * p.dataset_size)} examples per batch.`
        : `${num(p.sample_rate)} (fixed-order batches).`],
      ["Steps", `${p.steps} noisy steps.`],
      ["Clipping", `each example's gradient is scaled to norm at most ${num(p.max_grad_norm)}; method ${p.clipping.method}${p.clipping.k ? ` with k = ${p.clipping.k} projections` : ""}${p.clipping.sketch === "per_example" ? ", drawn independently for each example" : ""}: ${WORDS[p.clipping.method] || p.clipping.method}.`],
      ["Accounted as", `${acc.clipping || "exact"}${acc.k ? `, k = ${acc.k}` : ""}${(acc.clipping || "exact") === "exact" ? "" : acc.sketch === "per_example" ? ", per-example sketches (hidden-scale model)" : ", shared sketch"} (${acc.sampling || "—"} sampling, ${acc.adjacency || "—"}).`],
      ["Training loss", p.report_train_loss ? "reported: it is computed on the private data and is not covered by the guarantee." : "not reported."],
    ];
    document.getElementById("privacy-words").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  }

  function render() {
    const p = job.privacy;
    document.getElementById("job-id").textContent = job.id;
    const status = document.getElementById("job-status");
    status.textContent = job.status;
    status.className = `status ${job.status}`;
    const pct = job.steps_total ? (100 * job.steps_done) / job.steps_total : 0;
    const bar = el("span", { class: "progress" }, el("span", {}));
    bar.firstChild.style.width = `${pct}%`;
    document.getElementById("job-summary").replaceChildren(el("dl", {},
      el("dt", { text: "Model" }), el("dd", { text: job.model + (job.fine_tuned_model ? ` → ${job.fine_tuned_model}` : "") }),
      el("dt", { text: "Data set" }), el("dd", {}, el("a", { href: `/data-sets/${encodeURIComponent(job.training_file)}`, text: job.training_file })),
      el("dt", { text: "Progress" }), el("dd", { id: "progress" }, bar, `step ${job.steps_done} / ${job.steps_total}`),
      el("dt", { text: "ε spent" }), el("dd", { id: "epsilon-spent" }, `${eps(p.epsilon_spent)} of the target ${num(p.target_epsilon)}`),
      el("dt", { text: "Created" }), el("dd", { text: when(job.created_at) }),
      job.error ? [el("dt", { text: "Error" }), el("dd", { class: "error", text: `${job.error.code}: ${job.error.message}` })] : null));
    const active = !dprc.TERMINAL.has(job.status);
    document.getElementById("cancel").disabled = !active;
    document.getElementById("pause").disabled = !(job.status === "queued" || job.status === "running") || job.pause_requested;
    document.getElementById("resume").disabled = job.status !== "paused";

    const ordered = events;
    const progress = ordered.filter((e) => e.type === "metrics" && STEP.test(e.message) && e.data);
    const at = (key) => progress.filter((e) => typeof e.data[key] === "number").map((e) => [e.data.step, e.data[key]]);
    dprcChart.line(document.getElementById("chart-epsilon"), {
      xLabel: "step", yLabel: `ε spent (δ = ${num(p.target_delta, 3)})`, xMin: 0, xMax: job.steps_total,
      series: [
        { key: "actual", label: "actual", points: at("epsilon_spent") },
        { key: "planned", label: "planned", points: planned || [], dots: false },
        { key: "checkpoints", label: "at checkpoints", color: 2, line: false, points: ckptPoints },
      ],
      budget: { y: p.target_epsilon, label: `target ε ${num(p.target_epsilon)}` },
    });
    dprcChart.line(document.getElementById("chart-loss"), {
      xLabel: "step", yLabel: "train loss (nats)", xMin: 0, xMax: job.steps_total,
      series: [{ key: "loss", label: "train loss", points: at("train_loss") }],
      empty: p.report_train_loss ? "no steps yet" : "not reported for this job",
    });
    dprcChart.line(document.getElementById("chart-clipped"), {
      xLabel: "step", yLabel: "clipped fraction", xMin: 0, xMax: job.steps_total,
      series: [{ key: "clipped", label: "fraction of examples clipped", points: at("clipped_fraction") }],
    });
    dprcChart.line(document.getElementById("chart-dropped"), {
      xLabel: "step", yLabel: "dropped samples", xMin: 0, xMax: job.steps_total,
      series: [{ key: "dropped", label: "samples dropped", color: 2, points: at("dropped") }],
    });
    const list = document.getElementById("events");
    list.replaceChildren(...ordered.slice().reverse().map((e) => el("li", { class: e.level, "data-event-id": e.id },
      el("time", { text: when(e.created_at) }), e.message)));
  }

  function renderCheckpoints(ckpts) {
    const box = document.getElementById("checkpoints");
    if (ckpts.length === 0) { box.replaceChildren(el("p", { class: "muted", text: "None yet." })); return; }
    box.replaceChildren(el("div", { class: "table-wrap" }, el("table", { id: "checkpoint-table" },
      el("thead", {}, el("tr", {}, ["Step", "ε at this step", "Created", "Archive"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ckpts.sort((a, b) => a.step_number - b.step_number).map((c) => el("tr", { "data-step": c.step_number },
        el("td", { text: c.step_number }), el("td", { text: eps(c.epsilon) }), el("td", { text: when(c.created_at) }),
        el("td", {}, el("a", {
          href: `/v1/files/${encodeURIComponent(c.file_id)}/content`, download: `${job.id}-step-${c.step_number}.tar`,
          class: "download", "data-file-id": c.file_id, text: "download (.tar)",
        }))))))));
  }

  async function refresh() {
    job = await api(base);
    await newEvents();
    if (planned === null) planned = await plannedCurve(job.privacy).catch(() => []);
    const ckpts = await dprc.all(`${base}/checkpoints`);
    ckptPoints = ckpts.map((c) => [c.step_number, c.epsilon]).sort((a, b) => a[0] - b[0]);
    render();
    renderCheckpoints(ckpts);
    privacyWords(job.privacy);
    dprc.main().dataset.status = job.status;
    return dprc.TERMINAL.has(job.status);
  }

  let stop = dprc.poll(refresh, 1500, document.getElementById("action-result"));
  const ledger = document.getElementById("ledger");
  ledger.href = `${base}/ledger`;
  ledger.download = `${id}-ledger.json`;

  for (const [action, question] of [
    ["cancel", "Cancel this job? Steps that ran stay spent; the rest of its reservation is released."],
    ["pause", "Pause this job? A running job stops after the current step, with a checkpoint; its reservation stays."],
    ["resume", "Resume this job from its last checkpoint?"],
  ]) {
    document.getElementById(action).addEventListener("click", async () => {
      if (!window.confirm(question)) return;
      const out = document.getElementById("action-result");
      try {
        job = await api(`${base}/${action}`, { method: "POST" });
        out.replaceChildren(el("p", { class: "ok", text: `${action}: the job is ${job.status}${job.cancel_requested && job.status === "running" ? " (stopping)" : ""}.` }));
        stop();
        stop = dprc.poll(refresh, 1500, out);
      } catch (err) { dprc.showError(out, err); }
    });
  }
})();
