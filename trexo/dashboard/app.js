// The trexo dashboard. Everything it shows comes from the node's public API: the cluster
// live from GET /state/events (one server-sent event per change), the catalog from
// GET /v1/models when placements change; it places and deletes through /instances and
// chats through /v1/chat/completions. It talks only to the node that served it, which
// forwards commands to whichever node is master, so it keeps working across failovers.
// On a node with API keys, the first 401 asks for a key; it is kept for this tab
// (sessionStorage) and sent as `Authorization: Bearer KEY` on every request, the live feed
// included (read with fetch, since EventSource cannot send a header).
"use strict";

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948", "#9c755f"];
const MAX_CHANGES = 50;
const MAX_MESSAGES = 6;
const NOTE_MS = 5000;
const RECONNECT_MS = 2000; // after a refusal (e.g. 503: too many streams)
const DEFAULT_RETRY_MS = 1000; // after a lost stream, until the stream says (`retry:`)
const KEY_STORAGE = "trexo-api-key";

let current = null; // the last /state/events event
let models = []; // the last /v1/models listing
let chat = null; // the generation streaming now, if any
const conversation = [];
let apiKey = sessionStorage.getItem(KEY_STORAGE); // null: none asked for yet

// --- small helpers ----------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key === "data") Object.assign(node.dataset, value);
    else if (key === "on") for (const [name, handler] of Object.entries(value)) node.addEventListener(name, handler);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

function button(text, onClick, props = {}) {
  return el("button", { type: "button", text, on: { click: onClick }, ...props });
}

function svg(tag, attributes = {}, text = null) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}

function formatBytes(n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) { n /= 1024; unit += 1; }
  return `${n.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

// Rebuilds `container` only when what it shows changed: the elements (and a button being
// clicked, a selection) survive events that change something else.
const shown = new WeakMap();
function update(container, inputs, build) {
  const key = JSON.stringify(inputs);
  if (shown.get(container) === key) return;
  shown.set(container, key);
  container.replaceChildren(...build());
}

const short = (id) => id.slice(0, 8);
const percent = (fraction) => `${Math.round(fraction * 100)}%`;

// Each node keeps the colour it got when this page first saw it (the first 8 differ).
const colours = new Map();
function colour(nodeId) {
  if (!colours.has(nodeId)) colours.set(nodeId, PALETTE[colours.size % PALETTE.length]);
  return colours.get(nodeId);
}

// A node's API address as its peers report it, as a URL only if it is an http(s) one:
// anything else (not a URL, `javascript:`) is shown as text and never followed.
function httpUrl(text) {
  if (typeof text !== "string") return null;
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url : null;
  } catch {
    return null;
  }
}

function nodeLabel(nodeId, state = current?.state) {
  const node = state?.nodes[nodeId];
  if (!node) return short(nodeId);
  const port = httpUrl(node.api_url)?.port ?? "";
  return port ? `${node.hostname}:${port}` : `${node.hostname} ${short(nodeId)}`;
}

// --- talking to the API -------------------------------------------------------------------

// Every request goes through here: it carries the key, and a 401 asks for one.
async function request(path, options = {}) {
  const headers = { ...options.headers };
  if (apiKey !== null) headers.Authorization = `Bearer ${apiKey}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) askForKey();
  return response;
}

async function api(method, path, body, headers = {}) {
  const options = { method, headers: { ...headers } };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  return readJson(await request(path, options));
}

