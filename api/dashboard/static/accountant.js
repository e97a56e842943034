"use strict";
(() => {
  const { api, el, num } = dprc;
  const $ = (id) => document.getElementById(id);
  const result = $("acc-result");

  function mode() { return $("acc-mode").value; }
  $("acc-mode").addEventListener("change", () => {
    $("acc-target-label").hidden = mode() !== "sigma";
    $("acc-sigma-label").hidden = mode() !== "epsilon";
  });

  async function compute() {
    const q = Number($("acc-q").value), steps = Number($("acc-steps").value), delta = Number($("acc-delta").value);
    const method = $("acc-method").value, k = Number($("acc-k").value), sketch = $("acc-sketch").value;
    const clippings = [{ clipping: "exact" }, { clipping: method, k, sketch }];
    const rcName = `${method}, k = ${k}${sketch === "per_example" ? ", per-example sketches" : ""}`;
    result.replaceChildren(el("p", { class: "muted", text: "Computing…" }));
    let sigmas, epsilons;
    if (mode() === "sigma") {
      const target = Number($("acc-target").value);
      const rs = await Promise.all(clippings.map((c) => api("/v1/accountant/noise_multiplier", {
        method: "POST", json: { target_epsilon: target, target_delta: delta, sample_rate: q, steps, ...c } })));
      sigmas = rs.map((r) => r.noise_multiplier);
      epsilons = rs.map((r) => r.epsilon);
    } else {
      const sigma = Number($("acc-sigma").value);
      const rs = await Promise.all(clippings.map((c) => api("/v1/accountant/epsilon", {
        method: "POST", json: { noise_multiplier: sigma, delta, sample_rate: q, steps, ...c } })));
      sigmas = [sigma, sigma];
      epsilons = rs.map((r) => r.epsilon);
    }
    const ratio = mode() === "sigma" ? sigmas[1] / sigmas[0] : epsilons[1] / epsilons[0];
    result.replaceChildren(el("div", { class: "table-wrap" }, el("table", { id: "acc-table" },
      el("thead", {}, el("tr", {}, el("th"), el("th", { text: "exact" }), el("th", { text: rcName }))),
      el("tbody", {},
        el("tr", {}, el("th", { text: "σ" }), el("td", { id: "sigma-exact", text: num(sigmas[0], 5) }), el("td", { id: "sigma-rc", text: num(sigmas[1], 5) })),
        el("tr", {}, el("th", { text: `ε at δ ${num(delta, 3)}` }), el("td", { id: "eps-exact", text: num(epsilons[0], 5) }), el("td", { id: "eps-rc", text: num(epsilons[1], 5) }))))),
      el("p", { id: "overhead" }, mode() === "sigma"
        ? `Randomized clipping needs ${num(ratio, 4)}× the noise of exact clipping for the same ε.`
        : `With the same σ, randomized clipping spends ${num(ratio, 4)}× the ε of exact clipping.`));
    // ε against steps, both clippings at one σ (the exact one's)
    const sigma = sigmas[0], n = 8;
    const grid = [...new Set(Array.from({ length: n }, (_, i) => Math.max(1, Math.round(((i + 1) * steps) / n))))];
    const curves = await Promise.all(clippings.map((c) => Promise.all(grid.map((s) => api("/v1/accountant/epsilon", {
      method: "POST", json: { noise_multiplier: sigma, delta, sample_rate: q, steps: s, ...c } })
      .then((r) => [s, r.epsilon]))))) ;
    dprcChart.line($("acc-chart"), {
      xLabel: "steps", yLabel: `ε (σ = ${num(sigma, 3)})`, xMin: 0,
      series: [
        { key: "exact", label: "exact clipping", points: [[0, 0], ...curves[0]] },
        { key: "randomized", label: rcName, color: 2, points: [[0, 0], ...curves[1]] },
      ],
      budget: mode() === "sigma" ? { y: Number($("acc-target").value), label: "target ε" } : null,
    });
  }

  $("acc-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    compute().catch((err) => dprc.showError(result, err));
  });
  compute().catch((err) => dprc.showError(result, err));
})();
