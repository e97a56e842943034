"use strict";
(() => {
  const { api, el, eps, num } = dprc;
  const body = document.querySelector("#jobs tbody");
  dprc.poll(async () => {
    const jobs = await dprc.all("/v1/fine_tuning/jobs");
    if (jobs.length === 0) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No jobs yet. ",
        el("a", { href: "/jobs/new", text: "Create one." }))));
      return false;
    }
    body.replaceChildren(...jobs.map((j) => {
      const pct = j.steps_total ? (100 * j.steps_done) / j.steps_total : 0;
      const bar = el("span", { class: "progress" }, el("span", {}));
      bar.firstChild.style.width = `${pct}%`;
      return el("tr", { "data-job-id": j.id, "data-status": j.status },
        el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(j.id)}`, text: j.id })),
        el("td", {}, el("span", { class: `status ${j.status}`, text: j.status })),
        el("td", { text: j.model }),
        el("td", {}, el("a", { href: `/data-sets/${encodeURIComponent(j.training_file)}`, text: j.training_file })),
        el("td", { class: "steps" }, bar, `${j.steps_done} / ${j.steps_total}`),
        el("td", { text: `${eps(j.privacy.epsilon_spent)} / ${num(j.privacy.target_epsilon)}` }));
    }));
    return false;
  }, 2000, document.querySelector("#jobs tbody"));
})();
