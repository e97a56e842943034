"use strict";
(async () => {
  try {
    const [me, files, jobs] = await Promise.all([
      dprc.api("/v1/me"), dprc.api("/v1/files?purpose=fine-tune"), dprc.api("/v1/fine_tuning/jobs?limit=100"),
    ]);
    document.getElementById("who").textContent = `Signed in as tenant ${me.tenant} (key ${me.key_id}).`;
    const st = me.storage, mib = (b) => (b / 1048576).toFixed(1);
    const storage = document.getElementById("storage");
    storage.textContent = `Storage: ${mib(st.used_bytes)} MiB of ${mib(st.quota_bytes)} MiB used.`;
    storage.dataset.usedBytes = st.used_bytes;
    storage.dataset.quotaBytes = st.quota_bytes;
    document.getElementById("n-files").textContent = `${files.data.length} data set${files.data.length === 1 ? "" : "s"}`;
    const active = jobs.data.filter((j) => !dprc.TERMINAL.has(j.status)).length;
    document.getElementById("n-jobs").textContent = `${jobs.data.length}${jobs.has_more ? "+" : ""} jobs, ${active} active`;
  } catch (err) { dprc.showError(document.getElementById("who"), err); }
})();
