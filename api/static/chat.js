// llmq chat page: submits jobs to /v1/jobs and streams their tokens from the job's SSE log.
// The stream is read with fetch (not EventSource) so an API key header can go with it, and a
// dropped connection resumes after the last event id it saw.
"use strict";

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
const state = { history: [], config: null, jobs: [], current: null };

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, options = {}) {
  const resp = await fetch(path, { ...options, headers: headers(options.body !== undefined) });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = body.error || {};
    throw new Error(`${resp.status} ${err.type || "error"}: ${err.message || resp.statusText}`);
  }
  return body;
}

// ---- SSE over fetch -------------------------------------------------------------------------
async function* sseEvents(path, lastEventId, signal) {
  const h = headers(false);
  if (lastEventId) h["Last-Event-ID"] = lastEventId;
  const resp = await fetch(path, { headers: h, signal });
  if (!resp.ok) throw new Error(`stream: HTTP ${resp.status}`);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { id: null, event: "message", data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const i = line.indexOf(":");
        const name = i < 0 ? line : line.slice(0, i);
        const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
        if (name === "id") event.id = val;
        else if (name === "event") event.event = val;
        else if (name === "data") event.data.push(val);
      }
      if (event.data.length) yield { ...event, data: JSON.parse(event.data.join("\n")) };
    }
  }
}

// ---- rendering ------------------------------------------------------------------------------
function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const span = document.createElement("span");
  span.className = "text";
  span.textContent = text;
  div.appendChild(span);
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setInfo(div, text) {
  let info = div.querySelector(".info");
  if (!info) { info = document.createElement("span"); info.className = "info"; div.appendChild(info); }
  info.textContent = text;
}

// A queued job's place in line, from a `queued` event or the job's record.
function placeText(place) {
  let text = `queued · #${place.queue_position} in line`;
  if (place.estimated_start) {
    const secs = Math.max(0, Math.round(place.estimated_start - Date.now() / 1000));
    text += ` · starts in ~${secs} s`;
  }
  return text;
}

function showContext(usage) {
  const total = state.config ? state.config.context_length : "?";
  $("ctx").textContent = `${usage.total_tokens} / ${total}`;
}

function renderJobs() {
  const ul = $("jobs");
  ul.replaceChildren(...state.jobs.map((job) => {
    const li = document.createElement("li");
    li.dataset.status = job.status;
    li.dataset.id = job.id;
    const code = document.createElement("code");
    code.textContent = job.id.slice(0, 8);
    const label = document.createElement("span");
    label.textContent = job.label;
    const status = document.createElement("span");
    status.className = "status";
    status.textContent = job.status;
    li.append(code, label, status);
    return li;
  }));
}

function trackJob(job, label) {
  state.jobs.unshift({ id: job.id, status: job.status, label });
  state.jobs = state.jobs.slice(0, 50);
  renderJobs();
}

function updateJob(id, status) {
  const job = state.jobs.find((j) => j.id === id);
  if (job && job.status !== status) { job.status = status; renderJobs(); }
}

async function refreshJobs() {
  for (const job of state.jobs.filter((j) => !TERMINAL.has(j.status))) {
    try { updateJob(job.id, (await api(`/v1/jobs/${job.id}`)).status); } catch (e) { /* next time */ }
  }
}

