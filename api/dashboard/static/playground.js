"use strict";
/* The playground: a conversation with a causal LM through POST /v1/chat/completions (the
   session cookie and the CSRF header, as dprc.api), the answer read from the server-sent
   events as they arrive (fetch + ReadableStream, ``data:`` lines until ``[DONE]``); Stop aborts
   the fetch, which closes the connection and ends the generation on the server. */
(() => {
  const { api, el, ApiError } = dprc;
  const $ = (id) => document.getElementById(id);
  const form = $("pg-form"), modelSelect = $("pg-model"), message = $("pg-message");
  const send = $("pg-send"), stop = $("pg-stop"), errorBox = $("pg-error");
  const list = $("pg-conversation");
  const wanted = new URLSearchParams(location.search).get("model");
  let conversation = []; // [{role, content}] of the finished turns (no system message)
  let controller = null; // the AbortController of the answer being streamed
  let epoch = 0; // bumped by "New conversation": a turn that ends after it is not kept

  async function loadModels() {
    const models = (await api("/v1/models")).data.filter((m) => m.task === "causal_lm");
    const names = models.map((m) => m.id);
    if (wanted && !names.includes(wanted)) names.unshift(wanted); // the server will say if it is not one
    modelSelect.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
    if (wanted) modelSelect.value = wanted;
    if (names.length === 0) {
      dprc.showError(errorBox, new Error("No causal language model is available to this tenant."));
      send.disabled = true;
    }
    modelSelect.dataset.loaded = "true";
  }

  function setBusy(busy) {
    send.disabled = busy;
    stop.disabled = !busy;
    list.setAttribute("aria-busy", busy ? "true" : "false");
    list.dataset.state = busy ? "streaming" : "idle";
  }

  function bubble(role, text) {
    $("pg-empty").hidden = true;
    const body = el("div", { class: "turn-text", text });
    const li = el("li", { class: `turn ${role}`, "data-role": role },
      el("span", { class: "turn-who", text: role === "user" ? "You" : "Model" }), body);
    list.append(li);
    return { li, body };
  }

  function render() {
    list.replaceChildren(...conversation.map((m) => {
      const { li } = bubble(m.role, m.content);
      if (m.stopped) li.dataset.stopped = "true";
      return li;
    }));
    $("pg-empty").hidden = conversation.length > 0;
  }

  function busyMessage(response) {
    const after = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    return `The engine is busy, retry in ${Number.isFinite(after) ? after : "a few"} s.`;
  }

  async function errorOf(response) {
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (response.status === 401 && data && data.error && data.error.code === "invalid_session") {
      location.assign("/sign-in");
    }
    const err = new ApiError(response.status, data);
    if (response.status === 429) err.message = busyMessage(response);
    return err;
  }

  // the server-sent events of ``response``: each choice-0 content delta passed to ``onText``;
  // an error event (the engine broke off) is thrown
  async function readEvents(response, onText) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const lines = buffer.split(/\r?\n/);
      buffer = done ? "" : lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data:")) continue;
        const payload = line.slice(5).trim();
        if (payload === "[DONE]") { await reader.cancel().catch(() => {}); return; }
        if (!payload) continue;
        const event = JSON.parse(payload);
        if (event.error) throw new ApiError(502, event);
        for (const choice of event.choices || []) {
          const text = choice.delta && choice.delta.content;
          if ((choice.index || 0) === 0 && text) onText(text);
        }
      }
      if (done) return;
    }
  }

  function numberField(id, name) {
    const input = $(id);
    if (!input.checkValidity() || input.value.trim() === "") {
      input.focus();
      throw new Error(`${name}: ${input.validationMessage || "a number is needed"}`);
    }
    return Number(input.value);
  }

  async function submit() {
    errorBox.replaceChildren();
    const text = message.value;
    if (!text.trim()) { message.focus(); throw new Error("Write a message first."); }
    const maxTokens = numberField("pg-max-tokens", "Max tokens");
    const temperature = numberField("pg-temperature", "Temperature");
    const system = $("pg-system").value.trim();
    const user = { role: "user", content: text };
    const past = conversation.map(({ role, content }) => ({ role, content }));
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...past, user];
    const body = { model: modelSelect.value, messages, max_tokens: maxTokens, temperature, stream: true };
    bubble("user", text);
    const answer = bubble("assistant", "");
    answer.li.dataset.state = "streaming";
    message.value = "";
    controller = new AbortController();
    const mine = epoch;
    setBusy(true);
    let got = "";
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "X-DPRC-Dashboard": "1", "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify(body),
        credentials: "same-origin",
        signal: controller.signal,
      });
      if (!response.ok) throw await errorOf(response);
      answer.li.scrollIntoView({ block: "nearest" }); // on a phone the conversation is below the form
      await readEvents(response, (piece) => { got += piece; answer.body.textContent = got; });
      if (mine === epoch) conversation.push(user, { role: "assistant", content: got });
      answer.li.dataset.state = "done";
    } catch (err) {
      if (mine !== epoch) return; // the conversation was started anew meanwhile
      if (err && err.name === "AbortError") { // stopped: the partial answer stays in the conversation
        conversation.push(user, { role: "assistant", content: got, stopped: true });
        answer.li.dataset.state = "stopped";
        answer.li.dataset.stopped = "true";
      } else { // the turn is not kept: the message goes back into its box
        render();
        if (!message.value) message.value = text;
        throw err;
      }
    } finally {
      controller = null;
      setBusy(false);
      message.focus();
    }
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (controller) return;
    submit().catch((err) => dprc.showError(errorBox, err));
  });
  message.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); form.requestSubmit(); }
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && controller) controller.abort();
  });
  stop.addEventListener("click", () => { if (controller) controller.abort(); });
  $("pg-reset").addEventListener("click", () => {
    epoch += 1;
    if (controller) controller.abort();
    conversation = [];
    errorBox.replaceChildren();
    render();
    message.focus();
  });

  setBusy(false);
  loadModels().catch((err) => dprc.showError(errorBox, err));
})();
