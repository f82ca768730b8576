// pyrula-stream ui: one page, five views (turns, a turn's timeline and scores, the
// questions waiting for a person, dead letters, evaluation by agent version),
// kept current by one server-sent-events stream. Everything read from Kafka is escaped.
"use strict";

const state = {
  config: { allow_actions: false, agents: [], max_turns: 200, max_dead_letters: 200 },
  turns: new Map(), // "agent/turn_id" -> summary
  deadLetters: new Map(), // "agent/partition/offset" -> dead letter
  turn: null, // the watched turn's detail
  watched: "", // "agent/turn_id" of the timeline on screen
  filters: { agent: "", tenant: "", status: "", thread: "", q: "" },
  notice: "",
  paramsOpen: false,
  waiting: { questions: [], errors: [], loaded: false },
  reasons: new Map(), // "turn_id/key" -> the reason typed so far (survives re-renders)
  evals: { agents: [], loaded: false }, // per agent: its versions compared by their scores
};

const view = document.getElementById("view");
let source = null;

// -- helpers --------------------------------------------------------------------------

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

function json(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value ?? null, null, 2);
}

function clock(ms) {
  if (!ms) return "–";
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  const time = d.toLocaleTimeString([], { hour12: false });
  return today ? time : `${d.toLocaleDateString()} ${time}`;
}

function duration(from, to) {
  if (!from) return "–";
  const ms = Math.max(0, (to || Date.now()) - from);
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} m ${Math.round((ms % 60000) / 1000)} s`;
}

function cost(usd) {
  return usd ? `$${Number(usd).toFixed(usd < 0.01 ? 4 : 2)}` : "–";
}

function badge(status, extra = "") {
  return `<span class="badge ${esc(status)}" data-testid="status">${esc(status)}${extra}</span>`;
}

function turnLink(t) {
  return `#/turn/${encodeURIComponent(t.agent)}/${encodeURIComponent(t.turn_id)}`;
}

// -- live stream ----------------------------------------------------------------------

function connect() {
  if (source) source.close();
  const url = "/api/live" + (state.watched ? `?turn=${encodeURIComponent(state.watched)}` : "");
  source = new EventSource(url);
  source.addEventListener("update", (e) => apply(JSON.parse(e.data)));
  source.onopen = () => setLive(true);
  source.onerror = () => setLive(false);
}

function setLive(ok) {
  const error = ok && state.config.error;
  document.getElementById("live").classList.toggle("ok", ok && !error);
  document.getElementById("live").title = error || "live updates from Kafka (read_committed)";
  document.getElementById("live-text").textContent = error ? "Kafka unreachable, retrying" : ok ? "live" : "reconnecting";
}

function apply(update) {
  state.config = update.config;
  document.getElementById("signout").hidden = !state.config.signed_in;
  setLive(true);
  if (update.snapshot) {
    state.turns.clear();
    state.deadLetters.clear();
  }
  for (const t of update.turns) state.turns.set(`${t.agent}/${t.turn_id}`, t);
  for (const d of update.dead_letters) {
    state.deadLetters.set(`${d.agent}/${d.partition}/${d.offset}`, d);
  }
  if (update.turn && `${update.turn.agent}/${update.turn.turn_id}` === state.watched) {
    state.turn = update.turn;
  }
  trim();
  render();
}

function trim() {
  // Keep what the server keeps: the newest turns per agent (running ones stay).
  const byAgent = new Map();
  for (const [key, t] of state.turns) {
    if (!byAgent.has(t.agent)) byAgent.set(t.agent, []);
    byAgent.get(t.agent).push([key, t]);
  }
  for (const rows of byAgent.values()) {
    const finished = rows.filter(([, t]) => t.status !== "running")
      .sort((a, b) => (a[1].last_ms || 0) - (b[1].last_ms || 0));
    for (let i = 0; rows.length - i > state.config.max_turns && i < finished.length; i++) {
      state.turns.delete(finished[i][0]);
    }
  }
  // And the newest dead letters per agent: a long-open page must not grow without end.
  const letters = new Map();
  for (const [key, d] of state.deadLetters) {
    if (!letters.has(d.agent)) letters.set(d.agent, []);
    letters.get(d.agent).push([key, d]);
  }
  for (const rows of letters.values()) {
    rows.sort((a, b) => a[1].ts_ms - b[1].ts_ms || a[1].offset - b[1].offset);
    for (const [key] of rows.slice(0, Math.max(0, rows.length - state.config.max_dead_letters))) {
      state.deadLetters.delete(key);
    }
  }
}

