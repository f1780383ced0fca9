// runner's chat page: conversations in localStorage, streamed replies from /v1/chat/completions.
"use strict";

const STORE_KEY = "runner.conversations";
const CURRENT_KEY = "runner.current";
const API_KEY = "runner.apiKey";
const DEFAULTS = { system: "", temperature: 0.8, top_p: 0.95, max_tokens: 512, seed: "", model: "" };

const $ = (id) => document.getElementById(id);
const state = { conversations: [], currentId: null, controller: null, streamingId: null, pending: [], notice: "",
                storageNotice: "", inputs: {} };
// an unsent message is stored cut to this many characters once all does not fit (refused ones can be megabytes)
const UNSENT_KEPT_CHARS = 200;

// -- storage -----------------------------------------------------------------------------------
function stored() {
  try { return JSON.parse(localStorage.getItem(STORE_KEY) || "[]"); } catch { return []; }
}
function load() {
  state.conversations = stored().map(settled);
  state.currentId = localStorage.getItem(CURRENT_KEY);
  if (!current()) newConversation();
}
// a reply the page was closed during is stored empty: it is said so, and its question is not sent again
function settled(convo) {
  convo.messages.forEach((m, i) => {
    if (m.role !== "assistant" || m.content || m.error || m.stats || m.images?.length) return;
    convo.messages[i] = { role: "assistant", error: true,
                          content: "Error: the page was closed before this reply ended" };
    if (convo.messages[i - 1]?.role === "user") convo.messages[i - 1].unsent = true;
  });
  return convo;
}
// another tab saved: take its conversations, keeping the one this tab is streaming into as it is
function merge(theirs) {
  const streaming = state.controller ? state.streamingId : null;
  const mine = state.conversations.find((c) => c.id === streaming);
  state.conversations = theirs.map((c) => (c.id === streaming ? mine : c));
  if (mine && !theirs.some((c) => c.id === streaming)) state.conversations.unshift(mine);
  if (!current()) state.currentId = state.conversations[0]?.id || null;
  if (!current()) newConversation();
}
function save() {
  const lost = storeConversations();
  setStorageNotice(lost && `The browser's storage is full: a reload will lose ${lost} (Export keeps everything)`);
  try { localStorage.setItem(CURRENT_KEY, state.currentId || ""); } catch { /* full: a reload opens the first one */ }
}
// stores the leanest-needed form of the conversations; says what the stored copy lacks ("" when nothing)
function storeConversations() {
  for (const [lost, convos] of storable(state.conversations)) {
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify(convos));
      return lost;
    } catch { /* over the browser's quota: try a leaner form */ }
  }
  return "the changes since the last save";
}
// The conversations as they are, then ever leaner, least missed first: unsent messages (refused ones are
// often huge, and are never sent again), then images, then the oldest conversations (never the open one).
// Only the stored copy loses them: the page keeps showing them until a reload.
function* storable(convos) {
  const lost = [];
  yield ["", convos];
  if (convos.some((c) => c.messages.some(isBulkyUnsent))) {
    convos = convos.map((c) => ({ ...c, messages: c.messages.map(cutUnsent) }));
    lost.push("the full text of unsent messages");
    yield [listed(lost), convos];
  }
  if (convos.some((c) => c.messages.some((m) => m.images?.length))) {
    convos = convos.map((c) => ({ ...c, messages: c.messages.map(({ images, ...m }) => m) }));
    lost.push("images");
    yield [listed(lost), convos];
  }
  const kept = [...convos];
  for (let i = kept.length - 1; i >= 0; i--) {  // newest first: the oldest are at the end
    if (kept[i].id === state.currentId) continue;
    kept.splice(i, 1);
    const n = convos.length - kept.length;
    yield [listed([...lost, n === 1 ? "the oldest conversation" : `the ${n} oldest conversations`]), [...kept]];
  }
}
function isBulkyUnsent(msg) {
  return Boolean(msg.unsent && (msg.images?.length || msg.content.length > UNSENT_KEPT_CHARS));
}
function cutUnsent(msg) {
  if (!isBulkyUnsent(msg)) return msg;
  const { images, ...text } = msg;
  if (text.content.length <= UNSENT_KEPT_CHARS) return text;
  return { ...text, content: text.content.slice(0, UNSENT_KEPT_CHARS) + "…" };
}
function listed(parts) { return parts.length > 1 ? parts.slice(0, -1).join(", ") + " and " + parts.at(-1) : parts[0]; }
function setStorageNotice(text) {
  if (text === state.storageNotice) return;
  state.storageNotice = text;
  renderAttachments();
}
function current() { return state.conversations.find((c) => c.id === state.currentId); }
function newConversation() {
  const convo = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat",
                  messages: [], settings: { ...DEFAULTS, model: document.body.dataset.model } };
  state.conversations.unshift(convo);
  state.currentId = convo.id;
  save();
  return convo;
}

