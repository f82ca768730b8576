// The gateway's routes live under /agents (pyrula-stream gateway --prefix).
const PREFIX = "/agents";
const $ = (id) => document.getElementById(id);
let agents = [];
let source = null;

function say(text, bad = false) {
  $("state").textContent = text;
  $("state").className = bad ? "bad" : "dim";
}

async function loadAgents() {
  const answer = await fetch(`${PREFIX}/`, { credentials: "same-origin" });
  if (answer.status === 401) {
    window.location.href = "/login"; // the gateway asks for a key once, then keeps a cookie
    return;
  }
  agents = (await answer.json()).agents;
  $("agent").innerHTML = "";
  for (const agent of agents) {
    $("agent").append(new Option(agent.name, agent.name));
  }
  showFields();
  $("send").disabled = agents.length === 0;
  say(agents.length ? "ready" : "this gateway serves no agent");
}

function showFields() {
  const agent = agents.find((a) => a.name === $("agent").value);
  const fields = $("fields");
  fields.innerHTML = "";
  const properties = agent && agent.parameters ? agent.parameters.properties || {} : null;
  if (!properties) { // served by name: the parameters go as JSON, the worker checks them
    fields.append(field("parameters (JSON)", "__json", true, '{"text": "hello"}'));
    return;
  }
  const required = agent.parameters.required || [];
  for (const name of Object.keys(properties)) {
    fields.append(field(name, name, required.includes(name), "", properties[name].type));
  }
}

function field(label, name, required, value, type) {
  const wrap = document.createElement("label");
  wrap.textContent = label;
  const long = name === "__json" || /question|text|message|prompt/.test(name);
  const input = document.createElement(long ? "textarea" : "input");
  input.name = name;
  input.required = required;
  input.value = value;
  input.dataset.type = type || "string";
  wrap.append(input);
  return wrap;
}

function parameters() {
  const params = {};
  for (const input of $("fields").querySelectorAll("input, textarea")) {
    if (input.name === "__json") return JSON.parse(input.value || "{}");
    if (input.value === "" && !input.required) continue;
    const type = input.dataset.type;
    params[input.name] = type === "integer" || type === "number" ? Number(input.value)
      : type === "boolean" ? input.value === "true" : input.value;
  }
  return params;
}

async function ask(event) {
  event.preventDefault();
  if (source) source.close();
  const agent = $("agent").value;
  $("send").disabled = true;
  let body;
  try {
    body = JSON.stringify(parameters());
  } catch (err) {
    say(`the parameters are not JSON: ${err.message}`, true);
    $("send").disabled = false;
    return;
  }
  const answer = await fetch(`${PREFIX}/${encodeURIComponent(agent)}/turns`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body,
  });
  const sent = await answer.json();
  $("send").disabled = false;
  if (answer.status !== 202) {
    say(`${sent.code}: ${sent.error}`, true);
    return;
  }
  follow(sent);
}

function follow(turn) {
  $("turn").hidden = false;
  $("turn-id").textContent = turn.turn_id;
  $("turn-state").textContent = "queued";
  $("tools").innerHTML = "";
  $("answer").textContent = "";
  $("result").hidden = true;
  const tools = new Map();
  // EventSource reconnects by itself and sends Last-Event-ID: the gateway resumes there.
  source = new EventSource(turn.events_url, { withCredentials: true });
  const on = (type, handle) =>
    source.addEventListener(type, (e) => handle(JSON.parse(e.data).data || {}));
  on("run:start", () => { $("turn-state").textContent = "running"; });
  on("llm:delta", (data) => { $("answer").textContent += data.text || ""; });
  on("llm:complete", () => {
    const answer = $("answer");
    if (answer.textContent && !answer.textContent.endsWith("\n")) answer.textContent += "\n";
  });
  on("tool:start", (data) => {
    const item = document.createElement("li");
    item.textContent = `${data.tool}(${JSON.stringify(data.input || {})}) …`;
    tools.set(data.call_key || data.tool, item);
    $("tools").append(item);
  });
  on("tool:result", (data) => {
    const item = tools.get(data.call_key || data.tool);
    if (item) item.textContent = item.textContent.replace(/ …$/, ` → ${data.status}`);
  });
  on("run:complete", (data) => finish("completed", data.result));
  on("run:error", (data) => finish("failed", `${data.code}: ${data.message}`, true));
  on("stream:error", (data) => finish("stream lost", `${data.code}: ${data.error}`, true));
}

function finish(state, result, bad = false) {
  source.close(); // the stream ended after its terminal event: do not reconnect
  source = null;
  $("turn-state").textContent = state;
  $("turn-state").className = bad ? "bad" : "";
  $("result").hidden = false;
  $("result").textContent = typeof result === "string" ? result : JSON.stringify(result, null, 2);
}

$("agent").addEventListener("change", showFields);
$("ask").addEventListener("submit", ask);
loadAgents().catch((err) => say(`cannot reach the gateway: ${err.message}`, true));