// -- routing --------------------------------------------------------------------------

function route() {
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/turn\/([^/]+)\/([^/]+)$/);
  const watched = m ? `${decodeURIComponent(m[1])}/${decodeURIComponent(m[2])}` : "";
  if (watched !== state.watched) {
    state.watched = watched;
    state.turn = null;
    state.notice = "";
    connect();
    if (m) load(decodeURIComponent(m[1]), decodeURIComponent(m[2]));
  }
  const other = hash.startsWith("#/dlq") || hash.startsWith("#/waiting") || hash.startsWith("#/evals");
  document.getElementById("nav-turns").classList.toggle("on", !other);
  document.getElementById("nav-waiting").classList.toggle("on", hash.startsWith("#/waiting"));
  document.getElementById("nav-dlq").classList.toggle("on", hash.startsWith("#/dlq"));
  document.getElementById("nav-evals").classList.toggle("on", hash.startsWith("#/evals"));
  if (hash.startsWith("#/waiting")) loadWaiting();
  if (hash.startsWith("#/evals")) loadEvals();
  render();
}

async function load(agent, turnId) {
  const res = await fetch(`/api/turns/${encodeURIComponent(agent)}/${encodeURIComponent(turnId)}`);
  const body = await res.json();
  if (`${agent}/${turnId}` !== state.watched) return;
  if (res.ok) {
    if (!state.turn || state.turn.version <= body.version) state.turn = body;
  } else {
    state.notice = body.error;
  }
  render();
}

function render() {
  const hash = location.hash || "#/";
  const count = state.deadLetters.size;
  document.getElementById("dlq-count").textContent = count ? String(count) : "";
  if (hash.startsWith("#/dlq")) renderDeadLetters();
  else if (hash.startsWith("#/waiting")) renderWaiting();
  else if (hash.startsWith("#/evals")) renderEvals();
  else if (state.watched) renderTurn();
  else renderTurns();
}

// -- turns list -----------------------------------------------------------------------