// -- rendering ---------------------------------------------------------------------------------
function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const convo of state.conversations) {
    const li = document.createElement("li");
    li.className = convo.id === state.currentId ? "active" : "";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = convo.title;
    name.addEventListener("click", () => { state.currentId = convo.id; save(); renderAll(); });
    const del = document.createElement("button");
    del.className = "delete";
    del.title = "Delete";
    del.textContent = "×";
    del.addEventListener("click", () => {
      state.conversations = state.conversations.filter((c) => c.id !== convo.id);
      if (state.currentId === convo.id) state.currentId = state.conversations[0]?.id || null;
      if (!current()) newConversation();
      save();
      renderAll();
    });
    li.append(name, del);
    list.appendChild(li);
  }
}

function renderMessageBody(body, msg) {
  body.replaceChildren();
  if (msg.role === "assistant" && $("mark-drafts").checked && msg.pieces) {
    body.classList.add("plain");
    for (const [text, drafted] of msg.pieces) {
      const span = document.createElement("span");
      if (drafted) span.className = "drafted";
      span.textContent = text;
      body.appendChild(span);
    }
  } else {
    body.classList.remove("plain");
    body.appendChild(Markdown.render(msg.content));
  }
}

function messageElement(msg) {
  const el = document.createElement("div");
  el.className = "message " + msg.role + (msg.error ? " error" : "") + (msg.unsent ? " unsent" : "");
  if (msg.unsent) el.title = "not sent with later messages: it got no reply";
  if (msg.images?.length) el.appendChild(thumbnails(msg.images, "images"));
  const body = document.createElement("div");
  body.className = "body";
  renderMessageBody(body, msg);
  el.appendChild(body);
  if (msg.stats) {
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.textContent = msg.stats;
    el.appendChild(stats);
  }
  return el;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...current().messages.map(messageElement));
  box.scrollTop = box.scrollHeight;
}

function renderSettings() {
  const s = current().settings;
  for (const key of ["system", "temperature", "top_p", "max_tokens", "seed"]) $(key).value = s[key] ?? "";
  $("title").value = current().title;
  if (s.model) $("model").value = s.model;
}

function thumbnails(images, className, onRemove) {
  const box = document.createElement("div");
  box.className = className;
  images.forEach((url, i) => {
    const thumb = document.createElement("span");
    thumb.className = "thumb";
    const img = document.createElement("img");
    img.src = url;  // a data: URI (the page's CSP allows those for images)
    img.alt = "image " + (i + 1);
    thumb.appendChild(img);
    if (onRemove) {
      const remove = document.createElement("button");
      remove.type = "button";
      remove.title = "Remove";
      remove.textContent = "×";
      remove.addEventListener("click", () => onRemove(i));
      thumb.appendChild(remove);
    }
    box.appendChild(thumb);
  });
  return box;
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  if (state.pending.length) {
    box.appendChild(thumbnails(state.pending, "pending", (i) => { state.pending.splice(i, 1); renderAttachments(); }));
  }
  const notices = [state.notice, state.storageNotice].filter(Boolean);
  for (const text of notices) {
    const notice = document.createElement("span");
    notice.className = "notice";
    notice.textContent = text;
    box.appendChild(notice);
  }
  box.hidden = !state.pending.length && !notices.length;
}

function renderAll() { renderList(); renderSettings(); renderMessages(); renderAttachments(); }

// -- images ------------------------------------------------------------------------------------
function selectedModel() { return current().settings.model || document.body.dataset.model; }

function takesImages() {
  const inputs = state.inputs[selectedModel()];
  return !inputs || inputs.includes("image");  // (not listed yet: the server says, with a 400, if not)
}

async function attachFiles(files) {
  const images = [...files].filter((f) => f.type.startsWith("image/"));
  const skipped = images.length < files.length ? "only images can be attached here" : "";  // (say why, not nothing)
  if (!images.length) {
    state.notice = skipped;
    renderAttachments();
    return;
  }
  if (!takesImages()) {
    state.notice = `${selectedModel()} takes no images: choose a vision model, or start it with --mmproj`;
    renderAttachments();
    return;
  }
  state.notice = skipped;
  for (const file of images) {
    state.pending.push(await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    }));
  }
  renderAttachments();
}