async function readJson(response) {
  let data = null;
  try { data = await response.json(); } catch { /* not JSON: said below */ }
  if (!response.ok) {
    const error = new Error(data?.error?.message ?? `HTTP ${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

// A placement or deletion answered 503 ("no master answered") may still be carried out; the
// same one tried again goes under the same Idempotency-Key, so it happens once. An action's
// key is kept until it is answered otherwise.
const actionKeys = new Map();

function newKey() {
  // Not crypto.randomUUID: pages served over plain http from another host lack it.
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function apiOnce(action, method, path, body) {
  const key = actionKeys.get(action) ?? newKey();
  actionKeys.set(action, key);
  try {
    const result = await api(method, path, body, { "Idempotency-Key": key });
    actionKeys.delete(action);
    return result;
  } catch (err) {
    if (err.status !== 503) actionKeys.delete(action);
    throw err;
  }
}

function message(text, kind) {
  const box = $("messages");
  const item = el("div", { class: `message ${kind}`, data: { kind } }, el("span", { text }),
    button("×", () => item.remove(), { "aria-label": "dismiss" }));
  box.prepend(item);
  while (box.children.length > MAX_MESSAGES) box.lastChild.remove();
  if (kind === "info") setTimeout(() => item.remove(), NOTE_MS);
}

const showError = (text) => message(text, "error");
const note = (text) => message(text, "info");

// --- the API key ---------------------------------------------------------------------------

function askForKey() {
  $("key-reason").textContent = apiKey === null ? "this node needs an API key"
    : "the node refused this key: enter another";
  if ($("key-form").hidden) {
    $("key-form").hidden = false;
    $("key-input").focus();
  }
}

function useKey(submit) {
  submit.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  apiKey = key;
  sessionStorage.setItem(KEY_STORAGE, key);
  $("key-input").value = "";
  $("key-form").hidden = true;
  if (feedLocked) follow();
  if (current !== null) refreshModels();
}

// --- the live feed -------------------------------------------------------------------------

let retryMs = DEFAULT_RETRY_MS;
let feedLocked = false; // refused for its key: it follows again once one is entered

// Follows /state/events, reconnecting as EventSource would: after the stream's `retry:`
// when it is lost, later after a refusal, and not at all after a 401 until a key is entered.
async function follow() {
  feedLocked = false;
  let wait = retryMs;
  try {
    const response = await request("/state/events", { headers: { Accept: "text/event-stream" }, cache: "no-store" });
    if (response.status === 401) {
      feedLocked = true;
      setConnection("locked", "API key needed");
      return;
    }
    if (!response.ok) {
      wait = RECONNECT_MS;
    } else {
      setConnection("live", "live");
      for await (const data of serverSentEvents(response, (ms) => { retryMs = ms; })) render(JSON.parse(data));
      wait = retryMs;
    }
  } catch {
    wait = retryMs; // the connection went: the node stopped, or the network
  }
  setConnection("lost", "reconnecting…");
  setTimeout(follow, wait);
}

// The `data` of each event of a text/event-stream response, as the HTML standard parses
// them: lines end in CRLF, LF or CR; comments (`: keep-alive`) skipped; `retry:` reported.
async function* serverSentEvents(response, onRetry = () => {}) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    // A CR at the end may be half of a CRLF: it waits for the next piece, with the last
    // (partial) line.
    const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
    const lines = buffer.slice(0, cut).split(/\r\n|\n|\r/);
    buffer = lines.pop() + buffer.slice(cut);
    for (const line of lines) {
      if (line === "") {
        if (data.length) yield data.join("\n");
        data = [];
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") data.push(text);
      else if (field === "retry" && /^\d+$/.test(text)) onRetry(Number(text));
    }
  }
}

function setConnection(state, text) {
  const pill = $("connection");
  pill.dataset.state = state;
  pill.textContent = text;
}

function render(event) {
  const previous = current;
  current = event;
  renderHeader(event);
  renderNodes(event);
  renderTopology(event);
  renderInstances(event);
  recordChanges(previous, event);
  refreshModelsOnChange(event);
}

function renderHeader(event) {
  const status = $("status");
  status.dataset.state = event.status;
  status.textContent = event.status;
  status.title = event.problems.join("\n");
  const session = $("session");
  session.dataset.masterId = event.session?.master_id ?? "";
  session.textContent = event.session
    ? `session ${event.session.clock} · master ${nodeLabel(event.session.master_id)}`
    : "electing a master…";
}

// --- cluster -------------------------------------------------------------------------------

function renderNodes(event) {
  const { state, session } = event;
  const ids = Object.keys(state.nodes).sort();
  update($("nodes"), [state.nodes, state.runners, state.downloads, session, event.node_id],
    () => ids.map((id) => nodeCard(state, id, id === session?.master_id, id === event.node_id)));
}

function nodeCard(state, id, isMaster, isSelf) {
  const node = state.nodes[id];
  const used = node.memory_total - node.memory_available;
  const fill = el("div", { class: "fill" });
  fill.style.width = percent(node.memory_total ? used / node.memory_total : 0);
  const swatch = el("span", { class: "swatch" });
  swatch.style.background = colour(id);
  const runners = Object.values(state.runners).filter((r) => r.node_id === id).map((runner) => {
    const instance = state.instances[runner.instance_id];
    const rank = instance?.assignments.find((a) => a.runner_id === runner.runner_id)?.shard;
    const part = rank && rank.world_size > 1 ? ` · rank ${rank.rank} of ${rank.world_size}` : "";
    const model = instance?.model.model_id ?? short(runner.instance_id);
    return el("li", { text: `${model}${part} · ${runnerText(runner.status)}` });
  });
  const downloads = Object.values(state.downloads[id] ?? {}).filter((d) => d.phase !== "done")
    .map((d) => el("li", { text: `${d.model_id}: ${downloadText(d)}` }));
  return el("div", { class: "node", data: { nodeId: id, master: String(isMaster), self: String(isSelf) } },
    el("div", { class: "node-head" }, swatch, el("strong", { text: nodeLabel(id) }),
      isMaster ? el("span", { class: "badge master", text: "master" }) : null,
      isSelf ? el("span", { class: "badge self", text: "this page's node" }) : null),
    el("div", { class: "id" }, id, ...apiAddress(node.api_url)),
    el("div", { class: "bar", title: "memory used" }, fill),
    el("div", { class: "memory", text: `${formatBytes(used)} of ${formatBytes(node.memory_total)} used` }),
    runners.length || downloads.length ? el("ul", { class: "runners" }, ...runners, ...downloads) : null);
}

// " · ADDRESS" after a node's id: a link to its own page if it is an http(s) URL.
function apiAddress(text) {
  if (text === null || text === undefined) return [];
  const url = httpUrl(text);
  const label = String(text);
  return [" · ", url ? el("a", { href: url.href, text: label, target: "_blank", rel: "noopener noreferrer" }) : label];
}

function renderTopology(event) {
  const { nodes } = event.state;
  const links = Object.fromEntries(Object.entries(nodes).map(([id, n]) => [id, [n.peers, nodeLabel(id)]]));
  update($("topology"), [links, event.session?.master_id], () => drawTopology(event));
}

function drawTopology(event) {
  const { state, session } = event;
  const ids = Object.keys(state.nodes).sort();
  const [cx, cy, rx, ry] = [210, 112, 150, 72];
  const at = new Map(ids.map((id, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / ids.length;
    return [id, ids.length === 1 ? [cx, cy] : [cx + rx * Math.cos(angle), cy + ry * Math.sin(angle)]];
  }));
  const parts = [];
  ids.forEach((a, i) => ids.slice(i + 1).forEach((b) => {
    if (!state.nodes[a].peers.includes(b) && !state.nodes[b].peers.includes(a)) return;
    const [[x1, y1], [x2, y2]] = [at.get(a), at.get(b)];
    parts.push(svg("line", { class: "link", x1, y1, x2, y2, "data-a": a, "data-b": b }));
  }));
  for (const id of ids) {
    const [x, y] = at.get(id);
    const isMaster = id === session?.master_id;
    const dot = { class: isMaster ? "dot master" : "dot", cx: x, cy: y, r: 18, fill: colour(id), "data-node-id": id };
    parts.push(svg("circle", dot));
    parts.push(svg("text", { x, y: y + 32, class: "label" }, nodeLabel(id)));
    if (isMaster) parts.push(svg("text", { x, y: y + 4, class: "crown" }, "M"));
  }
  return parts;
}

let lastMaster = null; // { id, label } of the last master seen, named when it changes

function recordChanges(previous, event) {
  const lines = [];
  if (previous === null) lines.push(`following the cluster from ${nodeLabel(event.node_id)}`);
  const [was, now] = [previous?.session, event.session];
  if (previous !== null && was && !now) lines.push(`session ${was.clock} ended: electing a master`);
  if (now && (was?.clock !== now.clock || was?.master_id !== now.master_id)) {
    const change = lastMaster && lastMaster.id !== now.master_id ? ` (was ${lastMaster.label})` : "";
    lines.push(`session ${now.clock}: master ${nodeLabel(now.master_id)}${change}`);
  }
  if (now) lastMaster = { id: now.master_id, label: nodeLabel(now.master_id) };
  if (previous !== null) {
    const [old, cur] = [previous.state, event.state];
    const added = (now, then) => Object.keys(now).filter((id) => !(id in then));
    for (const id of added(cur.nodes, old.nodes)) lines.push(`node ${nodeLabel(id)} joined`);
    for (const id of added(old.nodes, cur.nodes)) lines.push(`node ${nodeLabel(id, old)} left`);
    const instance = (id, i) => `instance ${short(id)} of ${i.model.model_id}`;
    for (const id of added(cur.instances, old.instances)) lines.push(`${instance(id, cur.instances[id])} placed`);
    for (const id of added(old.instances, cur.instances)) lines.push(`${instance(id, old.instances[id])} deleted`);
    for (const [id, r] of Object.entries(cur.runners)) {
      if (r.status.type === "RunnerFailed" && old.runners[id]?.status.type !== "RunnerFailed") {
        lines.push(`runner ${short(id)} on ${nodeLabel(r.node_id)} failed: ${r.status.cause}`);
      }
    }
  }
  const list = $("changes");
  const time = new Date().toLocaleTimeString();
  for (const line of lines) list.prepend(el("li", {}, el("time", { text: time }), ` ${line}`));
  while (list.children.length > MAX_CHANGES) list.lastChild.remove();
}

// --- instances -----------------------------------------------------------------------------

function ranked(instance) {
  return [...instance.assignments].sort((a, b) => a.shard.rank - b.shard.rank);
}

// An instance that cannot serve is as far as its least advanced runner.
const WAITING = {
  RunnerIdle: "starting", RunnerDownloading: "downloading", RunnerLoading: "loading",
  RunnerFailed: "failed", RunnerStopped: "stopped",
};

function instanceStatus(state, instance, availability) {
  const statuses = ranked(instance).map((a) => state.runners[a.runner_id]?.status ?? { type: "RunnerIdle" });
  if (availability?.serving) return statuses.some((s) => s.type === "RunnerRunning") ? "running" : "ready";
  const waiting = statuses.find((s) => s.type in WAITING);
  return waiting ? WAITING[waiting.type] : "starting";
}

function downloadText(d) {
  if (d.phase === "failed") return `download failed: ${d.error}`;
  if (d.phase === "retrying") return `retrying in ${Math.round(d.retry_in ?? 0)} s: ${d.error}`;
  const total = d.total_bytes > 0 ? ` of ${formatBytes(d.total_bytes)}` : "";
  const speed = d.bytes_per_s > 0 ? `, ${formatBytes(d.bytes_per_s)}/s` : "";
  return `${d.phase} ${d.total_bytes > 0 ? percent(d.done_bytes / d.total_bytes) : ""}${total}${speed}`;
}

function runnerText(status) {
  switch (status.type) {
    case "RunnerIdle": return "starting";
    case "RunnerDownloading": return "downloading";
    case "RunnerLoading": return `loading ${percent(status.progress)}`;
    case "RunnerReady": return "ready";
    case "RunnerRunning": return "generating";
    case "RunnerFailed": {
      const restart = status.restart_in !== null ? ` (restarting in ${status.restart_in.toFixed(1)} s)` : "";
      return `failed: ${status.cause}${restart}`;
    }
    case "RunnerStopped": return `stopped: ${status.cause}`;
    default: return status.type;
  }
}

function runnerProgress(state, assignment, instance) {
  const status = state.runners[assignment.runner_id]?.status ?? { type: "RunnerIdle" };
  if (status.type === "RunnerLoading") return status.progress;
  if (status.type !== "RunnerDownloading") return null;
  const d = state.downloads[assignment.node_id]?.[instance.model.model_id];
  return d && d.total_bytes > 0 ? d.done_bytes / d.total_bytes : 0;
}

function renderInstances(event) {
  const { state, availability } = event;
  const labels = Object.keys(state.nodes).map((id) => nodeLabel(id));
  update($("instances"), [state.instances, state.runners, state.downloads, availability, labels], () => {
    const order = (a, b) => a.model.model_id.localeCompare(b.model.model_id) || a.instance_id.localeCompare(b.instance_id);
    const instances = Object.values(state.instances).sort(order);
    if (!instances.length) return [el("p", { class: "empty", text: "No instance is placed." })];
    return instances.map((instance) => instanceCard(state, instance, availability[instance.instance_id]));
  });
}

function instanceCard(state, instance, availability) {
  const status = instanceStatus(state, instance, availability);
  const reason = availability?.reason ?? "";
  const remove = button("Delete", () => deleteInstance(instance), { class: "delete" });
  return el("div", { class: "instance", data: { instanceId: instance.instance_id, model: instance.model.model_id, status } },
    el("div", { class: "instance-head" }, el("strong", { text: instance.model.model_id }),
      el("span", { class: "id", text: short(instance.instance_id) }),
      el("span", { class: "pill", data: { state: status }, text: status }), remove),
    reason ? el("div", { class: "reason", text: reason }) : null,
    placementPicture(state, instance));
}

function placementPicture(state, instance) {
  const layers = instance.model.layout?.n_layers ?? null;
  const rows = ranked(instance).map((assignment) => {
    const { shard } = assignment;
    const whole = shard.start_layer === null || layers === null;
    const segment = el("div", { class: "segment" });
    segment.style.background = colour(assignment.node_id);
    segment.style.left = whole ? "0%" : percent(shard.start_layer / layers);
    segment.style.width = whole ? "100%" : percent((shard.end_layer - shard.start_layer) / layers);
    segment.textContent = whole ? `whole model${layers ? ` · ${layers} layers` : ""}`
      : shard.sharding === "tensor" ? `1/${shard.world_size} of every layer`
        : `layers ${shard.start_layer}–${shard.end_layer - 1}`;
    const progress = runnerProgress(state, assignment, instance);
    const track = el("div", { class: "track" }, segment);
    if (progress !== null) {
      const bar = el("div", { class: "progress" });
      bar.style.width = percent(progress);
      track.append(bar);
    }
    const status = state.runners[assignment.runner_id]?.status ?? { type: "RunnerIdle" };
    const bounds = { start: String(shard.start_layer ?? 0), end: String(shard.end_layer ?? layers ?? "") };
    const rank = shard.world_size > 1 ? `rank ${shard.rank} · ` : "";
    return el("div", { class: "rank", data: { nodeId: assignment.node_id, ...bounds } },
      el("span", { class: "who", text: `${rank}${nodeLabel(assignment.node_id)}` }),
      track, el("span", { class: "runner-status", text: runnerText(status) }));
  });
  return el("div", { class: "placement", title: "which node holds which layers" }, ...rows);
}

async function deleteInstance(instance) {
  try {
    const path = `/instances/${encodeURIComponent(instance.instance_id)}`;
    await apiOnce(`DELETE ${path}`, "DELETE", path);
    note(`deleted instance ${short(instance.instance_id)} of ${instance.model.model_id}`);
  } catch (err) {
    showError(`deleting instance ${short(instance.instance_id)}: ${err.message}`);
  }
}

// --- the catalog and placing ---------------------------------------------------------------

let modelsKey = null;
let modelsLoading = false;
let modelsAgain = false;

function refreshModelsOnChange(event) {
  // /v1/models changes with placements, readiness and finished downloads: ask again then.
  const s = event.state;
  const key = JSON.stringify([
    Object.entries(event.availability).map(([id, a]) => [id, a.serving]).sort(),
    Object.entries(s.downloads).map(([n, d]) => [n, Object.values(d).map((p) => [p.model_id, p.phase])]).sort(),
  ]);
  if (key !== modelsKey) {
    modelsKey = key;
    refreshModels();
  }
}

async function refreshModels() {
  if (modelsLoading) { modelsAgain = true; return; }
  modelsLoading = true;
  try {
    do {
      modelsAgain = false;
      models = (await api("GET", "/v1/models")).data;
      renderCatalog();
      renderChatModels();
    } while (modelsAgain);
  } catch (err) {
    showError(`listing models: ${err.message}`);
  } finally {
    modelsLoading = false;
  }
}

function renderCatalog() {
  update($("catalog").tBodies[0], models, () => models.map((m) => el("tr", { data: { model: m.id } },
    el("td", { text: m.id }),
    el("td", { text: m.size_bytes ? formatBytes(m.size_bytes) : "?" }),
    el("td", { text: m.downloaded ? "downloaded" : "" }),
    el("td", { text: m.ready ? "ready" : m.placed ? "placed" : "" }),
    el("td", {}, button("Place…", () => showPreviews(m.id), { class: "place" })))));
}

async function showPreviews(modelId) {
  try {
    const result = await api("GET", `/instances/previews?model=${encodeURIComponent(modelId)}`);
    const auto = button("Let the master choose", () => place({ model: result.model }),
      { class: "preview", data: { sharding: "auto", nodeIds: "" } });
    $("preview-model").textContent = result.model;
    $("preview-list").replaceChildren(el("li", {}, auto), ...result.previews.map((p) => previewItem(result.model, p)));
    $("previews").hidden = false;
  } catch (err) {
    showError(`placements of ${modelId}: ${err.message}`);
  }
}

function previewItem(model, preview) {
  const nodes = preview.node_ids.map((id) => nodeLabel(id)).join(", ");
  const what = preview.sharding === "whole" ? `whole on ${nodes}` : `${preview.sharding} over ${nodes}`;
  const ranks = preview.ranks.map((r) => {
    const layers = r.start_layer === null ? "" : `layers ${r.start_layer}–${r.end_layer - 1} on ${nodeLabel(r.node_id)}: `;
    return `${layers}${formatBytes(r.memory_needed)} of ${formatBytes(r.memory_free)} free`;
  }).join("; ");
  // "whole" is what POST /instances does with one node; the splits name their sharding.
  const split = preview.sharding === "whole" ? {} : { sharding: preview.sharding };
  const body = { model, ...split, node_ids: preview.node_ids };
  const choice = button(what, () => place(body),
    { class: "preview", data: { sharding: preview.sharding, nodeIds: preview.node_ids.join(",") } });
  choice.disabled = !preview.feasible;
  return el("li", { class: preview.feasible ? "feasible" : "infeasible" }, choice, " ",
    el("span", { class: "detail", text: preview.feasible ? ranks : preview.error }));
}

async function place(body) {
  try {
    const placed = await apiOnce(`POST ${JSON.stringify(body)}`, "POST", "/instances", body);
    note(`placed instance ${short(placed.instance_id)} of ${body.model}`);
    $("previews").hidden = true;
  } catch (err) {
    showError(`placing ${body.model}: ${err.message}`);
  }
}

// --- chat ----------------------------------------------------------------------------------

function renderChatModels() {
  const select = $("chat-model");
  const chosen = select.value;
  const ready = models.filter((m) => m.ready).map((m) => m.id);
  update(select, ready, () => (ready.length ? ready.map((id) => el("option", { value: id, text: id }))
    : [el("option", { value: "", text: "no model is ready" })]));
  if (ready.includes(chosen)) select.value = chosen;
}

function setChatStatus(state, text) {
  const status = $("chat-status");
  status.dataset.state = state;
  status.textContent = text;
}

async function send(submit) {
  submit.preventDefault();
  const text = $("chat-input").value.trim();
  const model = $("chat-model").value;
  if (!text || chat !== null) return;
  if (!model) { showError("no model is ready to chat with: place one first"); return; }
  conversation.push({ role: "user", content: text });
  $("chat-input").value = "";
  $("chat-log").append(el("div", { class: "turn user", text }));
  const answer = el("div", { class: "turn assistant", data: { streaming: "true" } });
  $("chat-log").append(answer);
  chat = { controller: new AbortController(), requestId: null, stopped: false };
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  setChatStatus("streaming", "streaming…");
  try {
    const finish = await stream(model, answer);
    conversation.push({ role: "assistant", content: answer.textContent });
    setChatStatus(chat.stopped ? "stopped" : "done", chat.stopped ? "stopped" : `done (${finish ?? "no finish reason"})`);
  } catch (err) {
    if (chat.stopped && err.name === "AbortError") setChatStatus("stopped", "stopped");
    else { setChatStatus("failed", "failed"); showError(`chat: ${err.message}`); }
  } finally {
    answer.dataset.streaming = "false";
    chat = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

// Streams the answer into `answer`; returns its finish reason.
async function stream(model, answer) {
  const body = { model, messages: conversation, stream: true, max_tokens: Number($("chat-max-tokens").value) || undefined };
  const response = await request("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    signal: chat.controller.signal,
  });
  if (!response.ok) await readJson(response); // throws the API's message
  let finish = null;
  for await (const data of serverSentEvents(response)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message);
    chat.requestId = chunk.id;
    for (const choice of chunk.choices) {
      if (choice.delta?.content) {
        answer.textContent += choice.delta.content;
        $("chat-log").scrollTop = $("chat-log").scrollHeight;
      }
      finish = choice.finish_reason ?? finish;
    }
  }
  return finish;
}

async function stop() {
  if (chat === null) return;
  chat.stopped = true;
  $("chat-stop").disabled = true;
  const running = chat;
  if (running.requestId !== null) {
    // The runner stops at its next step and the stream ends with a finish reason.
    try { await api("POST", `/v1/cancel/${encodeURIComponent(running.requestId)}`); return; }
    catch { /* not in flight any more: disconnecting ends it all the same */ }
  }
  running.controller.abort(); // the server cancels a generation whose client left
}

function clearChat() {
  if (chat !== null) return;
  conversation.length = 0;
  $("chat-log").replaceChildren();
  setChatStatus("", "");
}

// --- start ---------------------------------------------------------------------------------

$("key-form").addEventListener("submit", useKey);
$("chat-form").addEventListener("submit", send);
$("chat-stop").addEventListener("click", stop);
$("chat-clear").addEventListener("click", clearChat);
$("preview-close").addEventListener("click", () => { $("previews").hidden = true; });
follow();