function renderTurns() {
  const f = state.filters;
  const rows = [...state.turns.values()]
    .filter((t) => !f.agent || t.agent === f.agent)
    .filter((t) => !f.tenant || t.tenant === f.tenant)
    .filter((t) => !f.status || t.status === f.status)
    .filter((t) => !f.thread || (t.thread_id || "").includes(f.thread))
    .filter((t) => !f.q || t.turn_id.includes(f.q.trim()))
    .sort((a, b) => (b.started_ms || b.last_ms) - (a.started_ms || a.last_ms));
  const agents = [...new Set([...state.config.agents, ...[...state.turns.values()].map((t) => t.agent)])].sort();
  const tenants = [...new Set([...state.turns.values()].map((t) => t.tenant).filter(Boolean))].sort();
  if (f.tenant && !tenants.includes(f.tenant)) tenants.push(f.tenant);
  const option = (v, label, current) =>
    `<option value="${esc(v)}"${v === current ? " selected" : ""}>${esc(label)}</option>`;
  const running = [...state.turns.values()].filter((t) => t.status === "running").length;
  if (document.activeElement && document.activeElement.closest && document.activeElement.closest(".filters")) {
    // Typing in a filter: keep the inputs, refresh the rows and any new choices.
    syncOptions("f-agent", option("", "all agents", f.agent) + agents.map((a) => option(a, a, f.agent)).join(""));
    syncOptions("f-tenant", option("", "all tenants", f.tenant) + tenants.map((a) => option(a, a, f.tenant)).join(""));
    updateTurnRows(rows);
    return;
  }
  view.innerHTML = `
    <section class="page-head">
      <h1>Turns</h1>
      <p class="sub">${state.turns.size} recent · ${running} running · ${agents.length} agent${agents.length === 1 ? "" : "s"}${state.config.skipped_events ? ` · <span class="warn" data-testid="skipped">${esc(state.config.skipped_events)} event${state.config.skipped_events === 1 ? "" : "s"} could not be shown (see the UI's log)</span>` : ""}</p>
    </section>
    <form class="filters" onsubmit="return false">
      <select id="f-agent" aria-label="agent">${option("", "all agents", f.agent)}${agents.map((a) => option(a, a, f.agent)).join("")}</select>
      <select id="f-tenant" aria-label="tenant">${option("", "all tenants", f.tenant)}${tenants.map((a) => option(a, a, f.tenant)).join("")}</select>
      <select id="f-status" aria-label="status">${["", "running", "completed", "failed", "cancelled"].map((s) => option(s, s || "any status", f.status)).join("")}</select>
      <input id="f-thread" placeholder="thread" value="${esc(f.thread)}" aria-label="thread">
      <input id="f-q" placeholder="search turn id (older turns load by id)" value="${esc(f.q)}" aria-label="turn id">
      <button id="f-open" type="button">Open</button>
    </form>
    <div id="turn-rows"></div>`;
  for (const [id, key] of [["f-agent", "agent"], ["f-tenant", "tenant"], ["f-status", "status"], ["f-thread", "thread"], ["f-q", "q"]]) {
    document.getElementById(id).addEventListener("input", (e) => {
      state.filters[key] = e.target.value;
      renderTurns();
    });
  }
  document.getElementById("f-open").addEventListener("click", openById);
  document.getElementById("f-q").addEventListener("keydown", (e) => { if (e.key === "Enter") openById(); });
  updateTurnRows(rows);
}

function syncOptions(id, html) {
  // Only when the choices changed: rewriting a select's options closes it.
  const el = document.getElementById(id);
  if (el && el.dataset.options !== html) {
    el.innerHTML = html;
    el.dataset.options = html;
  }
}

function openById() {
  const q = state.filters.q.trim();
  const agent = state.filters.agent || (state.config.agents.length === 1 ? state.config.agents[0] : "");
  if (!q) return;
  if (!agent) {
    state.notice = "choose an agent to open a turn by id";
    renderTurns();
    return;
  }
  location.hash = `#/turn/${encodeURIComponent(agent)}/${encodeURIComponent(q)}`;
}

function updateTurnRows(rows) {
  const el = document.getElementById("turn-rows");
  if (!el) return;
  if (!rows.length) {
    const q = state.filters.q.trim();
    const hint = q ? `No recent turn matches; Open loads turn ${q} by id from Kafka.` : "No turns yet. They appear here as their events are committed.";
    el.innerHTML = `<div class="empty">${esc(state.notice || hint)}</div>`;
    return;
  }
  const tenantCol = [...state.turns.values()].some((t) => t.tenant); // agents with tenant=
  el.innerHTML = `
    <table class="turns">
      <thead><tr><th>status</th><th>turn</th><th>agent</th>${tenantCol ? "<th>tenant</th>" : ""}<th>thread</th><th>attempt</th>
        <th>started</th><th class="num">duration</th><th class="num">model calls</th>
        <th class="num">tool calls</th><th class="num">tokens</th><th class="num">cost</th></tr></thead>
      <tbody>${rows.map((t) => `
        <tr data-testid="turn-row" data-turn-id="${esc(t.turn_id)}" class="${esc(t.status)}">
          <td>${badge(t.status)}${t.error_code ? ` <code class="err">${esc(t.error_code)}</code>` : ""}</td>
          <td><a class="mono" href="${turnLink(t)}">${esc(t.turn_id.slice(0, 12))}</a></td>
          <td>${esc(t.agent)}</td>
          ${tenantCol ? `<td data-testid="tenant">${esc(t.tenant || "–")}</td>` : ""}
          <td class="mono dim">${esc(t.thread_id || "–")}</td>
          <td class="${t.attempt > 1 ? "warn" : "dim"}">${esc(t.attempt)}</td>
          <td class="dim">${clock(t.started_ms)}</td>
          <td class="num">${duration(t.started_ms, t.ended_ms)}</td>
          <td class="num">${esc(t.model_calls)}</td>
          <td class="num">${esc(t.tool_calls)}</td>
          <td class="num">${esc(t.tokens.toLocaleString())}</td>
          <td class="num">${cost(t.cost_usd)}</td>
        </tr>`).join("")}</tbody>
    </table>`;
}

// -- one turn's timeline --------------------------------------------------------------

function renderTurn() {
  const t = state.turn;
  if (!t) {
    view.innerHTML = `<a class="back" href="#/">← turns</a><div class="empty">${esc(state.notice) || "Loading the turn's events…"}</div>`;
    return;
  }
  const start = t.started_ms || (t.steps[0] && (t.steps[0].started_ms || t.steps[0].ts_ms)) || t.last_ms;
  const end = t.ended_ms || Math.max(t.last_ms, Date.now());
  const span = Math.max(1, end - start);
  const actions = state.config.allow_actions && t.status === "running"
    ? `<div class="actions" data-turn="${esc(t.agent)}/${esc(t.turn_id)}"><button data-action="cancel">Cancel</button><button class="danger" data-action="terminate">Terminate</button></div>`
    : "";
  const facts = [
    ["agent", esc(t.agent)],
    ["attempt", esc(t.attempt)],
    ["started", clock(t.started_ms)],
    ["duration", duration(t.started_ms, t.ended_ms)],
    ["model calls", esc(t.model_calls)],
    ["tool calls", esc(t.tool_calls)],
    ["tokens", `${esc(t.input_tokens.toLocaleString())} in · ${esc(t.output_tokens.toLocaleString())} out`],
    ["cost", cost(t.cost_usd)],
  ];
  if (t.tenant) facts.push(["tenant", esc(t.tenant)]);
  if (t.agent_version) facts.push(["version", `<span data-testid="agent-version">${esc(t.agent_version)}</span>`]);
  if (t.thread_id) facts.push(["thread", `<span class="mono">${esc(t.thread_id)}</span>`]);
  if (t.worker) facts.push(["worker", `<span class="mono">${esc(t.worker)}</span>`]);
  if (t.parent) {
    const parent = t.parent.agent
      ? `<a class="mono" data-testid="parent-link" href="${turnLink(t.parent)}">${esc(t.parent.turn_id.slice(0, 12))}</a> <span class="dim">(${esc(t.parent.agent)})</span>`
      : `<span class="mono">${esc(t.parent.turn_id)}</span>`;
    facts.push(["called by", parent]);
  }
  const kept = view.querySelector(".turn-head .actions");
  view.innerHTML = `
    <a class="back" href="#/">← turns</a>
    <section class="turn-head">
      <div class="title">
        <h1 class="mono">${esc(t.turn_id)}</h1>
        ${badge(t.status)}
      </div>
      ${actions}
    </section>
    <dl class="facts">${facts.map(([k, v]) => `<div><dt>${k}</dt><dd>${v}</dd></div>`).join("")}</dl>
    ${t.partial ? `<p class="note">The first events of this turn are older than what the UI read; showing what it has.</p>` : ""}
    ${t.params ? `<details class="params"${state.paramsOpen ? " open" : ""}><summary>request parameters</summary><pre>${esc(json(t.params))}</pre></details>` : ""}
    <h2>Timeline</h2>
    <ol class="timeline" data-testid="timeline">
      ${t.started_ms ? `<li class="started"><div class="gutter"></div><div class="body"><span class="kind">Started</span> <span class="dim">${clock(t.started_ms)}${t.worker ? ` on worker <span class="mono">${esc(t.worker)}</span>` : ""}</span></div></li>` : ""}
      ${t.steps.map((s) => step(s, start, span)).join("")}
      ${outcome(t)}
    </ol>
    ${scores(t.scores || [])}`;
  // The same turn's buttons survive a re-render (a busy turn re-renders many times a
  // second): a button replaced under the pointer would swallow the click.
  const fresh = view.querySelector(".turn-head .actions");
  if (kept && fresh && kept.dataset.turn === fresh.dataset.turn) fresh.replaceWith(kept);
  else for (const b of view.querySelectorAll("[data-action]")) b.addEventListener("click", () => act(t, b.dataset.action));
  const params = view.querySelector("details.params");
  if (params) params.addEventListener("toggle", () => { state.paramsOpen = params.open; });
}

function bar(s, start, span) {
  const from = (s.started_ms || s.ts_ms || start) - start;
  const to = (s.ended_ms || (s.state === "running" ? Date.now() : s.started_ms || s.ts_ms || start)) - start;
  const left = Math.min(99, (100 * from) / span);
  const width = Math.max(0.8, Math.min(100 - left, (100 * (to - from)) / span));
  return `<div class="bar"><span class="${esc(s.kind)} ${esc(s.state)}" style="left:${left.toFixed(2)}%;width:${width.toFixed(2)}%"></span></div>`;
}

function stepState(s) {
  const parts = [];
  if (s.state === "running") parts.push(`<span class="badge running">running</span>`);
  if (s.state === "interrupted") parts.push(`<span class="badge interrupted">interrupted</span>`);
  if (s.replayed) parts.push(`<span class="badge replayed" title="recorded by attempt ${esc(s.attempt)}; later attempts took it from the journal">replayed</span>`);
  if (s.kind === "subagent" && s.status) parts.push(`<span class="badge ${s.status === "completed" ? "completed" : "failed"}">${esc(s.status)}</span>`);
  if (s.kind === "tool" && s.status) parts.push(`<span class="badge ${s.status === "ok" ? "completed" : "failed"}">${esc(s.status)}</span>`);
  if (s.cached) parts.push(`<span class="badge replayed">cached</span>`);
  return parts.join(" ");
}

function step(s, start, span) {
  if (s.kind === "attempt") {
    const why = s.cause === "reply"
      ? "the turn resumed when its sub-agent's reply arrived"
      : "the previous attempt stopped before finishing (worker crash, restart or rebalance)";
    return `<li class="attempt-mark" data-testid="attempt">Attempt ${esc(s.attempt)} · ${clock(s.ts_ms)} — ${why}; steps recorded before were taken from the journal, not run again</li>`;
  }
  if (s.kind === "status") {
    return `<li class="step status-step" data-testid="step" data-kind="status"><div class="gutter"></div><div class="body"><div class="line"><span class="kind">status${s.tool ? ` · ${esc(s.tool)}` : ""}${s.waiting ? ` · waiting for ${esc(s.waiting)}` : ""}</span><span class="dim">${clock(s.ts_ms)}</span></div><p>${esc(s.text)}</p></div></li>`;
  }
  const took = s.ended_ms ? duration(s.started_ms, s.ended_ms) : s.state === "running" ? duration(s.started_ms) : "";
  let title;
  let body;
  if (s.kind === "model") {
    title = `Model call ${s.call + 1}${s.model ? ` <span class="dim">· ${esc(s.model)}</span>` : ""}${s.by_batch ? ` <span class="dim">· by batch</span>` : ""}`;
    const calls = (s.tool_calls || []).map((c) => `<li><code>${esc(c.name)}</code><pre>${esc(json(c.input))}</pre></li>`).join("");
    const usage = s.usage ? `<span class="dim">${esc(s.usage.input_tokens ?? 0)} in · ${esc(s.usage.output_tokens ?? 0)} out${s.stop_reason ? ` · ${esc(s.stop_reason)}` : ""}</span>` : "";
    body = `
      ${s.text ? `<div class="text" data-testid="model-text">${esc(s.text)}${s.state === "running" ? '<span class="caret"></span>' : ""}</div>` : s.state === "running" ? `<div class="text dim">waiting for the model…<span class="caret"></span></div>` : ""}
      ${calls ? `<div class="asks">asks for ${s.tool_calls.length} tool call${s.tool_calls.length > 1 ? "s" : ""}:</div><ul class="calls">${calls}</ul>` : ""}
      ${usage}`;
  } else if (s.kind === "subagent") {
    const child = { agent: s.child_agent, turn_id: s.child_turn_id };
    title = `Sub-agent <code>${esc(s.child_agent || "?")}</code> <span class="dim">· turn</span> <a class="mono" data-testid="child-link" href="${turnLink(child)}">${esc(String(s.child_turn_id).slice(0, 12))}</a>`;
    body = `
      <div class="io">
        <div><div class="label">request</div><pre>${esc(json(s.input ?? {}))}</pre></div>
        <div><div class="label">reply${s.error_code ? ` · <code class="err">${esc(s.error_code)}</code>` : ""}</div>
          <pre class="${s.status && s.status !== "completed" ? "failed-text" : ""}">${s.state === "done" ? esc(json(s.result)) : '<span class="dim">waiting for the child turn…</span>'}</pre></div>
      </div>`;
  } else {
    title = `Tool <code>${esc(s.tool || "?")}</code> <span class="dim">· call ${esc(s.call_key)}</span>`;
    body = `
      <div class="io">
        <div><div class="label">arguments</div><pre>${esc(json(s.input ?? {}))}</pre></div>
        <div><div class="label">result${s.attempts > 1 ? ` · ${esc(s.attempts)} attempts` : ""}${s.error_code ? ` · <code class="err">${esc(s.error_code)}</code>` : ""}</div>
          <pre class="${s.status === "error" ? "failed-text" : ""}">${s.state === "done" ? esc(json(s.output)) : '<span class="dim">running…</span>'}</pre></div>
      </div>`;
  }
  return `
    <li class="step ${esc(s.kind)} ${esc(s.state)}" data-testid="step" data-kind="${esc(s.kind)}">
      <div class="gutter"></div>
      <div class="body">
        <div class="line"><span class="kind">${title}</span> ${stepState(s)}<span class="grow"></span><span class="dim">${clock(s.started_ms)} · ${took}</span></div>
        ${bar(s, start, span)}
        ${body}
      </div>
    </li>`;
}

function scoreValue(s) {
  const parts = [];
  if (s.passed !== null && s.passed !== undefined) parts.push(`<span class="badge ${s.passed ? "completed" : "failed"}">${s.passed ? "pass" : "fail"}</span>`);
  if (s.number !== null && s.number !== undefined) parts.push(`<span class="mono">${esc(s.number)}</span>`);
  if (s.label) parts.push(`<code>${esc(s.label)}</code>`);
  if (s.timed_out) parts.push(`<span class="dim">timed out</span>`);
  return parts.join(" ");
}

function scores(list) {
  if (!list.length) return "";
  return `<h2>Scores</h2>
    <table class="scores" data-testid="scores"><thead><tr><th>evaluator</th><th>kind</th><th>version</th><th>score</th><th>reason</th></tr></thead><tbody>
    ${list.map((s) => `<tr data-testid="score"><td>${esc(s.evaluator)} <span class="dim">v${esc(s.evaluator_version)}</span></td><td>${esc(s.kind)}</td><td>${esc(s.agent_version)}</td><td>${scoreValue(s)}</td><td>${esc(s.reason)}</td></tr>`).join("")}
    </tbody></table>`;
}

async function loadEvals() {
  const res = await fetch("/api/evals");
  const body = await res.json();
  state.evals = { agents: body.agents || [], loaded: true };
  if ((location.hash || "").startsWith("#/evals")) renderEvals();
}

function figure(value, measure) {
  if (value === null || value === undefined) return "n/a";
  return measure === "pass_rate" ? `${(100 * value).toFixed(1)}%` : Number(value).toPrecision(4);
}

function renderEvals() {
  const e = state.evals;
  const agents = e.agents.filter((a) => a.measures.length);
  const body = agents.map((a) => a.measures.map((m) => `
    <section class="evals" data-testid="evals">
      <h2>${esc(a.agent)} · ${esc(m.evaluator)} <span class="dim">v${esc(m.evaluator_version)} · ${m.measure === "pass_rate" ? "pass rate" : "mean"}</span></h2>
      <table><thead><tr><th>version</th><th>n</th><th>${m.measure === "pass_rate" ? "pass rate" : "mean"}</th><th>95% interval</th></tr></thead><tbody>
      ${m.versions.map((v) => `<tr data-testid="eval-version"><td>${esc(v.version || "(none)")}</td><td>${esc(v.n)}</td><td>${figure(v.value, m.measure)}</td><td>${figure(v.ci95[0], m.measure)} – ${figure(v.ci95[1], m.measure)}</td></tr>`).join("")}
      </tbody></table>
      ${m.comparisons.map((c) => `<p class="${c.significant ? "" : "dim"}" data-testid="eval-verdict">${esc(c.candidate || "(none)")} vs ${esc(c.baseline || "(none)")}: ${c.significant ? `<strong>${esc(c.verdict)}</strong>` : esc(c.verdict)} (difference ${figure(c.difference, m.measure)}, 95% interval ${figure(c.ci95[0], m.measure)} – ${figure(c.ci95[1], m.measure)}, p=${esc(c.p_value)})</p>`).join("")}
    </section>`).join("")).join("");
  view.innerHTML = `
    <section class="page-head">
      <h1>Evaluation</h1>
      <p class="sub">each agent version's scores, from the scores this UI has read</p>
    </section>
    ${body || `<div class="empty">${e.loaded ? "No scores yet: declare evaluators on an agent." : "Loading…"}</div>`}`;
}

function outcome(t) {
  if (t.status === "running") {
    return `<li class="outcome running"><div class="gutter"></div><div class="body"><span class="badge running">running</span> <span class="dim">new steps appear as their events are committed</span></div></li>`;
  }
  if (t.status === "completed") {
    return `<li class="outcome completed" data-testid="outcome"><div class="gutter"></div><div class="body"><div class="line"><span class="kind">Completed</span><span class="grow"></span><span class="dim">${clock(t.ended_ms)}</span></div><pre>${esc(typeof t.result === "string" ? t.result : json(t.result))}</pre></div></li>`;
  }
  const e = t.error || {};
  return `<li class="outcome failed" data-testid="outcome"><div class="gutter"></div><div class="body"><div class="line"><span class="kind">${t.status === "cancelled" ? "Cancelled" : "Failed"}</span> <code class="err" data-testid="error-code">${esc(e.code)}</code><span class="grow"></span><span class="dim">${clock(t.ended_ms)}</span></div><p class="failed-text">${esc(e.message)}</p>${e.error_type ? `<p class="dim">${esc(e.error_type)}</p>` : ""}</div></li>`;
}

async function act(t, action) {
  if (!confirm(`${action} turn ${t.turn_id}?`)) return;
  const res = await fetch(`/api/turns/${encodeURIComponent(t.agent)}/${encodeURIComponent(t.turn_id)}/${action}`, {
    method: "POST",
    headers: { "x-pyrula-action": action },
  });
  const body = await res.json();
  if (!res.ok) alert(body.error);
}

// -- questions waiting for a person ----------------------------------------------------

async function loadWaiting() {
  const res = await fetch("/api/waiting");
  const body = await res.json();
  state.waiting = { questions: body.questions || [], errors: body.errors || [], loaded: true };
  document.getElementById("waiting-count").textContent = state.waiting.questions.length ? String(state.waiting.questions.length) : "";
  if ((location.hash || "").startsWith("#/waiting") && !(document.activeElement && document.activeElement.closest && document.activeElement.closest(".question"))) renderWaiting();
}

function renderWaiting() {
  const w = state.waiting;
  const args = (q) => q.tool_name
    ? `<div class="line"><span class="kind">${esc(q.tool_name)}</span></div><pre data-testid="question-input">${esc(json(q.tool_input))}</pre>`
    : `<pre data-testid="question-input">${esc(json(q.question))}</pre>`;
  const buttons = (q, i) => state.config.allow_actions ? `
      <div class="actions">
        <input class="reason" id="reason-${i}" data-i="${i}" placeholder="reason (optional)" aria-label="reason" value="${esc(state.reasons.get(`${q.turn_id}/${q.key}`) || "")}">
        <button data-answer="approve" data-i="${i}">Approve</button>
        <button class="danger" data-answer="reject" data-i="${i}">Reject</button>
      </div>` : "";
  view.innerHTML = `
    <section class="page-head">
      <h1>Waiting</h1>
      <p class="sub">turns parked on a question for a person, oldest first${state.config.allow_actions ? "" : " · start the UI with <code>--allow-actions</code> to answer here"}</p>
    </section>
    ${w.errors.map((e) => `<p class="note">${esc(e)}</p>`).join("")}
    ${!w.loaded ? `<div class="empty">Loading…</div>` : w.questions.length ? "" : `<div class="empty">Nothing is waiting.</div>`}
    <ol class="letters">${w.questions.map((q, i) => `
      <li class="letter question" data-testid="question" data-turn="${esc(q.turn_id)}">
        <div class="line"><code>${esc(q.reason)}</code><span class="agent">${esc(q.agent)}</span>
          <a class="mono" href="${turnLink(q)}" data-testid="question-turn">${esc(q.turn_id.slice(0, 12))}</a>
          <span class="grow"></span><span class="dim">asked ${clock(q.asked_ms)}${q.deadline_ms ? ` · expires ${clock(q.deadline_ms)}` : ""}</span></div>
        <p class="mono dim" data-testid="question-key">${esc(q.key)}</p>
        ${args(q)}
        ${buttons(q, i)}
      </li>`).join("")}</ol>`;
  const focused = document.activeElement && document.activeElement.id;
  for (const input of view.querySelectorAll("input.reason")) {
    const q = w.questions[Number(input.dataset.i)];
    input.addEventListener("input", () => state.reasons.set(`${q.turn_id}/${q.key}`, input.value));
  }
  if (focused && focused.startsWith("reason-") && document.getElementById(focused)) {
    const input = document.getElementById(focused);
    input.focus();
    input.setSelectionRange(input.value.length, input.value.length);
  }
  for (const b of view.querySelectorAll("[data-answer]")) {
    const q = w.questions[Number(b.dataset.i)];
    b.addEventListener("click", () => answer(q, b.dataset.answer, state.reasons.get(`${q.turn_id}/${q.key}`) || ""));
  }
}

async function answer(q, verdict, reason) {
  const res = await fetch(`/api/questions/${encodeURIComponent(q.agent)}/${encodeURIComponent(q.turn_id)}/${verdict}`, {
    method: "POST",
    headers: { "x-pyrula-action": verdict, "content-type": "application/json" },
    body: JSON.stringify({ key: q.key, reason }),
  });
  const body = await res.json();
  if (!res.ok) alert(body.error);
  if (document.activeElement) document.activeElement.blur();
  await loadWaiting();
}

setInterval(() => { if ((location.hash || "").startsWith("#/waiting")) loadWaiting(); }, 2000);
setInterval(() => { if ((location.hash || "").startsWith("#/evals")) loadEvals(); }, 5000);

// -- dead letters ---------------------------------------------------------------------

function renderDeadLetters() {
  const letters = [...state.deadLetters.values()].sort((a, b) => b.ts_ms - a.ts_ms);
  const kv = (obj) => Object.entries(obj).map(([k, v]) => `<div><dt>${esc(k)}</dt><dd class="mono">${esc(v)}</dd></div>`).join("");
  view.innerHTML = `
    <section class="page-head">
      <h1>Dead letters</h1>
      <p class="sub">records the workers could not process, with the reason, from <code>&lt;prefix&gt;.&lt;agent&gt;.dlq</code></p>
    </section>
    ${letters.length ? "" : `<div class="empty">No dead letters.</div>`}
    <ol class="letters">${letters.map((d) => `
      <li class="letter" data-testid="dead-letter">
        <div class="line"><code class="err">${esc(d.code || "no code")}</code><span class="agent">${esc(d.agent)}</span><span class="grow"></span><span class="dim">${clock(d.ts_ms)}</span></div>
        <p class="reason" data-testid="reason">${esc(d.reason || "(no reason header)")}</p>
        <dl class="kv">
          <div><dt>source</dt><dd class="mono">${esc(d.source || "–")}</dd></div>
          <div><dt>dlq offset</dt><dd class="mono">[${esc(d.partition)}]@${esc(d.offset)}</dd></div>
          <div><dt>key</dt><dd class="mono">${esc(d.key ?? "–")}</dd></div>
          ${kv(d.headers)}
        </dl>
        ${Object.keys(d.original_headers).length ? `<div class="label">original headers</div><dl class="kv">${kv(d.original_headers)}</dl>` : ""}
        <div class="label">value · ${esc(d.value_bytes)} bytes</div><pre>${esc(d.value_preview)}</pre>
        ${state.config.allow_actions && d.partition === 0 ? `<div class="actions"><button data-testid="redrive" data-agent="${esc(d.agent)}" data-offset="${esc(d.offset)}">Redrive</button></div>` : ""}
      </li>`).join("")}</ol>`;
  for (const b of view.querySelectorAll("button[data-testid=redrive]")) {
    b.addEventListener("click", () => redrive(b.dataset.agent, b.dataset.offset));
  }
}

async function redrive(agent, offset) {
  if (!confirm(`send dead letter ${offset} of ${agent} back to its source?`)) return;
  const res = await fetch(`/api/dlq/${encodeURIComponent(agent)}/${encodeURIComponent(offset)}/redrive`, {
    method: "POST",
    headers: { "x-pyrula-action": "redrive" },
  });
  const body = await res.json();
  alert(res.ok ? `${body.outcome}: ${body.detail}` : body.error);
}

// Durations of running turns tick; the page re-renders only when something runs.
setInterval(() => {
  const running = state.watched ? state.turn && state.turn.status === "running"
    : !location.hash.startsWith("#/dlq") && [...state.turns.values()].some((t) => t.status === "running");
  if (running) render();
}, 1000);

window.addEventListener("hashchange", route);
route(); // opens the live stream for a turn's page
if (!source) connect();