// -- the API -----------------------------------------------------------------------------------
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(API_KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function askForKey() {
  const key = window.prompt("This server needs an API key:");
  if (key) localStorage.setItem(API_KEY, key.trim());
  return Boolean(key);
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status}: ${body.error?.message || JSON.stringify(body)}`;
  } catch { return `${resp.status} ${resp.statusText}`; }
}

function requestBody(convo) {
  const s = convo.settings;
  const messages = [];
  if (s.system) messages.push({ role: "system", content: s.system });
  for (const m of convo.messages) {
    if (m.error || m.unsent || (!m.content && !m.images?.length)) continue;
    const content = m.images?.length  // OpenAI's parts: the text, then each image as a data URI
      ? [{ type: "text", text: m.content }, ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))]
      : m.content;
    messages.push({ role: m.role, content });
  }
  const body = { model: s.model || document.body.dataset.model, messages, stream: true,
                 stream_options: { include_usage: true } };
  for (const key of ["temperature", "top_p"]) if (s[key] !== "" && s[key] !== null) body[key] = Number(s[key]);
  if (s.max_tokens) body.max_tokens = Number(s.max_tokens);
  if (s.seed !== "" && s.seed !== null && s.seed !== undefined) body.seed = Number(s.seed);
  return body;
}

async function send(text) {
  const convo = current();
  if (convo.messages.length === 0) convo.title = text.slice(0, 40) || "Image";
  const images = state.pending.splice(0);
  const question = images.length ? { role: "user", content: text, images } : { role: "user", content: text };
  convo.messages.push(question);
  state.streamingId = convo.id;
  state.notice = "";
  const reply = { role: "assistant", content: "", pieces: [] };
  convo.messages.push(reply);
  save();
  renderAll();
  const bubble = $("messages").lastElementChild;
  const body = bubble.querySelector(".body");
  state.controller = new AbortController();
  setBusy(true);
  const sent = performance.now();
  let firstAt = null, usage = null, nDrafted = 0, nTokens = 0, stopped = false, failed = null;
  try {
    let resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
                                                     body: JSON.stringify(requestBody(convo)), signal: state.controller.signal });
    if (resp.status === 401 && askForKey()) {
      resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
                                                   body: JSON.stringify(requestBody(convo)), signal: state.controller.signal });
    }
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices?.[0];
        const piece = choice?.delta?.content;
        if (piece) {
          if (firstAt === null) firstAt = performance.now();
          const drafted = Boolean(choice.drafted && choice.drafted.every(Boolean));
          nTokens += choice.drafted ? choice.drafted.length : 1;
          nDrafted += choice.drafted ? choice.drafted.filter(Boolean).length : 0;
          reply.content += piece;
          const last = reply.pieces[reply.pieces.length - 1];
          if (last && last[1] === drafted) last[0] += piece; else reply.pieces.push([piece, drafted]);
          renderMessageBody(body, reply);
          $("messages").scrollTop = $("messages").scrollHeight;
        }
      }
    }
  } catch (err) {
    if (err.name === "AbortError") stopped = true;
    else failed = err instanceof TypeError ? "The server is unreachable (is `runner serve` running?)" : err.message;
  }
  const end = performance.now();
  // a question that got no text back (refused, failed, stopped before the first token or while its model
  // loaded) is shown but not sent again: with its empty reply skipped, two user turns in a row would
  // follow, and templates that need alternating roles (Gemma's) refuse every later message
  if (!reply.content) question.unsent = true;
  if (failed) {
    if (!reply.content) convo.messages.pop();  // the error takes the empty reply's place
    convo.messages.push({ role: "assistant", content: "Error: " + failed, error: true });
  } else {
    const n = usage ? usage.completion_tokens : nTokens;
    // decode speed after the first token (the first one's wait is the TTFT)
    const rate = firstAt !== null && end > firstAt && n > 1 ? ((n - 1) / ((end - firstAt) / 1000)).toFixed(1) : "n/a";
    const ttft = firstAt !== null ? Math.round(firstAt - sent) + " ms" : "n/a";
    let stats = `${n} tokens · ${rate} tok/s · first token ${ttft}`;
    const proposed = usage?.draft_tokens_proposed || 0;
    if (proposed) {
      const accepted = usage.draft_tokens_accepted;
      const own = Math.max(1, n - nDrafted);
      stats += ` · drafts accepted ${Math.round((100 * accepted) / proposed)}% · mean accepted length ${(nDrafted / own).toFixed(2)}`;
    }
    if (stopped) stats += " · stopped";
    reply.stats = stats;
  }
  state.controller = null;
  setBusy(false);
  save();
  renderMessages();
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("input").disabled = busy;
}

// -- server panel ------------------------------------------------------------------------------
async function pollServer() {
  try {
    const [slotsResp, metricsResp] = await Promise.all([fetch("/slots", { headers: headers() }),
                                                        fetch("/metrics", { headers: headers() })]);
    if (!slotsResp.ok) throw new Error(await errorText(slotsResp));
    const slots = await slotsResp.json();
    const metrics = metricsResp.ok ? await metricsResp.text() : "";
    const depths = [...metrics.matchAll(/^runner_queue_depth(?:\{[^}]*\})? (\d+)/gm)];  // one per loaded model
    const queue = depths.length ? depths.reduce((n, m) => n + Number(m[1]), 0) : "?";
    const busy = slots.filter((s) => s.state !== "idle").length;
    $("server-status").textContent = `slots busy ${busy}/${slots.length} · queue ${queue}`;
    $("slot-bar").replaceChildren(...slots.map((s) => {
      const cell = document.createElement("span");
      cell.className = "slot " + s.state;
      cell.title = `${s.model ? s.model + " " : ""}slot ${s.id}: ${s.state}, ${s.n_cached} tokens cached`;
      return cell;
    }));
  } catch (err) {
    $("server-status").textContent = err instanceof TypeError ? "server unreachable" : err.message;
  }
}

async function loadModels() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) return;
    const data = await resp.json();
    // a server of several models says which are loaded; the others load when a message needs them
    const label = (m) => m.id + (m.status && m.status.value !== "loaded" ? ` (${m.status.value})` : "");
    for (const m of data.data) state.inputs[m.id] = m.inputs || ["text"];
    const picker = $("model");
    const same = picker.options.length === data.data.length
      && data.data.every((m, i) => picker.options[i].value === m.id);
    if (same) {  // only the states changed: relabel in place (an open list stays open)
      data.data.forEach((m, i) => { picker.options[i].textContent = label(m); });
      return;
    }
    picker.replaceChildren(...data.data.map((m) => {
      const opt = document.createElement("option");
      opt.value = m.id;
      opt.textContent = label(m);
      return opt;
    }));
    renderSettings();
  } catch { /* the status panel reports an unreachable server */ }
}

// -- wiring ------------------------------------------------------------------------------------
function bind() {
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("input").value.trim();
    if ((!text && !state.pending.length) || state.controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.isComposing || ev.keyCode === 229) return;  // an input method's Enter picks its candidate
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("attach").addEventListener("change", async () => { await attachFiles($("attach").files); $("attach").value = ""; });
  $("input").addEventListener("paste", (ev) => {
    if ([...ev.clipboardData.files].some((f) => f.type.startsWith("image/"))) {
      ev.preventDefault();
      attachFiles(ev.clipboardData.files);
    }
  });
  const main = document.querySelector("main");
  main.addEventListener("dragover", (ev) => { ev.preventDefault(); main.classList.add("dragging"); });
  main.addEventListener("dragleave", () => main.classList.remove("dragging"));
  main.addEventListener("drop", (ev) => {
    ev.preventDefault();
    main.classList.remove("dragging");
    attachFiles(ev.dataTransfer.files);
  });
  $("new-chat").addEventListener("click", () => { newConversation(); renderAll(); });
  $("title").addEventListener("change", () => { current().title = $("title").value || "Untitled"; save(); renderList(); });
  $("settings-toggle").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  $("mark-drafts").addEventListener("change", renderMessages);
  for (const key of ["system", "temperature", "top_p", "max_tokens", "seed"]) {
    $(key).addEventListener("change", () => { current().settings[key] = $(key).value; save(); });
  }
  $("model").addEventListener("change", () => { current().settings.model = $("model").value; save(); });
  $("export").addEventListener("click", () => {
    const blob = new Blob([JSON.stringify(state.conversations, null, 1)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "runner-conversations.json";
    a.click();
  });
  $("import").addEventListener("change", async () => {
    const file = $("import").files[0];
    if (!file) return;
    try {
      const items = JSON.parse(await file.text());
      if (!Array.isArray(items)) throw new Error("expected a list of conversations");
      for (const c of items) {
        if (!c || !Array.isArray(c.messages)) continue;
        state.conversations.unshift({ id: String(Date.now()) + Math.random().toString(16).slice(2, 6),
                                      title: String(c.title || "Imported"), settings: { ...DEFAULTS, ...(c.settings || {}) },
                                      messages: c.messages.map((m) => ({ role: m.role === "user" ? "user" : "assistant",
                                                                         content: String(m.content ?? ""), stats: m.stats })) });
      }
      state.currentId = state.conversations[0].id;
      save();
      renderAll();
    } catch (err) { window.alert("Import failed: " + err.message); }
    $("import").value = "";
  });
}

load();
bind();
window.addEventListener("storage", (ev) => {  // another tab of this page saved
  if (ev.key !== STORE_KEY) return;
  merge(stored());
  if (state.controller) renderList(); else renderAll();  // (a reply streaming here keeps its bubble)
});
if (document.body.dataset.needsKey === "yes" && !localStorage.getItem(API_KEY)) askForKey();
renderAll();
loadModels();
pollServer();
setInterval(pollServer, 1000);
setInterval(loadModels, 2000);