// ---- one turn -------------------------------------------------------------------------------
async function send(prompt) {
  const messages = [...state.history, { role: "user", content: prompt }];
  const body = { messages, max_tokens: Number($("max-tokens").value) || undefined,
                 temperature: Number($("temperature").value) };
  if ($("json-mode").checked) body.response_format = { type: "json_object" };
  if ($("model-pick").value) body.model = $("model-pick").value;
  addMessage("user", prompt);
  const bubble = addMessage("assistant", "");
  bubble.classList.add("streaming");
  const text = bubble.querySelector(".text");
  $("state").textContent = "submitting";
  let job;
  try {
    job = await api("/v1/jobs", { method: "POST", body: JSON.stringify(body) });
  } catch (err) {
    bubble.className = "msg error";
    bubble.dataset.status = "error";
    text.textContent = err.message;
    $("state").textContent = "error";
    return;
  }
  trackJob(job, prompt.slice(0, 24));
  state.current = { id: job.id, controller: new AbortController() };
  $("stop").disabled = false;
  $("state").textContent = job.queue_position ? placeText(job) : job.status;
  let firstChunkAt = null, lastId = null, done = null, placed = false;
  const poll = setInterval(async () => {  // live tokens/s from the job's token count
    try {
      const rec = await api(`/v1/jobs/${job.id}`);
      updateJob(job.id, rec.status);
      if (!done && !(placed && rec.status === "queued")) $("state").textContent = rec.status;
      if (firstChunkAt && rec.usage.completion_tokens > 1 && !done) {
        const secs = (performance.now() - firstChunkAt) / 1000;
        $("tps").textContent = (rec.usage.completion_tokens / Math.max(secs, 0.05)).toFixed(1);
      }
      if (!done) showContext(rec.usage);
    } catch (e) { /* keep streaming */ }
  }, 500);
  try {
    for (let attempt = 0; !done && attempt < 5; attempt++) {
      try {
        for await (const ev of sseEvents(`/v1/jobs/${job.id}/events`, lastId, state.current.controller.signal)) {
          if (ev.id) lastId = ev.id;
          if (ev.event === "queued") {
            placed = true;
            $("state").textContent = placeText(ev.data);
            setInfo(bubble, placeText(ev.data));
          } else if (ev.event === "chunk") {
            if (placed) { placed = false; setInfo(bubble, ""); }
            firstChunkAt = firstChunkAt || performance.now();
            text.textContent += ev.data.text;
            bubble.scrollIntoView({ block: "end" });
          } else if (ev.event === "restart") {
            text.textContent = "";
          } else if (ev.event === "done") {
            done = ev.data;
            break;
          }
        }
      } catch (err) {
        if (state.current.controller.signal.aborted) break;
      }
    }
  } finally {
    clearInterval(poll);
    bubble.classList.remove("streaming");
    $("stop").disabled = true;
  }
  const final = await api(`/v1/jobs/${job.id}`).catch(() => null);
  const status = final ? final.status : (done ? done.status : "unknown");
  updateJob(job.id, status);
  $("state").textContent = status;
  if (final) {
    text.textContent = final.text;  // the record is the truth (e.g. after a restart)
    showContext(final.usage);
    const secs = final.finished_at && final.started_at ? final.finished_at - final.started_at : 0;
    if (secs > 0 && final.usage.completion_tokens) {
      $("tps").textContent = (final.usage.completion_tokens / secs).toFixed(1);
    }
    setInfo(bubble, `${status} · ${final.finish_reason || "–"} · ${final.usage.completion_tokens} tokens` +
                    (final.cached ? " · cached" : ""));
    if (status === "failed" && final.error) { bubble.classList.add("error"); setInfo(bubble, final.error.message); }
    if ($("json-mode").checked) {
      try { text.textContent = JSON.stringify(JSON.parse(final.text), null, 2); } catch (e) { /* as is */ }
    }
    if (status === "succeeded") {
      state.history.push({ role: "user", content: prompt }, { role: "assistant", content: final.text });
    }
  }
  bubble.dataset.status = status;  // the turn is over: its bubble says how it ended
  state.current = null;
}

// ---- wiring ---------------------------------------------------------------------------------
// The catalog's models, each with its state in the fleet: a cold one is loaded when asked for,
// and a request for it waits in its queue (showing its place) meanwhile.
async function refreshModels() {
  let models;
  try { models = (await api("/v1/models")).data; } catch (e) { return; }
  const pick = $("model-pick");
  const chosen = pick.value || (state.config && state.config.model);
  pick.replaceChildren(...models.map((m) => {
    const info = m.llmq || {};
    const queued = info.queued ? ` · ${info.queued} queued` : "";
    const option = new Option(`${m.id} (${info.state || "?"}${queued})`, m.id);
    option.dataset.state = info.state || "";
    return option;
  }));
  if (models.some((m) => m.id === chosen)) pick.value = chosen;
}

async function loadConfig() {
  try {
    state.config = await api("/ui/config");
    $("model").textContent = `context ${state.config.context_length}`;
    await refreshModels();
    $("max-tokens").max = state.config.max_tokens_cap;
    $("max-tokens").value = Math.min(Number($("max-tokens").value), state.config.max_tokens_cap);
  } catch (err) {
    $("model").textContent = `model: unavailable (${err.message})`;
  }
}

$("chat").addEventListener("submit", async (event) => {
  event.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || state.current) return;
  $("prompt").value = "";
  $("send").disabled = true;
  try { await send(prompt); } finally { $("send").disabled = false; $("prompt").focus(); }
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("chat").requestSubmit(); }
});

$("stop").addEventListener("click", async () => {
  if (!state.current) return;
  try { await api(`/v1/jobs/${state.current.id}`, { method: "DELETE" }); } catch (e) { /* ended already */ }
});

$("api-key").value = localStorage.getItem("llmq-api-key") || "";
$("api-key").addEventListener("change", () => localStorage.setItem("llmq-api-key", $("api-key").value));
setInterval(refreshJobs, 2000);
setInterval(refreshModels, 5000);
loadConfig();
