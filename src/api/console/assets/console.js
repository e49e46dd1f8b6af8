// agentd web console. Data is only ever written with textContent: never innerHTML.
"use strict";

function csrf() {
  const m = document.querySelector('meta[name="csrf"]');
  return m ? m.getAttribute("content") : "";
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// The overview: rebuilt from each server-sent event (no polling).
function liveOverview() {
  const root = document.getElementById("live");
  if (!root || !window.EventSource) return;
  const state = document.getElementById("live-state");
  const src = new EventSource("/console/events");
  src.addEventListener("overview", (ev) => {
    const cards = JSON.parse(ev.data);
    const frag = document.createDocumentFragment();
    for (const c of cards) {
      const sec = el("section", "card");
      sec.appendChild(el("h2", "", c.title));
      const dl = el("dl");
      for (const r of c.rows) {
        dl.appendChild(el("dt", "", r[0]));
        dl.appendChild(el("dd", r[2] || "", r[1]));
      }
      sec.appendChild(dl);
      frag.appendChild(sec);
    }
    root.replaceChildren(frag);
    if (state) state.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
  });
  src.onerror = () => {
    if (state) state.textContent = "Live updates interrupted; reconnecting…";
  };
}

// The search box of a conversation: hides the turns that do not contain the words.
function conversationSearch() {
  const box = document.getElementById("find");
  if (!box) return;
  const count = document.getElementById("find-count");
  box.addEventListener("input", () => {
    const q = box.value.trim().toLowerCase();
    let shown = 0;
    for (const t of document.querySelectorAll(box.dataset.filter)) {
      const hit = !q || t.textContent.toLowerCase().includes(q);
      t.hidden = !hit;
      if (hit && q) {
        shown++;
        for (const d of t.querySelectorAll("details")) {
          if (d.textContent.toLowerCase().includes(q)) d.open = true;
        }
      }
    }
    count.textContent = q ? shown + " matching" : "";
  });
}

// Server-sent events read from a POST's streamed body.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length || name !== "message") onEvent(name, data.join("\n"));
    }
  }
}

// The chat: the answer appears as the model writes it.
function chat() {
  const form = document.getElementById("chat");
  if (!form) return;
  const log = document.getElementById("chat-log");
  const text = document.getElementById("chat-text");
  const button = form.querySelector("button");
  text.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) form.requestSubmit();
  });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const body = new URLSearchParams(new FormData(form));
    const mine = el("div", "msg user");
    mine.appendChild(el("strong", "", "You"));
    mine.appendChild(el("p", "text", text.value));
    log.appendChild(mine);
    const theirs = el("div", "msg assistant");
    theirs.appendChild(el("strong", "", "Agent"));
    const answer = el("p", "text streaming", "");
    answer.id = "chat-answer-" + log.children.length;
    theirs.appendChild(answer);
    log.appendChild(theirs);
    text.value = "";
    button.disabled = true;
    try {
      const r = await fetch("/console/chat", {
        method: "POST",
        headers: { "X-CSRF-Token": csrf(), "Content-Type": "application/x-www-form-urlencoded" },
        body,
        credentials: "same-origin",
      });
      if (!r.ok) {
        answer.textContent = "Refused (" + r.status + "). Log in again?";
        answer.className = "text bad";
      } else {
        await readEvents(r, (name, data) => {
          if (name === "delta") {
            answer.textContent += data;
            answer.dataset.deltas = String(Number(answer.dataset.deltas || 0) + 1);
          }
          else if (name === "tools") answer.textContent += " …";
          else if (name === "done") { answer.textContent = data; answer.className = "text done"; }
          else if (name === "failed") { answer.textContent = "Failed: " + data; answer.className = "text bad"; }
        });
      }
    } catch (e) {
      answer.textContent = "Connection lost: " + e;
      answer.className = "text bad";
    }
    button.disabled = false;
    text.focus();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  liveOverview();
  conversationSearch();
  chat();
});
