"use strict";
(() => {
  const { api, el, eps, num, when } = dprc;
  const id = dprc.main().dataset.jobId;
  const base = `/v1/fine_tuning/jobs/${encodeURIComponent(id)}`;
  const seen = new Set(); // ids of the events in ``events``
  const events = []; // every event seen, oldest first (the API's order, reversed)
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

  /* ε after t steps of the job's plan, from the accountant (step → ε; null: no finite bound).
     A job that runs as planned has spent exactly this after t steps: a resumed job's ledger
     composes to the same event, and a ν-DP-FTRL job's first t steps are the plan's first t rows
     (dprc_core/training/plan.py, PrivacyPlan.event). The worker's progress events carry the ε of
     the steps that ran from the plan's ε curve (docs/accounting.md §12), the accountant's within
     its discretisation (5e-4 relative): the chart draws the accountant's. */
  const curve = new Map([[0, 0]]);
  const failed = new Set(); // steps the accountant refused: not asked again
  const ALL_STEPS = 48; // a plan of at most this many steps: ε at every step
  const GRID = 24; // else at this many steps spread evenly, plus the current step and the markers
  const PER_REFRESH = 12; // accountant calls per refresh at most

  function gridSteps(total) {
    if (total <= ALL_STEPS) return Array.from({ length: total }, (_, i) => i + 1);
    return [...new Set(Array.from({ length: GRID }, (_, i) => Math.max(1, Math.round(((i + 1) * total) / GRID))))];
  }

  // the body of POST /v1/accountant/epsilon for the first ``steps`` steps of the plan, with the
  // settings the job object echoes (σ, q, δ, its accounted clipping, k, rank and sketch)
  function epsilonRequest(p, steps) {
    const acc = p.accountant || {};
    if (p.noise.mechanism !== "gaussian") {
      // a ν-DP-FTRL run of t steps with at most ⌈t / min_separation⌉ participations
      return {
        mechanism: p.noise.mechanism, noise_multiplier: p.noise_multiplier, steps, delta: p.target_delta,
        nu: acc.nu ?? p.noise.nu, bands: acc.bands ?? p.noise.bands ?? null, min_separation: acc.min_separation,
        participations: Math.ceil(steps / acc.min_separation),
      };
    }
    return {
      noise_multiplier: p.noise_multiplier, sample_rate: p.sample_rate, steps, delta: p.target_delta,
      clipping: acc.clipping, k: acc.k ?? null, rank: acc.rank ?? null, sketch: acc.sketch,
    };
  }

  // ask the accountant for the wanted steps it has not answered yet; true when none is left
  async function fillCurve(p, wanted) {
    const missing = wanted.filter((s) => !curve.has(s) && !failed.has(s)).slice(0, PER_REFRESH);
    await Promise.all(missing.map((s) => api("/v1/accountant/epsilon", { method: "POST", json: epsilonRequest(p, s) })
      .then((r) => { curve.set(s, r.epsilon); }, () => { failed.add(s); })));
    return wanted.every((s) => curve.has(s) || failed.has(s));
  }

  const curvePoints = (upTo) => [...curve].filter(([s, e]) => s > 0 && s <= upTo && e !== null)
    .sort((a, b) => a[0] - b[0]);

  // where the job left its plan, from its events: the status changes that stop it before its
  // last step, at the step of the last progress event before them (or the step they name)
  const DEPARTURES = [
    [/^Job paused/, "paused"], [/^Job cancelled/, "cancelled"], [/^Job failed/, "failed"],
    [/^A rank ended early/, "interrupted"],
  ];
  function departures() {
    const out = [];
    let step = 0;
    for (const e of events) {
      if (e.type === "metrics" && e.data && Number.isInteger(e.data.step)) { step = e.data.step; continue; }
      const hit = DEPARTURES.find(([re]) => re.test(e.message));
      if (!hit) continue;
      const named = e.message.match(/at step (\d+)/);
      const x = named ? Number(named[1]) : step;
      const last = out[out.length - 1];
      if (last && last.key === hit[1] && last.x === x) continue;
      out.push({ key: hit[1], x, label: `${hit[1]} at step ${x}` });
    }
    const ended = dprc.TERMINAL.has(job.status) || job.status === "paused";
    if (ended && job.steps_done < job.steps_total && !out.some((m) => m.key === job.status && m.x === job.steps_done)) {
      const key = job.status === "succeeded" ? "stopped early" : job.status;
      out.push({ key, x: job.steps_done, label: `${key} at step ${job.steps_done}` });
    }
    return out;
  }

  // the ε spent the job object gives once it stopped (paused or ended), at its last step; never
  // drawn below the accountant's ε for the steps that ran
  function spentPoint() {
    const p = job.privacy;
    const stopped = dprc.TERMINAL.has(job.status) || job.status === "paused";
    if (!stopped || !Number.isFinite(p.epsilon_spent) || (job.steps_done === 0 && p.epsilon_spent === 0)) return [];
    const exact = curve.get(job.steps_done);
    const y = Number.isFinite(exact) ? Math.max(p.epsilon_spent, exact) : p.epsilon_spent;
    return [Object.assign([job.steps_done, y], { label: `ε spent ${eps(y)}` })];
  }

  function epsilonWanted() {
    const marks = departures().map((m) => m.x);
    return [...new Set([job.steps_done, ...marks, ...gridSteps(job.steps_total)].filter((s) => s > 0))];
  }

  // how many devices the job trains on and how its ranks hold the model (the CLI's words:
  // dprc/client/commands.py, _devices_words)
  function devicesWords(j) {
    const n = j.devices || 1;
    const m = j.nodes || 1;
    const ranks = n * m;
    if (ranks <= 1) return "1 device";
    const where = m <= 1 ? `${n} devices` : `${m} nodes × ${n} device(s) (${ranks} ranks)`;
    return j.sharding === "fsdp"
      ? `${where}, model sharded (FSDP): 1/${ranks} of it on each`
      : `${where}, data-parallel (whole model on each)`;
  }

  // the training method (the CLI's words: dprc/client/commands.py, _method_words)
  function methodWords(j) {
    const m = j.method || { type: "supervised" };
    if (m.type !== "dpo") return m.type;
    const beta = ((m.dpo || {}).hyperparameters || {}).beta;
    return `dpo (beta ${num(beta)}; one preference pair is one example)`;
  }

  function privacyWords(p) {
    const acc = p.accountant || {};
    const unit = p.unit || { type: "example" };
    const perUser = unit.type === "user";
    const units = perUser ? "users" : "examples";
    const rows = [
      ["Guarantee", perUser
        ? `(ε = ${num(p.target_epsilon)}, δ = ${num(p.target_delta, 3)})-differential privacy at most per user: for adding or removing one user with all of their lines (planned ε ${num(p.planned_epsilon)}).`
        : (job.method || {}).type === "dpo"
          ? `(ε = ${num(p.target_epsilon)}, δ = ${num(p.target_delta, 3)})-differential privacy at most, for adding or removing one preference pair — its prompt, both answers and which one was preferred (planned ε ${num(p.planned_epsilon)}).`
          : `(ε = ${num(p.target_epsilon)}, δ = ${num(p.target_delta, 3)})-differential privacy at most, for adding or removing one example of the data set (planned ε ${num(p.planned_epsilon)}).`],
      ...(perUser ? [["Privacy unit", `one user: each line names its user in "${unit.field}"; ${unit.n_users} users, the largest with ${unit.max_lines_per_user} lines. A sampled user contributes at most ${unit.max_examples_per_user} of their lines a step, and the sum of their gradients is clipped as one.`]] : []),
      ["δ", `${num(p.target_delta, 3)}: the small probability allowed for the guarantee to fail; at most 1/N for N = ${p.dataset_size} ${units}.`],
      ...(p.warnings || []).map((w) => ["Warning", `${w.code}: ${w.message}`]),
      ["Noise σ", `${num(p.noise_multiplier)} × the clipping norm ${num(p.max_grad_norm)}: the standard deviation of the Gaussian noise added once per batch to the summed, clipped gradients.`],
      ["Noise mechanism", p.noise.mechanism === "gaussian"
        ? "Gaussian (DP-SGD): independent noise at each step."
        : `ν-DP-FTRL: noise correlated across steps (ν = ${num(p.noise.nu)}), examples in a fixed shuffled order, no sampling amplification.`],
      ["Sampling q", p.noise.mechanism === "gaussian"
        ? `${num(p.sample_rate)}: each ${perUser ? "user" : "example"} joins each batch independently with this probability (Poisson sampling), about ${Math.round(p.sample_rate * p.dataset_size)} ${units} per batch.`
        : `${num(p.sample_rate)} (fixed-order batches).`],
      ["Steps", `${p.steps} noisy steps.`],
      ["Clipping", `each ${perUser ? "user's summed" : "example's"} gradient is scaled to norm at most ${num(p.max_grad_norm)}; method ${p.clipping.method}${p.clipping.k ? ` with k = ${p.clipping.k} projections` : ""}${p.clipping.sketch === "per_example" ? ", drawn independently for each example" : ""}: ${WORDS[p.clipping.method] || p.clipping.method}.`],
      ["Accounted as", `${acc.clipping || "exact"}${acc.k ? `, k = ${acc.k}` : ""}${(acc.clipping || "exact") === "exact" ? "" : acc.sketch === "per_example" ? ", per-example sketches (hidden-scale model)" : ", shared sketch"} (${acc.sampling || "—"} sampling, ${acc.adjacency || "—"}).`],
      ["Training loss", p.report_train_loss ? "reported: it is computed on the private data and is not covered by the guarantee." : "not reported."],
    ];
    document.getElementById("privacy-words").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }),
      el("dd", k === "Warning" ? { text: v, class: "warning", "data-warning": v.split(":")[0] } : { text: v })]));
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
      el("dt", { text: "Method" }), el("dd", { id: "method", text: methodWords(job) }),
      el("dt", { text: "Devices" }), el("dd", { id: "devices", text: devicesWords(job) }),
      el("dt", { text: "ε spent" }), el("dd", { id: "epsilon-spent" }, spentWords()),
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
        { key: "actual", label: "spent (accountant)", points: curvePoints(job.steps_done), origin: [0, 0], upper: true },
        { key: "planned", label: "plan", points: curvePoints(job.steps_total), origin: [0, 0], upper: true, dots: false },
        { key: "checkpoints", label: "at checkpoints", color: 2, line: false, points: ckptPoints },
        { key: "spent", label: "job's ε spent", color: 3, line: false, r: 4, labels: true, points: spentPoint() },
      ],
      markers: departures(),
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

  // the job's ε in the summary: the job object's ε spent, the ε of the steps that ran (the
  // worker reports it at every step, never a value for a step that has not run)
  function spentWords() {
    const p = job.privacy, target = `of the target ${num(p.target_epsilon)}`;
    const running = !dprc.TERMINAL.has(job.status) && job.status !== "paused";
    if (running && job.steps_done > 0) return `${eps(p.epsilon_spent)} after step ${job.steps_done} ${target}`;
    return `${eps(p.epsilon_spent)} ${target}`;
  }

  // a succeeded causal-LM job's model: a link to the playground with it preselected
  let playgroundChecked = false;
  async function showPlayground() {
    if (playgroundChecked || job.status !== "succeeded" || !job.fine_tuned_model) return;
    playgroundChecked = true;
    const model = await api(`/v1/models/${encodeURIComponent(job.fine_tuned_model)}`).catch(() => null);
    if (!model || model.task !== "causal_lm") return;
    const link = document.getElementById("playground");
    link.href = `/playground?model=${encodeURIComponent(job.fine_tuned_model)}`;
    link.hidden = false;
  }

  async function refresh() {
    job = await api(base);
    await showPlayground();
    await newEvents();
    const complete = await fillCurve(job.privacy, epsilonWanted());
    const ckpts = await dprc.all(`${base}/checkpoints`);
    ckptPoints = ckpts.map((c) => [c.step_number, c.epsilon]).sort((a, b) => a[0] - b[0]);
    render();
    renderCheckpoints(ckpts);
    privacyWords(job.privacy);
    document.getElementById("chart-epsilon").dataset.complete = String(complete);
    dprc.main().dataset.status = job.status;
    return dprc.TERMINAL.has(job.status) && complete;
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
