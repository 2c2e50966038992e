// The dashboard's Playground (apps/clusters/templates/clusters/playground.html): asks the dashboard for a
// playground credential (operator session, CSRF), then calls the gateway's /v1/* with it, exactly as a
// client would, and shows the answer as it arrives (server-sent events read from the response body).
(function () {
  "use strict";
  const form = document.getElementById("playground");
  if (!form) return;
  const offers = JSON.parse(document.getElementById("playground-offers").textContent);
  const $ = (id) => document.getElementById(id);
  const capability = $("pg-capability"), project = $("pg-project"), endpoint = $("pg-endpoint");
  const stream = $("pg-stream"), message = $("pg-message"), send = $("pg-send");
  const answer = $("pg-answer"), state = $("pg-state"), errorBox = $("pg-error");
  const PATHS = { chat: "/v1/chat/completions", completions: "/v1/completions", embeddings: "/v1/embeddings" };
  const LABELS = { chat: "Chat", completions: "Completion", embeddings: "Embeddings" };

  function fill(select, values, label) {
    const kept = select.value;
    select.replaceChildren(...values.map((v) => new Option(label(v), v)));
    if (values.includes(kept)) select.value = kept;
  }

  function chosen() {
    const offer = offers[capability.value];
    fill(project, offer.projects, (p) => (p === "" ? "none (unbound tiers)" : p));
    $("pg-project-label").hidden = offer.projects.length === 1 && offer.projects[0] === "";
    fill(endpoint, offer.endpoints, (e) => LABELS[e]);
    const embeddings = endpoint.value === "embeddings";
    $("pg-stream-label").hidden = embeddings;
    $("pg-message-label").textContent = embeddings ? "Input (one per line)" : endpoint.value === "chat" ? "Message" : "Prompt";
    $("pg-about").textContent = offer.running
      ? `${offer.running} backend${offer.running === 1 ? "" : "s"} running; ${PATHS[endpoint.value]}`
      : `No backend runs ${capability.value} now: the gateway will refuse the call, and say why.`;
  }
  capability.addEventListener("change", chosen);
  endpoint.addEventListener("change", chosen);
  chosen();

  function refused(code, text) {
    errorBox.hidden = false;
    errorBox.replaceChildren();
    const strong = document.createElement("strong");
    const codeEl = document.createElement("code");
    codeEl.id = "pg-error-code";
    codeEl.textContent = code;
    strong.append(codeEl);
    const span = document.createElement("span");
    span.id = "pg-error-message";
    span.textContent = " " + text;
    errorBox.append(strong, span);
    state.textContent = "refused";
    state.className = "badge badge-critical";
  }

  // The envelope ({code, message}) of a refusal, from the dashboard or the gateway.
  async function envelope(response) {
    try {
      const body = await response.json();
      if (body && body.code) return [body.code, body.message || ""];
    } catch (e) { /* not JSON: said below */ }
    return [`HTTP ${response.status}`, response.statusText || "The answer was not the error envelope."];
  }

  function showUsage(usage) {
    if (!usage) return;
    const parts = [`${usage.prompt_tokens ?? 0} prompt`];
    if (usage.completion_tokens !== undefined) parts.push(`${usage.completion_tokens} completion`);
    parts.push(`${usage.total_tokens ?? 0} total tokens`);
    $("pg-usage").textContent = parts.join(", ");
  }

  function body(kind, model, streamed) {
    const text = message.value;
    if (kind === "embeddings") {
      const inputs = text.split("\n").filter((line) => line.trim() !== "");
      return { model, input: inputs.length === 1 ? inputs[0] : inputs };
    }
    const request = kind === "chat" ? { model, messages: [{ role: "user", content: text }] } : { model, prompt: text };
    if (streamed) Object.assign(request, { stream: true, stream_options: { include_usage: true } });
    return request;
  }

  // Reads server-sent events as they arrive, a whole line at a time.
  async function readStream(response, kind) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let held = "", chunks = 0, done = false;
    while (!done) {
      const read = await reader.read();
      if (read.done) break;
      held += decoder.decode(read.value, { stream: true });
      const lines = held.split("\n");
      held = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") { done = true; break; }
        let event;
        try { event = JSON.parse(data); } catch (e) { continue; }
        if (event.error) { refused(event.error.code || "Error in the stream", event.error.message || data); return false; }
        if (event.model) $("pg-model").textContent = event.model;
        if (event.usage) showUsage(event.usage);
        const choice = (event.choices || [])[0];
        const piece = choice ? (kind === "chat" ? (choice.delta || {}).content : choice.text) : null;
        if (piece) {
          if (chunks === 0) answer.dataset.firstTokenMs = String(Math.round(performance.now() - answer.started));
          chunks += 1;
          answer.textContent += piece;
          answer.dataset.chunks = String(chunks);
        }
      }
    }
    if (!done) {
      refused("Stream cut short", "The stream ended before [DONE]: the backend stopped mid-answer (see the web log).");
      return false;
    }
    return true;
  }

  function showAnswer(kind, data) {
    if (data.model) $("pg-model").textContent = data.model;
    showUsage(data.usage);
    if (kind === "embeddings") {
      const vectors = data.data || [];
      const dims = vectors.length ? vectors[0].embedding.length : 0;
      answer.textContent = `${vectors.length} vector${vectors.length === 1 ? "" : "s"} of ${dims} dimensions\n` +
        vectors.map((v) => `[${v.index}] ${v.embedding.slice(0, 8).join(", ")}${v.embedding.length > 8 ? ", …" : ""}`).join("\n");
    } else {
      const choice = (data.choices || [])[0] || {};
      answer.textContent = kind === "chat" ? ((choice.message || {}).content ?? "") : (choice.text ?? "");
    }
    answer.dataset.chunks = "1";
  }

  async function credential() {
    const fields = new FormData();
    fields.append("capability", capability.value);
    fields.append("project", project.value);
    const response = await fetch(form.dataset.credentialUrl, {
      method: "POST",
      body: fields,
      credentials: "same-origin",
      headers: { "X-CSRFToken": form.querySelector("[name=csrfmiddlewaretoken]").value },
    });
    if (!response.ok) {
      const [code, text] = await envelope(response);
      refused(code, text);
      return null;
    }
    return response.json();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const kind = endpoint.value;
    const streamed = kind !== "embeddings" && stream.checked;
    errorBox.hidden = true;
    $("pg-result").hidden = false;
    answer.textContent = "";
    answer.dataset.chunks = "0";
    delete answer.dataset.firstTokenMs;
    for (const id of ["pg-model", "pg-backend", "pg-usage", "pg-time", "pg-credential"]) $(id).textContent = "—";
    state.textContent = "sending";
    state.className = "badge badge-pending";
    send.disabled = true;
    try {
      const minted = await credential();
      if (!minted) return;
      $("pg-credential").textContent = `${minted.name} (${minted.display_prefix}…), ${minted.reused ? "reused" : "minted"}, expires ${new Date(minted.expires_at).toLocaleTimeString()}`;
      answer.started = performance.now();
      const response = await fetch(PATHS[kind], {
        method: "POST",
        credentials: "omit",
        headers: { "Authorization": `Bearer ${minted.credential}`, "Content-Type": "application/json" },
        body: JSON.stringify(body(kind, capability.value, streamed)),
      });
      $("pg-backend").textContent = response.headers.get("x-modelforge-backend") || "—";
      if (!response.ok) {
        const [code, text] = await envelope(response);
        refused(code, text);
        return;
      }
      const isStream = (response.headers.get("content-type") || "").startsWith("text/event-stream");
      if (isStream) {
        state.textContent = "streaming";
        if (!(await readStream(response, kind))) return;
      } else {
        showAnswer(kind, await response.json());
      }
      const total = Math.round(performance.now() - answer.started);
      const first = answer.dataset.firstTokenMs;
      $("pg-time").textContent = (first ? `first token ${first} ms, ` : "") + `total ${total} ms`;
      state.textContent = "done";
      state.className = "badge badge-usable";
    } catch (failure) {
      refused("No answer", `The request got no answer: ${failure}`);
    } finally {
      send.disabled = false;
    }
  });
})();
