"use strict";
(() => {
  const { api, el, eps, num } = dprc;
  const $ = (id) => document.getElementById(id);
  const preview = $("preview-body");
  const errorBox = $("job-error");

  const intOrNull = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));

  // the request body of POST /v1/fine_tuning/jobs, from the form
  function body() {
    const hp = { n_epochs: intOrNull("n_epochs") ?? "auto", batch_size: intOrNull("batch_size") ?? "auto" };
    if (intOrNull("learning_rate") !== null) hp.learning_rate = intOrNull("learning_rate");
    if (intOrNull("max_seq_len") !== null) hp.max_seq_len = intOrNull("max_seq_len");
    const train = document.querySelector("input[name=train]:checked").value;
    if (train === "lora") hp.lora = { r: intOrNull("lora_r") ?? 8 };
    if (train === "only") hp.train_only = $("train_only").value.split(",").map((s) => s.trim()).filter(Boolean);
    const privacy = { target_epsilon: intOrNull("target_epsilon"),
      clipping: { method: $("clipping").value } };
    if ($("sketch").value) privacy.clipping.sketch = $("sketch").value;  // else the API's default
    if (intOrNull("k") !== null) privacy.clipping.k = intOrNull("k");
    if (intOrNull("target_delta") !== null) privacy.target_delta = intOrNull("target_delta");
    if ($("unit").value === "user") {
      privacy.unit = { type: "user" };
      if (intOrNull("max_examples_per_user") !== null) privacy.unit.max_examples_per_user = intOrNull("max_examples_per_user");
    }
    const out = { model: $("model").value, training_file: $("training_file").value, hyperparameters: hp, privacy };
    if (intOrNull("checkpoint_every") !== null) out.checkpoint_every = intOrNull("checkpoint_every");
    // the job's shape (nodes × devices ranks): the plan does not depend on it
    for (const key of ["nodes", "devices"]) if (intOrNull(key) !== null) out[key] = intOrNull(key);
    return out;
  }

  function where(err) { return err.param ? ` (${err.param})` : ""; }
  // the accountant's sketch, said after its clipping (exact norms draw none)
  function sketchWords(clipping, sketch) {
    if (clipping === "exact") return "";
    return sketch === "per_example" ? ", per-example sketches (hidden-scale model)" : ", shared sketch";
  }

  let seq = 0;
  async function update() {
    const mine = ++seq;
    if (!$("training_file").value) return;
    preview.replaceChildren(el("p", { class: "muted", text: "Asking the accountant…" }));
    try {
      const plan = await api("/v1/accountant/job_plan", { method: "POST", json: body() });
      if (mine !== seq) return;
      const b = plan.budget;
      // the default's words: what the API resolved it to for this plan (plan.sketch echoes the
      // job's privacy.clipping.sketch), never decided here
      $("sketch-default").textContent = $("sketch").value
        ? "default (the API decides)"
        : `default (the API's: ${plan.sketch === "per_example" ? "per example" : "shared"} for ${plan.clipping})`;
      const d = (k, v, key) => [el("dt", { text: k }), el("dd", { "data-key": key, text: v })];
      preview.replaceChildren(el("dl", { id: "plan", "data-noise-multiplier": plan.noise_multiplier,
        "data-planned-epsilon": plan.planned_epsilon, "data-sample-rate": plan.sample_rate,
        "data-steps": plan.steps, "data-delta": plan.target_delta,
        "data-accounting-clipping": plan.accounting_clipping, "data-accounting-k": plan.accounting_k ?? "",
        "data-accounting-sketch": plan.accounting_sketch },
        d("Noise σ (calibrated)", num(plan.noise_multiplier, 5), "sigma"),
        d("Planned ε", `${num(plan.planned_epsilon, 5)} at δ ${num(plan.target_delta, 3)} (target ${num(plan.target_epsilon)})`, "epsilon"),
        d("Sample rate q", `${num(plan.sample_rate)} (${plan.batch_size} of ${plan.n_examples} examples per batch on average)`, "q"),
        d("Steps", `${plan.steps} (${plan.n_epochs} epochs)`, "steps"),
        d("Accounted as", `${plan.accounting_clipping}${plan.accounting_k ? `, k = ${plan.accounting_k}` : ""}${sketchWords(plan.accounting_clipping, plan.accounting_sketch)}`, "clipping"),
        b ? [
          d("Data set budget", `ε ${num(b.epsilon)} at δ ${num(b.delta, 3)}; committed now ε ${eps(b.committed)}`, "budget"),
          d("Left after this job", b.remaining_after === null ? "—" : `ε ${num(b.remaining_after, 4)}`, "left"),
          el("dt", { text: "Verdict" }),
          el("dd", { id: "verdict", class: b.fits ? "fits" : "refused",
            text: b.fits ? "fits the budget" : `over budget: the data set would be at ε ${eps(b.committed_with_job)} > ${num(b.epsilon)}` }),
        ] : d("Data set budget", "none (not limited)", "budget")));
    } catch (err) {
      if (mine !== seq) return;
      preview.replaceChildren(el("p", { class: "error", id: "preview-error", text: `${err.message}${where(err)}` }));
    }
  }

  // a data set whose lines name their users trains per user: the unit follows the data set
  let filesById = new Map();
  function unitFollowsFile() {
    const f = filesById.get($("training_file").value);
    if (f) $("unit").value = f.n_users != null ? "user" : "example";
    unitWords();
  }
  function unitWords() {
    const user = $("unit").value === "user";
    $("max_examples_per_user").disabled = !user;
    $("batch-words").textContent = user ? "Batch size (expected, users)" : "Batch size (expected, examples)";
  }
  $("training_file").addEventListener("change", unitFollowsFile);
  $("unit").addEventListener("change", unitWords);

  let timer = null;
  const later = () => { errorBox.hidden = true; clearTimeout(timer); timer = setTimeout(update, 350); };
  $("job-form").addEventListener("input", later);
  $("job-form").addEventListener("change", later);

  $("job-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    errorBox.hidden = true;
    $("submit-job").disabled = true;
    try {
      const job = await api("/v1/fine_tuning/jobs", { method: "POST", json: body() });
      location.assign(`/jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      errorBox.textContent = `Refused: ${err.message}${where(err)}`;
      errorBox.dataset.code = err.code || "";
      errorBox.hidden = false;
      $("submit-job").disabled = false;
    }
  });

  (async () => {
    try {
      const [files, models] = await Promise.all([api("/v1/files?purpose=fine-tune&approval=approved"), api("/v1/models")]);
      const trainable = files.data.filter((f) => !f.unbudgeted);
      filesById = new Map(trainable.map((f) => [f.id, f]));
      $("training_file").replaceChildren(...trainable.map((f) => el("option", { value: f.id,
        text: `${f.filename} (${f.n_users != null ? `${f.n_users} users, ` : ""}${f.n_examples} ${f.format}${f.budget ? `, ε${f.budget.unit === "user" ? " per user" : ""} left ${num(f.budget.remaining)}` : ""})` })));
      $("model").replaceChildren(...models.data.map((m) => el("option", { value: m.id, text: `${m.id} (${m.task})` })));
      const want = new URLSearchParams(location.search).get("file");
      if (want && filesById.has(want)) $("training_file").value = want;
      unitFollowsFile();
      update();
    } catch (err) { dprc.showError(preview, err); }
  })();
})();
