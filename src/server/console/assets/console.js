// warden console: plain JavaScript, no build step, no dependency. Served by `warden serve` from the
// binary. Talks to the same /api/* routes as the CLI, authenticated by the session cookie; every
// call carries X-CSRF-Token: the token the server wrote into this page (body[data-csrf]), never a
// cookie — a page on another port of this host can overwrite cookies (they do not isolate ports),
// and the token is also what tells the server which of several session cookies is ours.
//
// Scale: the agents live in a Map; the event stream (SSE) applies deltas to it and marks it dirty;
// the table (one page of rows) is re-rendered at most once per animation frame.
"use strict";

(function () {
  const body = document.body;
  body.classList.add("js");
  const ROLE = body.dataset.role;
  const ADMIN = ROLE === "admin";
  const $ = (id) => document.getElementById(id);

  // Figures the browser tests read (and an operator can, in the devtools console).
  const perf = (window.wardenPerf = {
    firstPaint: null, // ms since navigation start when the table first showed the agents
    renders: 0,
    haltClicked: null, // performance.now() at the HALT ALL confirmation
    haltOnScreen: null, // performance.now() when every row showed STOPPED after it
    sseLagMs: [], // for state changes: on screen (Date.now()) minus the journal's at_ms
  });

  const CSRF = body.dataset.csrf;

  // ---- HTTP ---------------------------------------------------------------------------------
  async function api(method, path, payload) {
    const headers = { Accept: "application/json" };
    const init = { method, headers, credentials: "same-origin" };
    headers["X-CSRF-Token"] = CSRF;
    if (payload !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    const res = await fetch(path, init);
    if (res.status === 401) {
      location.href = "/console/login?expired";
      throw new Error("session ended");
    }
    let data = null;
    try {
      data = await res.json();
    } catch (_) {
      data = null;
    }
    return { status: res.status, ok: res.ok, data };
  }

  function flash(text) {
    $("flash").textContent = text;
  }

  function failed(what, r) {
    const msg = r.data && r.data.error ? r.data.error : "HTTP " + r.status;
    flash("✖ " + what + ": " + msg);
  }

  // ---- the agents ---------------------------------------------------------------------------
  const agents = new Map(); // key -> row model
  let sortedKeys = null; // cache of keys sorted by key (invalidated when the set changes)
  let dirty = false;
  let frameAsked = false;
  let pendingLags = [];
  const view = { page: 0, size: 100, sort: "key", desc: false, text: "", state: "", problems: false };

  function model(status) {
    const q = status.queued || {};
    return {
      key: status.key,
      role: status.role,
      parent: status.parent || "",
      state: status.state,
      emergency: !!status.emergency_stop,
      lockout: status.lockout || null,
      stoppedBy: status.stopped_by || null,
      errors: status.consecutive_errors || 0,
      maxErrors: status.max_consecutive_errors || 0,
      queue: (q.system_halt || 0) + (q.control || 0) + (q.supervision || 0) + (q.ordinary || 0),
      turns: status.turns || 0,
      tokens: status.tokens_used || 0,
      cost: status.cost_used || 0,
      paused: !!status.paused,
      npc: status.npc || null,
      node: status.node || "",
      last: 0,
    };
  }

  // ---- the cluster (warden serve --cluster): GET /api/cluster, or false when not a cluster ----
  let cluster = null;

  /** Whether `a` runs on another node of the cluster (only its halt can be asked from here). */
  function remote(a) {
    return !!cluster && !!a.node && a.node !== cluster.node;
  }

  async function loadCluster() {
    if (cluster === false) return;
    const r = await api("GET", "/api/cluster");
    if (r.status === 404) {
      cluster = false;
      return;
    }
    if (!r.ok || !r.data) return;
    const first = cluster === null;
    cluster = r.data;
    $("g-cluster-box").hidden = false;
    const nodes = cluster.nodes ? cluster.nodes.length + " nodes" : "nodes unknown";
    const halt = cluster.halt && cluster.halt.halted
      ? " · ■ cluster halted (epoch " + cluster.halt.epoch + ", by " + cluster.halt.by + " on " + cluster.halt.node + ")"
      : "";
    $("g-cluster").textContent = "node " + cluster.node + " · " + nodes + halt;
    const banner = $("cluster-banner");
    if (cluster.fail_safe) {
      banner.hidden = false;
      banner.textContent = "⚠ Node " + cluster.node + ": " + cluster.fail_safe;
    } else {
      banner.hidden = true;
    }
    if (first) markDirty();
  }

  function upsert(status) {
    const prev = agents.get(status.key);
    const m = model(status);
    if (prev) m.last = prev.last;
    // A status from an agent route may come without its node (kept from the fleet listing).
    if (prev && !m.node) m.node = prev.node;
    else sortedKeys = null;
    agents.set(status.key, m);
  }

  function touch(key) {
    let a = agents.get(key);
    if (!a) {
      a = model({ key, state: "WAITING_FOR_EVENT" });
      agents.set(key, a);
      sortedKeys = null;
    }
    return a;
  }

  function markDirty() {
    dirty = true;
    if (!frameAsked) {
      frameAsked = true;
      requestAnimationFrame(frame);
    }
  }

  function frame() {
    frameAsked = false;
    if (!dirty) return;
    dirty = false;
    renderHeaderState();
    if (current.view === "agents") renderTable();
    const now = Date.now();
    for (const at of pendingLags) perf.sseLagMs.push(now - at);
    if (perf.sseLagMs.length > 1000) perf.sseLagMs.splice(0, perf.sseLagMs.length - 1000);
    pendingLags = [];
    if (perf.haltClicked !== null && perf.haltOnScreen === null && agents.size > 0) {
      let all = true;
      for (const a of agents.values()) if (a.state !== "STOPPED") { all = false; break; }
      if (all) perf.haltOnScreen = performance.now();
    }
  }

  function matches(a) {
    if (view.state && a.state !== view.state) return false;
    if (view.problems && !(a.emergency || a.errors > 0)) return false;
    if (view.text) {
      const t = view.text;
      if (a.key.toLowerCase().indexOf(t) < 0 && a.parent.toLowerCase().indexOf(t) < 0) return false;
    }
    return true;
  }

  const sorters = {
    state: (a) => a.state,
    errors: (a) => a.errors,
    queue: (a) => a.queue,
    turns: (a) => a.turns,
    tokens: (a) => a.tokens,
    last: (a) => a.last,
  };

  function visibleKeys() {
    if (!sortedKeys) sortedKeys = Array.from(agents.keys()).sort();
    let keys = sortedKeys.filter((k) => matches(agents.get(k)));
    const by = sorters[view.sort];
    if (by) {
      keys = keys.slice().sort((x, y) => {
        const a = by(agents.get(x));
        const b = by(agents.get(y));
        return a < b ? -1 : a > b ? 1 : x < y ? -1 : 1;
      });
    }
    if (view.desc) keys.reverse();
    return keys;
  }

  function time(ms) {
    return ms ? new Date(ms).toLocaleTimeString() : "—";
  }

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function stateBadge(state, paused) {
    const s = el("span", { class: "state s-" + state }, state + (paused ? " (paused)" : ""));
    return s;
  }

  function actionButton(action, key, label, enabled, title) {
    const b = el("button", { type: "button", "data-action": action, "data-key": key }, label);
    b.setAttribute("aria-label", label + " " + key);
    if (!enabled || !ADMIN) {
      b.disabled = true;
      b.title = ADMIN ? title || "" : "read-only session";
    }
    return b;
  }

  function actions(a) {
    const box = el("div", { class: "actions" });
    if (remote(a)) {
      // Another node's agent: its halt is sent to that node; the rest is done on its own console.
      const elsewhere = "runs on node " + a.node + ": use its console";
      box.append(
        actionButton("halt", a.key, "Halt", a.state !== "STOPPED" && a.state !== "SAFETY_LOCKOUT", "already stopped"),
        actionButton("resume", a.key, "Resume", false, elsewhere),
        actionButton("unlock", a.key, "Unlock…", false, elsewhere)
      );
      return box;
    }
    box.append(
      actionButton("halt", a.key, "Halt", a.state !== "STOPPED" && a.state !== "SAFETY_LOCKOUT", "already stopped"),
      a.paused || a.state === "STOPPED"
        ? actionButton("resume", a.key, "Resume", a.state !== "SAFETY_LOCKOUT")
        : actionButton("pause", a.key, "Pause", a.state !== "SAFETY_LOCKOUT"),
      actionButton("unlock", a.key, "Unlock…", a.emergency, "not locked out")
    );
    return box;
  }

  function renderTable() {
    const keys = visibleKeys();
    const pages = Math.max(1, Math.ceil(keys.length / view.size));
    if (view.page >= pages) view.page = pages - 1;
    const start = view.page * view.size;
    const rows = document.createDocumentFragment();
    for (const key of keys.slice(start, start + view.size)) {
      const a = agents.get(key);
      const tr = el("tr", { "data-key": a.key, "data-state": a.state });
      const name = el("td");
      name.append(el("a", { href: "#agent/" + encodeURIComponent(a.key) }, a.key));
      if (a.parent) name.append(el("span", { class: "muted" }, " ← " + a.parent));
      if (cluster && a.node) name.append(el("span", { class: "node muted", "data-node": a.node }, " @ " + a.node));
      const st = el("td");
      st.append(stateBadge(a.state, a.paused));
      const estop = a.emergency
        ? el("td", { class: "estop" }, "⚠ LOCKED" + (a.lockout ? ": " + a.lockout.breaker : ""))
        : el("td", null, "—");
      const act = el("td");
      act.append(actions(a));
      tr.append(
        name,
        st,
        estop,
        el("td", { class: "num" }, a.errors + " / " + a.maxErrors),
        el("td", { class: "num" }, a.queue),
        el("td", { class: "num" }, a.turns),
        el("td", { class: "num" }, a.tokens),
        el("td", null, time(a.last)),
        act
      );
      rows.append(tr);
    }
    $("agents-body").replaceChildren(rows);
    $("agents-shown").textContent = keys.length + " of " + agents.size + " agents";
    $("page-info").textContent = "page " + (view.page + 1) + " of " + pages;
    $("page-prev").disabled = view.page === 0;
    $("page-next").disabled = view.page + 1 >= pages;
    perf.renders++;
    if (perf.firstPaint === null && agents.size > 0) {
      perf.firstPaint = performance.now();
      body.dataset.firstPaint = String(Math.round(perf.firstPaint));
    }
  }

  function renderHeaderState() {
    let stopped = 0, locked = 0, busy = 0;
    for (const a of agents.values()) {
      if (a.state === "STOPPED") stopped++;
      else if (a.state === "SAFETY_LOCKOUT") locked++;
      else if (a.state !== "WAITING_FOR_EVENT") busy++;
    }
    const n = agents.size;
    const box = $("fleet-state");
    box.classList.remove("halted", "trouble");
    if (n > 0 && stopped === n) {
      box.textContent = "■ HALTED — all " + n + " agents stopped";
      box.classList.add("halted");
    } else if (locked > 0) {
      box.textContent = "⚠ " + locked + " locked out · " + stopped + " stopped · " + busy + " busy";
      box.classList.add("trouble");
    } else {
      const counts = busy + " busy · " + stopped + " stopped · " + (n - busy - stopped) + " idle";
      if (stopped > 0) box.textContent = "◧ PARTLY HALTED — " + counts;
      else if (busy > 0) box.textContent = "▶ RUNNING — " + counts;
      else box.textContent = "○ IDLE — " + counts;
    }
    $("g-agents").textContent = String(n);
  }

  // ---- the fleet header ----------------------------------------------------------------------
  function budget(used, limit, fmt) {
    if (!limit) return fmt(used) + " (no limit)";
    const pct = Math.round((100 * used) / limit);
    return fmt(used) + " / " + fmt(limit) + " (" + pct + "%)" + (pct >= 90 ? " ⚠" : "");
  }

  async function loadFleet() {
    const r = await api("GET", "/api/fleet");
    if (!r.ok) return;
    const f = r.data;
    const tokens = $("g-tokens");
    tokens.textContent = budget(f.fleet.tokens, f.fleet.token_limit, String);
    tokens.classList.toggle("over", !!f.fleet.token_limit && f.fleet.tokens >= 0.9 * f.fleet.token_limit);
    const cost = $("g-cost");
    cost.textContent = budget(f.fleet.cost, f.fleet.cost_limit, (c) => c.toFixed(4));
    cost.classList.toggle("over", !!f.fleet.cost_limit && f.fleet.cost >= 0.9 * f.fleet.cost_limit);
    $("g-inflight").textContent = String(f.llm_calls_in_flight);
    $("g-turns").textContent = String(f.turns_running);
    $("g-journal").textContent = f.journal.ok ? "✔ ok" : "✖ degraded";
    const banner = $("journal-banner");
    if (f.journal.ok) {
      banner.hidden = true;
    } else {
      banner.hidden = false;
      banner.textContent =
        "⚠ Journal degraded: " + f.journal.degraded + " — no event is accepted and no turn starts until it can write again.";
    }
    setApprovalCount(f.interventions_pending);
    // An ask made while the stream was (re)connecting is on no stream: the count tells, and the
    // list is read again.
    if (f.interventions_pending !== approvals.size) loadApprovals();
  }

  // ---- loading and the event stream ---------------------------------------------------------
  async function loadAgents() {
    const r = await api("GET", "/api/agents");
    if (!r.ok) return failed("loading the agents", r);
    const seen = new Set();
    for (const s of r.data) {
      upsert(s);
      seen.add(s.key);
    }
    for (const k of Array.from(agents.keys())) if (!seen.has(k)) agents.delete(k);
    sortedKeys = null;
    markDirty();
  }

  async function seedActivity() {
    const r = await api("GET", "/api/events/recent?limit=1000");
    if (!r.ok) return;
    for (const e of r.data.events) {
      const a = agents.get(e.agent);
      if (a && e.at_ms > a.last) a.last = e.at_ms;
    }
    markDirty();
  }

  const handlers = {
    state_changed(a, k, e) {
      a.state = k.to;
      if (k.to === "SAFETY_LOCKOUT") a.emergency = true;
      if (k.from === "SAFETY_LOCKOUT") a.emergency = false;
      pendingLags.push(e.at_ms);
    },
    locked_out(a, k) {
      a.emergency = true;
      a.lockout = { breaker: k.breaker, reason: k.reason };
      a.errors = k.consecutive_errors;
      breakersStale();
    },
    unlocked(a) {
      a.emergency = false;
      a.lockout = null;
      a.errors = 0;
    },
    breaker_stopped(a, k) {
      a.stoppedBy = { breaker: k.breaker, reason: k.reason };
      breakersStale();
    },
    error_counted(a, k) {
      a.errors = k.consecutive_errors;
    },
    errors_reset(a) {
      a.errors = 0;
    },
    turn_finished(a) {
      a.turns++;
    },
    usage_recorded(a, k) {
      a.tokens += (k.usage.prompt_tokens || 0) + (k.usage.completion_tokens || 0);
      a.cost += k.cost || 0;
    },
    paused(a) {
      a.paused = true;
    },
    unpaused(a) {
      a.paused = false;
    },
    event_queued(a) {
      a.queue++;
    },
    event_taken(a) {
      if (a.queue > 0) a.queue--;
    },
    halted(a) {
      a.queue = 0;
    },
    messages_discarded(a) {
      a.queue = 0;
    },
  };

  function onJournalEvent(msg) {
    let e;
    try {
      e = JSON.parse(msg.data);
    } catch (_) {
      return;
    }
    const a = touch(e.agent);
    if (e.at_ms > a.last) a.last = e.at_ms;
    const h = handlers[e.kind.type];
    if (h) h(a, e.kind, e);
    if (current.view === "agent" && current.key === e.agent) detailStale();
    markDirty();
  }

  let reloadTimer = null;
  function reloadSoon() {
    if (reloadTimer) return;
    reloadTimer = setTimeout(() => {
      reloadTimer = null;
      loadAgents();
    }, 200);
  }

  function stream() {
    const es = new EventSource("/api/events");
    const kinds = [
      "spawned", "state_changed", "transition_refused", "error_counted", "errors_reset", "error_window", "locked_out",
      "unlocked", "history_reset", "paused", "unpaused", "halted", "messages_discarded", "work_refused",
      "event_queued", "event_keyed", "event_taken", "history_appended", "history_compacted", "reflected",
      "goals_set", "token_budget_waiting", "turn_finished", "usage_recorded", "tool_started",
      "tool_finished", "tool_refused", "delegation_requested", "delegation_refused", "delegation_ended",
      "delegate_locked_out", "breaker_stopped", "safety_alert", "budget_warning", "limit_decided",
      "limit_denied", "tool_circuit_changed", "tool_progress", "crashed", "perceived",
      "npc_mode_changed", "restarted",
    ];
    for (const k of kinds) es.addEventListener(k, onJournalEvent);
    es.addEventListener("intervention_asked", (m) => {
      const i = JSON.parse(m.data);
      approvals.set(i.id, i);
      renderApprovals();
    });
    const gone = (m) => {
      const i = JSON.parse(m.data);
      approvals.delete(i.id);
      renderApprovals();
    };
    es.addEventListener("intervention_answered", gone);
    es.addEventListener("intervention_withdrawn", gone);
    // Skipped items: read the statuses again (the table is then exact).
    es.addEventListener("lagged", reloadSoon);
    es.addEventListener("replay_unavailable", reloadSoon);
    es.addEventListener("open", () => {
      body.setAttribute("data-stream", "open");
      // Asks made before the stream opened came on no stream.
      loadApprovals();
    });
    es.addEventListener("error", () => {
      body.setAttribute("data-stream", "reconnecting");
      // A closed stream may be an ended session: the fleet read answers 401 and sends us to login.
      if (es.readyState === EventSource.CLOSED) {
        loadFleet();
        setTimeout(stream, 2000);
      }
    });
  }

  // ---- actions ------------------------------------------------------------------------------
  function applyAcks(data) {
    if (!data || !data.halted) return;
    for (const ack of data.halted) {
      const a = agents.get(ack.agent);
      if (a) {
        a.state = ack.state;
        a.queue = 0;
      }
    }
    markDirty();
  }

  async function control(action, key) {
    const path = "/api/agents/" + encodeURIComponent(key) + "/" + action;
    const r = await api("POST", path);
    if (!r.ok) return failed(action + " " + key, r);
    if (action === "halt") applyAcks(r.data);
    else upsert(r.data);
    flash("✔ " + action + " " + key);
    markDirty();
    if (current.view === "agent") detailStale();
  }

  let unlockKey = null;
  function askUnlock(key) {
    unlockKey = key;
    const a = agents.get(key);
    $("unlock-agent").textContent = key;
    $("unlock-why").textContent = a && a.lockout ? "Locked out by " + a.lockout.breaker + ": " + a.lockout.reason : "";
    $("unlock-reason").value = "";
    // Escape closes a dialog without touching returnValue: clear the last answer first.
    $("unlock-dialog").returnValue = "";
    $("unlock-dialog").showModal();
    $("unlock-reason").focus();
  }

  $("unlock-dialog").addEventListener("close", async () => {
    const d = $("unlock-dialog");
    const key = unlockKey;
    unlockKey = null;
    if (d.returnValue !== "unlock" || !key) return;
    const reason = $("unlock-reason").value.trim();
    const r = await api("POST", "/api/agents/" + encodeURIComponent(key) + "/unlock", { reason });
    if (!r.ok) return failed("unlock " + key, r);
    upsert(r.data);
    flash("✔ unlocked " + key + " (reason journaled)");
    markDirty();
    if (current.view === "agent") detailStale();
  });

  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (!b || b.disabled) return;
    const { action, key } = b.dataset;
    if (action === "unlock") askUnlock(key);
    else control(action, key);
  });

  // HALT ALL: the form works without JavaScript (tick confirm, submit); with it, a dialog confirms.
  $("halt-confirm").required = false;
  if (!ADMIN) {
    $("halt-all").disabled = true;
    $("halt-all").title = "read-only session";
  }
  $("halt-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!ADMIN) return;
    $("halt-dialog").returnValue = "";
    $("halt-dialog").showModal();
  });
  $("halt-dialog").addEventListener("close", async () => {
    if ($("halt-dialog").returnValue !== "halt") return;
    perf.haltClicked = performance.now();
    perf.haltOnScreen = null;
    flash("Halting every agent…");
    const r = await api("POST", "/api/halt");
    applyAcks(r.data);
    if (r.ok) flash("■ HALT ALL: " + r.data.halted.length + " agents halted");
    else failed("HALT ALL", r);
  });

  // ---- filters and pages --------------------------------------------------------------------
  $("f-text").addEventListener("input", (e) => {
    view.text = e.target.value.trim().toLowerCase();
    view.page = 0;
    markDirty();
  });
  $("f-state").addEventListener("change", (e) => {
    view.state = e.target.value;
    view.page = 0;
    markDirty();
  });
  $("f-problems").addEventListener("change", (e) => {
    view.problems = e.target.checked;
    view.page = 0;
    markDirty();
  });
  $("f-size").addEventListener("change", (e) => {
    view.size = Number(e.target.value) || 100;
    view.page = 0;
    markDirty();
  });
  $("page-prev").addEventListener("click", () => {
    view.page = Math.max(0, view.page - 1);
    markDirty();
  });
  $("page-next").addEventListener("click", () => {
    view.page++;
    markDirty();
  });
  for (const b of document.querySelectorAll("th button[data-sort]")) {
    b.addEventListener("click", () => {
      const s = b.dataset.sort;
      view.desc = view.sort === s ? !view.desc : false;
      view.sort = s;
      for (const o of document.querySelectorAll("th[aria-sort]")) o.removeAttribute("aria-sort");
      b.parentElement.setAttribute("aria-sort", view.desc ? "descending" : "ascending");
      markDirty();
    });
  }

  // ---- approvals ----------------------------------------------------------------------------
  const approvals = new Map();

  function setApprovalCount(n) {
    const c = $("approvals-count");
    c.textContent = String(n);
    c.classList.toggle("pending", n > 0);
  }

  async function loadApprovals() {
    const r = await api("GET", "/api/interventions");
    if (!r.ok) return;
    approvals.clear();
    for (const i of r.data) approvals.set(i.id, i);
    renderApprovals();
  }

  // A pause sign drawn, not a glyph: "⏸" is missing from Debian's stock fonts.
  function pauseIcon() {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    for (const [k, v] of [["viewBox", "0 0 10 10"], ["width", "0.9em"], ["height", "0.9em"], ["class", "icon"], ["aria-hidden", "true"]]) svg.setAttribute(k, v);
    for (const x of ["1.5", "6"]) {
      const r = document.createElementNS(ns, "rect");
      for (const [k, v] of [["x", x], ["y", "1"], ["width", "2.5"], ["height", "8"], ["fill", "currentColor"]]) r.setAttribute(k, v);
      svg.append(r);
    }
    return svg;
  }

  // A permission ask as what it is: who wants to run which tool with which arguments, which rule
  // asked, and what the agent said with the call. Model and tool text only ever as textContent.
  function permissionAsk(i) {
    const p = i.permission;
    const box = document.createDocumentFragment();
    const title = el("strong", null, " Permission: " + i.agent + " wants to run ");
    title.prepend(pauseIcon());
    title.append(el("code", { class: "ask-tool" }, p.tool));
    box.append(title);
    const dl = el("dl", { class: "ask-detail" });
    const row = (term, value) => {
      dl.append(el("dt", null, term));
      const dd = el("dd");
      dd.append(value);
      dl.append(dd);
    };
    row("Category", el("span", { class: "ask-category" }, p.category));
    row("Rule", el("code", { class: "ask-rule" }, p.rule));
    let args;
    try {
      args = JSON.stringify(p.arguments, null, 2);
    } catch (_) {
      args = String(p.arguments);
    }
    row("Arguments", el("pre", { class: "ask-arguments" }, args));
    if (p.last_message) row("Agent said", el("blockquote", { class: "ask-last" }, p.last_message));
    box.append(dl);
    return box;
  }

  function renderApprovals() {
    setApprovalCount(approvals.size);
    const list = $("approvals");
    list.replaceChildren();
    if (approvals.size === 0) list.append(el("li", { class: "empty" }, "No pending ask."));
    for (const i of approvals.values()) {
      const li = el("li", { "data-intervention": i.id });
      if (i.permission) {
        li.setAttribute("data-kind", "permission");
        li.append(permissionAsk(i));
      } else {
        li.setAttribute("data-kind", "limit");
        const title = el("strong", null, " " + i.agent + ": ");
        title.prepend(pauseIcon());
        li.append(
          title,
          el("span", null, i.question),
          el("div", { class: "muted" }, i.kind
            ? i.kind + " reached " + i.current + " of " + i.configured + " (" + i.config_key + ")"
            // A remote A2A agent's question (docs/a2a.md): the answer and the note are sent to it.
            : "a remote agent asks (" + i.config_key + "): yes or no, and the note, are sent to it as the next message")
        );
      }
      const form = el("form", { "data-id": i.id });
      const noteId = "note-" + i.id;
      form.append(el("label", { for: noteId }, "Note"), el("input", { id: noteId, name: "note", type: "text" }));
      const yes = el("button", { type: "submit", value: "yes", "data-answer": "yes" }, "✔ Yes, allow");
      const no = el("button", { type: "submit", value: "no", "data-answer": "no" }, "✖ No, refuse");
      if (!ADMIN) yes.disabled = no.disabled = true;
      form.append(yes, no);
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const answer = ev.submitter ? ev.submitter.dataset.answer : "no";
        const note = form.elements.note.value.trim();
        const payload = note ? { answer, note } : { answer };
        const r = await api("POST", "/api/interventions/" + i.id, payload);
        if (!r.ok) return failed("answer " + i.id, r);
        approvals.delete(i.id);
        renderApprovals();
        flash("✔ answered " + answer + " to " + i.agent);
      });
      li.append(form);
      list.append(li);
    }
  }

  // ---- breakers -----------------------------------------------------------------------------
  let breakersTimer = null;
  function breakersStale() {
    if (current.view !== "breakers" || breakersTimer) return;
    breakersTimer = setTimeout(() => {
      breakersTimer = null;
      loadBreakers();
    }, 300);
  }

  async function loadBreakers() {
    const r = await api("GET", "/api/breakers/recent");
    const tbody = $("trips-body");
    if (!r.ok) {
      const tr = el("tr");
      tr.append(el("td", { colspan: 5 }, r.data ? r.data.error : "unavailable"));
      tbody.replaceChildren(tr);
      return;
    }
    const counts = Object.entries(r.data.trips).map(([b, n]) => b + ": " + n);
    $("trip-counts").textContent = counts.length ? "Trips since start — " + counts.join(", ") : "No breaker has tripped since start.";
    const rows = document.createDocumentFragment();
    for (const t of r.data.recent) {
      const tr = el("tr");
      const who = el("td");
      who.append(el("a", { href: "#agent/" + encodeURIComponent(t.agent) }, t.agent));
      tr.append(
        el("td", null, new Date(t.at_ms).toLocaleString()),
        who,
        el("td", null, t.breaker),
        el("td", null, t.lockout ? "⚠ SAFETY_LOCKOUT" : "■ STOPPED"),
        el("td", { class: "msg" }, t.reason)
      );
      rows.append(tr);
    }
    tbody.replaceChildren(rows);
  }

  // ---- one agent ----------------------------------------------------------------------------
  let detailTimer = null;
  function detailStale() {
    if (detailTimer) return;
    detailTimer = setTimeout(() => {
      detailTimer = null;
      if (current.view === "agent") loadDetail(current.key);
    }, 300);
  }

  function short(text, n) {
    if (text === null || text === undefined) return "";
    text = String(text);
    return text.length > n ? text.slice(0, n) + "…" : text;
  }

  // One journal event as a timeline line: [text, css class] (class "fail" for failures).
  function describe(k) {
    switch (k.type) {
      case "event_queued":
        return ["event #" + k.id + " from " + (k.event.sender || k.event.source) + ": " + short(k.event.content, 300), "turn-start"];
      case "event_taken":
        return ["turn takes event #" + k.id, ""];
      case "perceived":
        return [
          "perceived " + (k.event.kind || "") + " from " + ((k.event.speaker && k.event.speaker.id) || "?") +
            ": " + k.perception.verdict + " by rule " + k.perception.rule + ", trust " + k.perception.trust +
            (k.perception.downgraded ? " (downgraded)" : ""),
          "",
        ];
      case "usage_recorded":
        return ["model call: " + k.usage.prompt_tokens + " prompt + " + k.usage.completion_tokens + " completion tokens" + (k.cost ? ", cost " + k.cost : ""), ""];
      case "tool_started":
        return ["tool " + k.tool + " started", ""];
      case "tool_finished":
        return k.ok ? ["tool " + k.tool + " ok", ""] : ["tool " + k.tool + " failed: " + short(k.error, 300), "fail"];
      case "tool_refused":
        return ["tool call " + k.call_id + " refused (halt requested)", "fail"];
      case "turn_finished": {
        const o = k.outcome;
        const bad = !!o.error || ["llm_error", "parse_error", "safety_lockout"].indexOf(o.reason) >= 0;
        const text = o.answer ? "answer: " + short(o.answer, 500) : "turn ended: " + o.reason + (o.error ? " — " + o.error : "");
        return [text + " (" + o.iterations + " model calls)", bad ? "fail" : ""];
      }
      case "error_counted":
        return ["error " + k.consecutive_errors + ": " + short(k.error, 300), "fail"];
      case "locked_out":
        return ["LOCKED OUT by " + k.breaker + ": " + k.reason, "fail"];
      case "unlocked":
        return ["unlocked by " + k.operator + (k.note ? " — reason: " + k.note : ""), ""];
      case "breaker_stopped":
        return ["stopped by " + k.breaker + ": " + k.reason, "fail"];
      case "state_changed":
        return ["state " + k.from + " → " + k.to + " (" + k.cause + ")", k.to === "SAFETY_LOCKOUT" ? "fail" : "muted"];
      case "halted":
        return ["halted (" + JSON.stringify(k.cause) + "), " + k.discarded + " queued discarded", ""];
      case "work_refused":
        return ["refused " + k.work + ": " + JSON.stringify(k.refusal), "fail"];
      case "limit_decided":
        return ["limit " + k.kind + " at " + k.current + " of " + k.configured + ": " + JSON.stringify(k.decision), ""];
      case "limit_denied":
        return ["limit " + k.kind + " refused at " + k.current + " of " + k.configured, "fail"];
      case "delegation_requested":
        // The task as journaled (its first 200 characters); journals from before it was recorded
        // have none: the row then names the delegation and its hop only.
        return ["delegates to " + k.to + (k.task ? ": " + short(k.task, 200) : "") +
          " (delegation " + k.id + ", hop " + k.hops + ")", ""];
      case "crashed":
        return ["crashed in " + k.state, "fail"];
      default: {
        const rest = Object.assign({}, k);
        delete rest.type;
        return [k.type.replace(/_/g, " ") + " " + short(JSON.stringify(rest), 200), "muted"];
      }
    }
  }

  async function loadDetail(key) {
    const enc = encodeURIComponent(key);
    const [s, ev, mem] = await Promise.all([
      api("GET", "/api/agents/" + enc),
      api("GET", "/api/events/recent?limit=1000&agent=" + enc),
      api("GET", "/api/agents/" + enc + "/memories?limit=20"),
    ]);
    if (current.view !== "agent" || current.key !== key) return;
    if (!s.ok) {
      $("agent-summary").textContent = s.data ? s.data.error : "unknown agent";
      return;
    }
    upsert(s.data);
    const a = agents.get(key);
    $("agent-h").textContent = "Agent " + key;
    const sum = $("agent-summary");
    sum.replaceChildren();
    const field = (label, value) => {
      const d = el("div");
      d.append(el("span", null, label));
      if (value instanceof Node) d.append(value);
      else d.append(document.createTextNode(String(value)));
      sum.append(d);
    };
    field("State", stateBadge(a.state, a.paused));
    if (cluster && a.node) {
      field("Node", remote(a) ? a.node + " — another node: its status is at most a beat old, and its conversation and events are in that node's journal (open its console)" : a.node + " (this node)");
    }
    field("Role", a.role + (a.parent ? " of " + a.parent : ""));
    field("Emergency stop", a.emergency ? "⚠ LOCKED: " + (a.lockout ? a.lockout.breaker + " — " + a.lockout.reason : "") : "no");
    field("Errors in a row", a.errors + " / " + a.maxErrors);
    field("Queue", a.queue);
    field("Turns", a.turns);
    field("Tokens / cost", a.tokens + " / " + a.cost.toFixed(4));
    if (a.npc && a.npc.last) {
      const p = a.npc.last;
      field("NPC: last classification", p.verdict + " by rule " + p.rule + ", trust " + p.trust);
    }
    if (s.data.goals && s.data.goals.length) field("Goals", s.data.goals.join("; "));
    // Long-term memory: what it remembers about whom (texts as text nodes, never markup).
    const memories = mem.ok && mem.data && mem.data.memories ? mem.data.memories : [];
    if (memories.length) {
      const ul = el("ul", { id: "agent-memories", class: "memories" });
      for (const m of memories) {
        const k = m.kind || {};
        let who = k.type;
        if (k.type === "observation") who = k.speaker + " (" + k.source + ", trust " + m.trust + ")";
        else if (k.type === "fact") who = (k.claim ? "claim by " : "fact from ") + (k.asserted_by || []).join(", ") + (k.contradicted_by != null ? ", contradicted" : "");
        ul.append(el("li", null, "#" + m.id + " " + who + ": " + m.text));
      }
      field("Memories", ul);
    }
    const acts = $("agent-actions");
    acts.replaceChildren(actions(a));
    $("chat-send").disabled = !ADMIN || remote(a);
    const tl = document.createDocumentFragment();
    const hist = document.createDocumentFragment();
    const events = ev.ok ? ev.data.events : [];
    for (const e of events) {
      if (e.kind.type === "history_appended") {
        const m = e.kind.message;
        if (m.internal) continue;
        const li = el("li");
        li.append(el("span", { class: "role" }, m.role), document.createTextNode(m.content || (m.tool_calls || []).map((c) => "→ " + (c.name || (c.function && c.function.name) || "tool")).join(", ")));
        hist.append(li);
        continue;
      }
      const [text, cls] = describe(e.kind);
      const li = el("li", { class: cls, "data-type": e.kind.type });
      li.append(el("span", { class: "t" }, time(e.at_ms)), el("span", { class: "k" }, "#" + e.seq), document.createTextNode(text));
      tl.append(li);
    }
    $("timeline").replaceChildren(tl);
    $("history").replaceChildren(hist);
    if (remote(a)) $("timeline").append(el("li", { class: "muted" }, "runs on node " + a.node + ": its events are in that node's journal"));
    else if (!ev.ok) $("timeline").append(el("li", { class: "muted" }, "journal unavailable: " + (ev.data ? ev.data.error : ev.status)));
  }

  $("chat-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = current.key;
    const text = $("chat-text").value.trim();
    if (!text || !key) return;
    const log = $("chat-log");
    log.prepend(el("p", null, "you → " + key + ": " + text));
    $("chat-text").value = "";
    const r = await api("POST", "/api/agents/" + encodeURIComponent(key) + "/events?wait=60", { content: text, source: "console" });
    const d = r.data || {};
    let line, fail = false;
    if (d.status === "answered") line = key + ": " + (d.answer || "(no answer)");
    else if (d.status === "pending" || d.status === "running") line = "event #" + d.id + " queued; the answer will show in the timeline";
    else {
      fail = true;
      line = "✖ " + (d.error || (d.status ? d.status + ": " + JSON.stringify(d.refusal || d.error || d.reason) : "HTTP " + r.status));
    }
    log.prepend(el("p", { class: fail ? "fail" : "answer" }, line));
    detailStale();
  });

  // ---- views (hash routes: #agents, #agent/KEY, #approvals, #breakers) ----------------------
  const current = { view: "agents", key: null };

  function route() {
    const h = location.hash.replace(/^#/, "");
    let v = "agents", key = null;
    if (h.startsWith("agent/")) {
      v = "agent";
      key = decodeURIComponent(h.slice(6));
    } else if (h === "approvals" || h === "breakers") v = h;
    current.view = v;
    current.key = key;
    for (const name of ["agents", "agent", "approvals", "breakers"]) $("view-" + name).hidden = name !== v;
    for (const name of ["agents", "approvals", "breakers"]) {
      const tab = $("tab-" + name);
      if (name === v || (name === "agents" && v === "agent")) tab.setAttribute("aria-current", "page");
      else tab.removeAttribute("aria-current");
    }
    if (v === "agents") markDirty();
    if (v === "agent") {
      $("chat-log").replaceChildren();
      $("timeline").replaceChildren();
      $("history").replaceChildren();
      loadDetail(key);
    }
    if (v === "approvals") loadApprovals();
    if (v === "breakers") loadBreakers();
  }
  window.addEventListener("hashchange", route);

  // ---- start --------------------------------------------------------------------------------
  const params = new URLSearchParams(location.search);
  if (params.has("halted")) flash("■ HALT ALL: " + params.get("halted") + " agents halted");
  if (params.get("halt") === "unconfirmed") flash("HALT ALL was not confirmed: nothing was halted.");
  if (!ADMIN) $("whoami").textContent = "signed in: read-only (you can watch, not act)";

  route();
  stream();
  loadAgents().then(seedActivity);
  loadFleet();
  loadCluster();
  loadApprovals();
  // The header's budgets and health every second; the whole table now and then (queue depths are
  // not all on the stream), less often for a large fleet.
  setInterval(loadFleet, 1000);
  setInterval(loadCluster, 2000);
  setInterval(() => {
    if (!document.hidden) loadAgents();
  }, 10000);
})();
