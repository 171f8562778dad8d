// MemLens dashboard: one page, its views (more in debug.js), an inspector for the selected memory. Plain JS,
// no build. The URL's fragment holds the view, session, selected memory and build (deep links).
"use strict";

(function () {
  const C = window.Charts;
  const state = {
    view: "sessions",
    session: "",
    selected: null,
    context: null,
    diffWith: null,
    // this tab's key (a link's), else the one saved in the browser
    key: sessionStorage.getItem("clawvm_key") || localStorage.getItem("clawvm_key") || "",
    memPage: { offset: 0, sort: "newest" },
    filters: { q: "", kind: "", agent: "", tool: "", tag: "", tier: "", status: "", since: "", until: "" },
    sessFilters: { q: "", agent: "", since: "", until: "" },  // the sessions list's own bar
    traceTask: "",
    whatif: { budget: "", working_items: "", working_tokens: "", weights: "", reach: "" },
    role: null,  // the key's role (from /v1/whoami): a read-only key is offered no action
    heat: { group: "memory", offset: 0 },
    graphLimit: 120,
    axis: "events",
    sessOffset: 0,
    focus: null,
    ctxOffset: 0,
  };
  const PAGE = 25;
  // the sessions list's row of the memories recorded without a session: a selection the memory lists and
  // the builds take (the API's ``session=(none)``); a trace, a what-if or a session's metrics need a real one
  const NO_SESSION = "(none)";
  const realSession = () => (state.session === NO_SESSION ? "" : state.session);
  const $ = (sel) => document.querySelector(sel);

  // text in a right-to-left script (Hebrew, Arabic, Syriac, Thaana…): an element holding it takes its
  // direction from its own first strong character and is isolated from the text around it (dir="auto"):
  // an Arabic preview ran into the LTR text beside it, its ellipsis and punctuation on the wrong side
  const RTL = /[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]/;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick" || k === "onchange" || k === "oninput" || k === "ontoggle") node.addEventListener(k.slice(2), v);
      else if (k === "onopen") opens(node, v);
      else if (k === "text") {
        node.textContent = v;
        if (RTL.test(String(v)) && !(attrs && attrs.dir)) node.dir = "auto";
      }
      else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
    }
    node.append(...nodes(children));
    return node;
  }

  // what every list row that opens something (a memory, a build, a session) uses: it takes the focus (Tab)
  // and opens on a click, Enter or Space
  function opens(node, open) {
    node.tabIndex = 0;
    node.addEventListener("click", open);
    node.addEventListener("keydown", (e) => {
      if (e.target !== node || (e.key !== "Enter" && e.key !== " ")) return;
      e.preventDefault();  // Space scrolled the page
      open(e);
    });
  }

  // a user's text (a preview, a query) inside a line of the page's own: isolated, in its own direction
  const bidi = (text) => el("bdi", { text: text || "" });

  // children as DOM nodes: nested arrays flattened, null/undefined/false dropped, text and numbers as text
  function nodes(children) {
    return children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
      .map((c) => (typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c));
  }

  function fill(node, ...children) {
    node.replaceChildren(...nodes(children));
  }

  function qs(params) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) p.set(k, v);
    const s = p.toString();
    return s ? "?" + s : "";
  }

  class ApiError extends Error {}

  async function api(path, opts) {
    const headers = Object.assign({ Accept: "application/json" }, (opts && opts.headers) || {});
    if (state.key) headers.Authorization = "Bearer " + state.key;
    let res = await fetch("api/" + path, Object.assign({}, opts || {}, { headers }));
    // a view reads several things at once and may meet the key's rate limit: a read waits what the 429's
    // Retry-After says and asks again (a few times); a write is never sent twice
    const reading = !opts || !opts.method || opts.method.toUpperCase() === "GET";
    for (let again = 0; res.status === 429 && reading && again < 5; again++) {
      const wait = Math.min(5, Number(res.headers.get("Retry-After")) || 1);
      await new Promise((done) => setTimeout(done, wait * 1000));
      res = await fetch("api/" + path, Object.assign({}, opts || {}, { headers }));
    }
    if (res.status === 401) {
      // no key, or one the server refused: what the inspector showed (and offered) was the old key's
      $("#keybar").hidden = false;
      closeInspector();
      throw new ApiError(state.key ? "the API key was refused (401): enter another above" : "an API key is needed: enter one above");
    }
    if (res.status === 403) {
      $("#keybar").hidden = false;
      throw new ApiError("this key may not do that");
    }
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {  // the server's error schema: {"error": {"code", "message", "field", "fix"}}
      const e = body.error || {};
      throw new ApiError(e.message ? `${e.field ? e.field + ": " : ""}${e.message}${e.fix ? ` (${e.fix})` : ""}` : `HTTP ${res.status}`);
    }
    return body;
  }

  async function download(path, filename) {
    const headers = state.key ? { Authorization: "Bearer " + state.key } : {};
    const res = await fetch("api/" + path, { headers });
    if (!res.ok) throw new ApiError(`export failed: HTTP ${res.status}`);
    const url = URL.createObjectURL(await res.blob());
    const a = el("a", { href: url, download: filename });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  // a file made in the page (what it already holds: a trace, a what-if comparison)
  function saveText(text, filename, mime) {
    const url = URL.createObjectURL(new Blob([text], { type: mime }));
    const a = el("a", { href: url, download: filename });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  // rows (objects) as CSV: the columns given, quoted where needed; text that a spreadsheet would read as a
  // formula (starting =, +, -, @, tab or CR: OWASP's CSV injection list) gets a leading ' as the server's
  // exports do, so a memory's "=HYPERLINK(...)" opens as text (a number, even a negative one, stays a number)
  function toCsv(rows, columns) {
    const cell = (v) => {
      let t = v === null || v === undefined ? "" : Array.isArray(v) ? v.join(" ") : typeof v === "object" ? JSON.stringify(v) : String(v);
      if (typeof v !== "number" && /^ *[=+\-@\t\r]/.test(t)) t = "'" + t;  // spaces first too
      return /[",\n\r]/.test(t) ? `"${t.replace(/"/g, '""')}"` : t;
    };
    return [columns.join(","), ...rows.map((r) => columns.map((c) => cell(r[c])).join(","))].join("\n") + "\n";
  }

  const toJsonl = (rows) => rows.map((r) => JSON.stringify(r) + "\n").join("");

  // the two export buttons every list has; ``run(fmt)`` makes the file
  function exportButtons(prefix, run, what) {
    const go = (fmt) => Promise.resolve().then(() => run(fmt)).catch((e) => toast(String(e.message || e), true));
    return [el("button", { id: `${prefix}-export-jsonl`, onclick: () => go("jsonl"), text: "Export JSONL", title: `${what}, one JSON object per line` }),
      el("button", { id: `${prefix}-export-csv`, onclick: () => go("csv"), text: "Export CSV", title: `${what} as CSV` })];
  }

  const canWrite = () => state.role !== null && state.role !== "read-only";

  function post(path, body) {
    return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}) });
  }

  function toast(msg, isError) {
    const t = $("#toast");
    t.textContent = msg;
    t.className = isError ? "error" : "";
    t.hidden = false;
    clearTimeout(toast.timer);
    // long enough to read: 4 s, and a second more for every 60 characters past the first 80 (a "set value"
    // that fell short explains why in ~150), at most 15 s (a long server error would stay for minutes)
    toast.timer = setTimeout(() => { t.hidden = true; }, Math.min(15000, 4000 + Math.max(0, msg.length - 80) / 60 * 1000));
  }

  const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
  const num = (x, d) => (x === null || x === undefined ? "–" : Number(x).toFixed(d === undefined ? 1 : d));
  const when = (iso) => (iso ? iso.replace("T", " ").slice(0, 19) : "–");
  const tierPill = (t) => el("span", { class: `pill tier-${t}`, text: (t || "?").replace("_", " ") });
  const secPill = (s) => el("span", { class: `pill sec-${s}`, text: s });

  function tierBar(tiers) {
    const total = Object.values(tiers).reduce((a, b) => a + b, 0) || 1;
    return el("div", { class: "tierbar", title: Object.entries(tiers).map(([k, v]) => `${k}: ${v}`).join(", ") },
      Object.entries(tiers).map(([k, v]) => el("span", { style: `width:${(100 * v) / total}%;background:${C.TIER_COLORS[k]}` })));
  }

  function pager(page, onMove) {
    const { total, offset, limit } = page;
    return el("div", { class: "pager" },
      el("button", { disabled: offset <= 0 || null, onclick: () => onMove(Math.max(0, offset - limit)), text: "‹ prev" }),
      el("span", { class: "muted", text: total ? `${offset + 1}–${Math.min(total, offset + limit)} of ${total}` : "none" }),
      el("button", { disabled: offset + limit >= total || null, onclick: () => onMove(offset + limit), text: "next ›" }));
  }

  // ---- views --------------------------------------------------------------------------------------
  async function viewSessions(main) {
    const sf = Object.assign({}, state.sessFilters);
    if (sf.until) sf.until += "T23:59:59";
    const data = await api("sessions" + qs(Object.assign(sf, { limit: 15, offset: state.sessOffset })));
    const rows = data.items.map((s) => el("tr", {
      class: "clickable session-row" + (s.session_id === state.session ? " selected" : ""), "data-session": s.session_id,
      onopen: () => { setSession(s.session_id); show("sessions"); },
    },
    el("td", { class: "clip", title: s.session_id }, el("b", { text: s.session_id })),
    clipCell(s.agents.join(", ")), clipCell(s.tasks.join(", ")),
    el("td", { text: s.memories }), el("td", {}, tierBar(s.tiers)), el("td", { class: "wide-only", text: s.pinned }),
    el("td", { class: "wide-only", text: s.working_tokens }), el("td", { class: "wide-only", text: s.contexts }), el("td", { class: "nowrap", text: when(s.last).slice(0, 16) })));
    const heads = [["session", "w-session"], ["agents", ""], ["tasks", ""], ["memories", "w-num"], ["tiers", "w-tiers"], ["pinned", "w-num wide-only"],
      ["working tokens", "w-num wide-only"], ["contexts", "w-num wide-only"], ["last activity", "w-when"]];
    fill(main, 
      el("h2", { text: `Sessions (${data.total})` }),
      filterBar(() => { state.sessOffset = 0; show("sessions"); }, ["q", "agent", "since", "until"], state.sessFilters, "sessions-filters", "session id…"),
      el("div", { class: "card" }, el("table", { id: "sessions-table", class: "fit" },
        el("tr", {}, heads.map(([h, c]) => el("th", { class: c, text: h }))),
        rows),
        pager(data, (o) => { state.sessOffset = o; show("sessions"); })),
      el("h2", { id: "memories-heading", text: state.session === NO_SESSION ? "Memories without a session"
        : state.session ? `Memories of ${state.session}` : "Memories (all sessions)" }),
      el("div", { id: "memories" }));
    await renderMemories($("#memories"));
  }

  const FILTERS = {
    kind: ["user_input", "llm_thought", "tool_call", "tool_result", "agent_state", "observation", "decision", "error", "knowledge", "summary", "note"],
    tier: ["working", "short_term", "long_term", "archive"],
    status: ["active", "archived", "obsolete", "expired"],
  };

  const clipCell = (text) => el("td", { class: "clip", title: text || "", text: text || "–" });

  // the filter bar every list shares: kind, agent, tool, tag, tier, status, date range, text (``only``: the
  // ones that list's data has; ``target``: where the values live, the memory lists' by default)
  function filterBar(onChange, only, target, id, textHint) {
    const f = target || state.filters;
    const changed = (k) => (e) => { f[k] = e.target.value; onChange(); };
    const choose = (k, label) => el("select", { "data-filter": k, onchange: changed(k) },
      el("option", { value: "", text: label }), FILTERS[k].map((v) => el("option", { value: v, selected: v === f[k] || null, text: v.replace("_", " ") })));
    const field = (k, placeholder, type) => el("input", { type: type || "search", "data-filter": k, placeholder, value: f[k], size: type ? null : 10, onchange: changed(k) });
    const parts = { q: () => field("q", textHint || (only ? "query text…" : "text or id…")), kind: () => choose("kind", "any kind"),
      agent: () => field("agent", "agent"), tool: () => field("tool", "tool"), tag: () => field("tag", "tag"),
      tier: () => choose("tier", "any tier"), status: () => choose("status", "any status"),
      since: () => el("label", { class: "muted" }, "from ", field("since", "", "date")),
      until: () => el("label", { class: "muted" }, "to ", field("until", "", "date")) };
    const set = (only || Object.keys(parts)).filter((k) => f[k] !== undefined);
    const any = set.some((k) => f[k]);
    return el("div", { class: "toolbar filters", id: id || null }, set.map((k) => parts[k]()),
      any ? el("button", { class: "clear-filters", text: "clear", title: "clear these filters", onclick: () => { set.forEach((k) => { f[k] = ""; }); onChange(); } }) : null);
  }

  const BUILD_FILTERS = ["q", "agent", "since", "until"];  // what a context build can be filtered by

  function filterParams() {
    const f = Object.assign({}, state.filters);
    if (f.until) f.until = f.until + "T23:59:59";  // the whole last day
    return Object.assign({ session: state.session }, f);
  }

  async function renderMemories(box) {
    const p = state.memPage;
    const data = await api("memories" + qs(Object.assign(filterParams(), { sort: p.sort, offset: p.offset, limit: PAGE })));
    const sort = el("select", { onchange: (e) => { p.sort = e.target.value; p.offset = 0; renderMemories(box); } },
      ["newest", "oldest", "value", "tokens", "used"].map((t) => el("option", { value: t, selected: t === p.sort || null, text: "sort: " + t })));
    const exportAs = (fmt) => download("export" + qs(Object.assign(filterParams(), { format: fmt })), `memlens-memories.${fmt}`).catch((e) => toast(String(e.message || e), true));
    fill(box,
      filterBar(() => { p.offset = 0; renderMemories(box); writeHash(); }, null, null, "memory-filters"),
      el("div", { class: "toolbar" }, sort, el("span", { class: "muted", text: `${data.total} match` }), el("span", { class: "spacer" }),
        el("button", { id: "export-jsonl", onclick: () => exportAs("jsonl"), text: "Export JSONL", title: "the memories of this selection, whole, one JSON object per line" }),
        el("button", { id: "export-csv", onclick: () => exportAs("csv"), text: "Export CSV", title: "this selection's columns as CSV" }),
        canWrite() ? el("button", { id: "new-memory", class: "primary", onclick: () => newMemory(box), text: "New memory" }) : null),
      el("div", { class: "card" }, el("table", { id: "memories-table", class: "fit" },
        el("tr", {}, [["id", "w-id"], ["kind · agent / tool", "w-kind"], ["tier", "w-tier"], ["value", "w-num"], ["tokens", "w-num wide-only"],
          ["ctx / cited", "w-num wide-only"], ["content", "w-content"]].map(([h, c]) => el("th", { class: c, text: h }))),
        data.items.map((m) => { const kind = m.kind + (m.state ? ` (${m.state})` : ""), who = [m.agent_id, m.tool_name].filter(Boolean).join(" / ") || "–";
          return el("tr", { class: "clickable memory-row" + (m.id === state.selected ? " selected" : ""), "data-id": m.id, onopen: () => inspect(m.id) },
            el("td", {}, el("code", { text: m.short_id })),
            el("td", { class: "clip", title: `${kind} · ${who}` }, el("div", { class: "clip kind", text: kind }), el("div", { class: "clip muted small", text: who })),
            el("td", {}, tierPill(m.tier), m.pinned ? [" ", el("span", { class: "pill pinned", text: "pinned" })] : null, m.status !== "active" ? [" ", el("span", { class: "muted", text: m.status })] : null),
            el("td", { text: num(m.value, 2) }), el("td", { class: "wide-only", text: m.tokens }), el("td", { class: "wide-only", title: "contexts entered / citations", text: `${m.injected} / ${m.cited}` }),
            // one line cut with "…" where the table has room; on a phone a few wrapped lines (style.css)
            el("td", { class: "clip content-cell", title: m.preview }, el("div", { class: "clip clamp", text: m.preview }))); }))),
      pager(data, (o) => { p.offset = o; renderMemories(box); }));
  }

  function newMemory(box) {
    const content = el("textarea", { id: "new-content", rows: 3, placeholder: "what the agent should remember…" });
    const kind = el("select", { id: "new-kind" }, FILTERS.kind.map((k) => el("option", { value: k, selected: k === "note" || null, text: k })));
    const form = el("div", { class: "card", id: "new-memory-form" }, el("h3", { text: "New memory" + (realSession() ? ` in ${realSession()}` : "") }), content,
      el("div", { class: "actions" }, kind,
        el("button", { id: "new-save", class: "primary", text: "Record", onclick: async () => {
          try {
            const r = await post("memories", { content: content.value, kind: kind.value, session_id: realSession() || null });
            toast(`recorded ${r.id.replace(/-/g, "").slice(-8)}`);
            await renderMemories(box);
            await inspect(r.id);
          } catch (e) { toast(String(e.message || e), true); }
        } }),
        el("button", { text: "Cancel", onclick: () => form.remove() })));
    box.prepend(form);
    content.focus();
  }

  // the moves table lists the latest few: say so where there are more
  const movesHeading = (shown, total) => (shown < total ? `Tier moves: the latest ${shown} of ${total}` : `Tier moves (${total})`);

  async function viewTimeline(main) {
    const data = await api("timeline" + qs(Object.assign(filterParams(), { buckets: 80, limit: 40, axis: state.axis })));
    const chart = el("div", { id: "timeline-chart" });
    const axis = el("select", { onchange: (e) => { state.axis = e.target.value; show("timeline"); } },
      el("option", { value: "events", selected: state.axis === "events" || null, text: "x axis: activity (event log)" }),
      el("option", { value: "time", selected: state.axis === "time" || null, text: "x axis: wall-clock time" }));
    fill(main, 
      el("h2", { text: "Tier timeline" + (state.session ? ` · ${state.session}` : " · all sessions") }),
      filterBar(() => show("timeline")),
      el("div", { class: "toolbar" }, axis,
        el("span", { class: "muted", text: "Memories in each tier (stacked), replayed from the add and move events." })),
      el("div", { class: "card" }, chart),
      el("h3", { id: "moves-heading", text: movesHeading((data.moves || []).length, data.total_moves || 0) }),
      el("div", { class: "card" }, el("table", { id: "moves-table" },
        el("tr", {}, ["when", "memory", "move", "reason", "value after", "content"].map((h) => el("th", { text: h }))),
        (data.moves || []).map((m) => el("tr", { class: "clickable", "data-id": m.id, onopen: () => inspect(m.id) },
          el("td", { text: when(m.at) }), el("td", {}, el("code", { text: m.short_id })),
          el("td", {}, m.from ? tierPill(m.from) : "", m.to ? [" → ", tierPill(m.to)] : ` ${m.kind}`),
          el("td", { text: m.reason }), el("td", { text: m.value === null ? "" : num(m.value, 2) }), el("td", { text: m.preview }))))));
    C.stackedArea(chart, data.edges, data.series, ["working", "short_term", "long_term", "archive"], C.TIER_COLORS);
  }

  // a phone (style.css's breakpoint): the heatmap draws fewer, full-size columns there
  const isPhone = () => window.matchMedia("(max-width: 600px)").matches;

  async function viewHeatmap(main) {
    const h = state.heat;
    // on a phone 12 columns and a narrower label: the 48 columns fitted to the screen drew 3 px text and
    // 5 px cells, and at full size they took three screens of sideways scrolling
    const phone = isPhone();
    const data = await api("heatmap" + qs(Object.assign(filterParams(), { group: h.group, offset: h.offset, limit: 40, cols: phone ? 12 : 48 })));
    const chart = el("div", { id: "heatmap-chart" });
    const group = el("select", { onchange: (e) => { h.group = e.target.value; h.offset = 0; show("heatmap"); } },
      el("option", { value: "memory", selected: h.group === "memory" || null, text: "one row per memory (by value)" }),
      el("option", { value: "kind", selected: h.group === "kind" || null, text: "aggregate by kind (mean)" }));
    fill(main, 
      el("h2", { text: "Value heatmap" + (state.session ? ` · ${state.session}` : " · all sessions") }),
      filterBar(() => { h.offset = 0; show("heatmap"); }),
      el("div", { class: "toolbar" }, group,
        h.group === "memory" ? pager({ total: data.total, offset: h.offset, limit: 40 }, (o) => { h.offset = o; show("heatmap"); }) : null),
      el("div", { class: "card" }, chart));
    C.heatmap(chart, data.edges, data.rows, inspect, phone ? { labelW: 150, chars: 22 } : null);
  }

  async function viewGraph(main) {
    const data = await api("graph" + qs(Object.assign(filterParams(), { focus: state.focus, limit: state.graphLimit })));
    const chart = el("div", { id: "graph-chart" });
    const limit = el("select", { onchange: (e) => { state.graphLimit = Number(e.target.value); show("graph"); } },
      [40, 80, 120, 200, 300].map((n) => el("option", { value: n, selected: n === state.graphLimit || null, text: `${n} nodes` })));
    fill(main, 
      el("h2", { text: "Memory graph" + (state.focus ? " · around one memory" : state.session ? ` · ${state.session}` : "") }),
      filterBar(() => show("graph")),
      el("div", { class: "toolbar" }, limit,
        state.focus ? el("button", { onclick: () => { state.focus = null; show("graph"); }, text: "show the whole scope" }) : null,
        el("span", { class: "muted", text: `${data.nodes.length} of ${data.total} memories · ${data.edges.length} links (parent, typed links, shared entities) · colour = tier, size = value` })),
      el("div", { class: "card" }, chart));
    C.forceGraph(chart, data.nodes, data.edges, (id) => { inspect(id); }, state.selected);
  }

  async function contextList(box, onPick, onlyOutputs) {
    const data = await api("contexts" + qs(Object.assign(filterParams(), { offset: state.ctxOffset, limit: 30 })));
    const items = onlyOutputs ? data.items.filter((b) => b.has_output).concat(data.items.filter((b) => !b.has_output)) : data.items;
    const exportAs = (fmt) => download("contexts/export" + qs(Object.assign(filterParams(), { format: fmt })), `memlens-contexts.${fmt}`);
    fill(box, 
      el("div", { class: "toolbar" }, el("span", { class: "muted", id: "contexts-total", text: `${data.total} builds` }), el("span", { class: "spacer" }),
        exportButtons("contexts", exportAs, "the context builds of this selection (JSONL: with manifest and output)")),
      el("table", { id: "contexts-table", class: "fit" },
        el("tr", {}, [["#", "w-num"], ["query", ""], ["tokens", "w-tokens"], ["cited", "w-num"]].map(([h, c]) => el("th", { class: c, text: h }))),
        items.map((b) => el("tr", { class: "clickable context-row" + (b.seq === state.context ? " selected" : ""), "data-seq": b.seq, onopen: () => onPick(b.seq) },
          el("td", { text: b.seq }), el("td", { class: "clip", title: b.query, text: b.query || "(no query)" }),
          el("td", { text: `${b.tokens}/${b.budget}` }), el("td", { text: b.has_output ? `${b.cited}/${b.lines}` : "–" })))),
      pager(data, (o) => { state.ctxOffset = o; contextList(box, onPick, onlyOutputs); }));
    return data.items;
  }

  async function viewContexts(main) {
    const list = el("div", { class: "card list" });
    const detail = el("div", { id: "context-detail" });
    fill(main, el("h2", { text: "Context viewer" }), filterBar(() => { state.ctxOffset = 0; show("contexts"); }, BUILD_FILTERS),
      el("p", { class: "muted", text: "The exact prompt of each build, the manifest beside it (why each line is in, its tier and value then), the output and its citations; compare two builds." }),
      el("div", { class: "split" }, list, detail));
    let items = [];
    const pick = async (seq, keepDiff) => {
      if (!keepDiff) state.diffWith = null;  // a click on another build; a deep link keeps its comparison
      state.context = seq;
      writeHash();
      list.querySelectorAll("tr.context-row").forEach((r) => r.classList.toggle("selected", Number(r.dataset.seq) === seq));
      const c = await api(`contexts/${seq}`);
      const bar = el("div", { id: "context-bar" });
      const cited = c.lines.filter((l) => l.cited).map((l) => l.short_id);
      const others = items.filter((b) => b.seq !== seq);
      const compare = el("select", { id: "compare-with", onchange: (e) => {
        state.diffWith = Number(e.target.value) || null;
        writeHash();
        if (state.diffWith) showDiff(state.diffWith, seq); else fill(diffBox);
      } },
        el("option", { value: "", text: "compare with another build…" }),
        others.map((b) => el("option", { value: b.seq, text: `#${b.seq} ${b.query.slice(0, 40)}` })));
      const diffBox = el("div", { id: "context-diff" });
      const showDiff = async (a, b) => {
        const d = await api("contexts/diff" + qs({ a: Math.min(a, b), b: Math.max(a, b) }));
        fill(diffBox, el("div", { class: "card" },
          el("h3", { text: `Build #${d.a.seq} → #${d.b.seq}: ${d.a.tokens} → ${d.b.tokens} tokens, ${d.kept} lines kept` }),
          el("div", { class: "kv" },
            el("div", { text: `in (${d.lines_in.length})` }), el("div", { id: "diff-in" }, d.lines_in.map((l) => el("div", { class: "diff-add clickable", onopen: () => inspect(l.id) }, `+ ${l.short_id} ${l.section} · `, bidi(l.preview)))),
            el("div", { text: `out (${d.lines_out.length})` }), el("div", { id: "diff-out" }, d.lines_out.map((l) => el("div", { class: "diff-del clickable", onopen: () => inspect(l.id) }, `− ${l.short_id} ${l.section} · `, bidi(l.preview))))),
          el("div", { class: "toolbar" }, el("h3", { text: "Prompt text diff" }),
            el("span", { class: "muted", id: "prompt-diff-size", text: `${d.text_diff.length} lines` }),
            el("button", { id: "prompt-diff-expand", text: "show all", title: "show the whole diff here, without the box's scroll", onclick: (e) => {
              const box = $("#prompt-diff"), open = box.classList.toggle("expanded");
              e.target.textContent = open ? "in a box" : "show all";
            } })),
          el("pre", { id: "prompt-diff", class: "diff scrollbox" }, d.text_diff.length ? d.text_diff.map((line) =>
            el("div", { class: line.startsWith("+") && !line.startsWith("+++") ? "diff-add" : line.startsWith("-") && !line.startsWith("---") ? "diff-del" : "muted", text: line })) : "the two prompts are identical")));
      };
      fill(detail, el("div", { class: "card" },
        el("h3", { text: `Build #${c.seq} · ${when(c.at)}` }),
        el("div", { class: "kv" }, el("div", { text: "query" }), el("div", { text: c.query || "(none)" }),
          el("div", { text: "scope" }), el("div", { text: JSON.stringify(c.scope) }),
          el("div", { text: "tokens" }), el("div", { text: `${c.tokens} of ${c.budget}` + (c.ms ? ` · built in ${num(c.ms)} ms` : "") })),
        bar,
        el("div", { class: "toolbar" }, compare),
        diffBox,
        el("h3", { text: "Prompt: the exact text the model got" }),
        c.text === null ? el("p", { class: "muted", text: "not kept for this build (recorded before prompts were kept)" })
          : highlight(c.text, cited, "prompt-text"),
        el("h3", { text: "Manifest" }),
        el("table", { id: "context-lines", class: "fit" },
          el("tr", {}, [["line", "w-id"], ["section", "w-tier"], ["tier then", "w-tier"], ["value then", "w-num"], ["score", "w-num wide-only"],
            ["tokens", "w-num wide-only"], ["cited", "w-num"], ["reason", "w-reason wide-only"], ["content", "w-content"]].map(([h, k]) => el("th", { class: k, text: h }))),
          c.lines.map((l) => el("tr", { class: "clickable", "data-id": l.id, onopen: () => inspect(l.id) },
            el("td", {}, el("code", { text: l.short_id })), el("td", {}, secPill(l.section)), el("td", {}, tierPill(l.tier)),
            el("td", { text: num(l.value, 2) }), el("td", { class: "wide-only", text: num(l.score, 2) }), el("td", { class: "wide-only", text: l.tokens }),
            el("td", { class: l.cited ? "cited-yes" : "cited-no", text: l.cited === null ? "–" : l.cited ? "cited" : "no" }),
            el("td", { class: "wide-only", text: l.reason }), el("td", { class: "wrap-any content-cell", text: l.preview })))),
        c.output ? [el("h3", { text: "Output" + (c.output.success === null ? "" : c.output.success ? " · task succeeded" : " · task failed") }),
          highlight(c.output.text, cited, "output-text")] : el("p", { class: "muted", text: "no output recorded for this build" })));
      const s = c.by_section;
      // the warning lines (unreliable tools) come first in the prompt and have no manifest line
      C.stackedBar(bar, [{ name: "warnings", value: s.warnings || 0 }, { name: "pinned", value: s.pinned || 0 }, { name: "working", value: s.working || 0 },
        { name: "retrieved", value: s.retrieved || 0 }, { name: "free", value: Math.max(0, c.budget - c.tokens) }], c.budget);
      if (state.diffWith && state.diffWith !== seq) { compare.value = String(state.diffWith); await showDiff(state.diffWith, seq); }
    };
    items = await contextList(list, pick, false);
    if (items.length) await pick(state.context && items.some((b) => b.seq === state.context) ? state.context : items[0].seq, true);
    else fill(detail, el("p", { class: "muted", id: "no-builds", text: await noBuilds() }));
  }

  // why a build list is empty: the tenant has no build yet, or this session or filter selects none of its
  // builds ("No context builds yet" over a session without any, while the store held 22, read as a bug)
  async function noBuilds() {
    const all = (await api("contexts" + qs({ limit: 1 }))).total;
    if (!all) return "No context builds yet (Harness.context records one per call).";
    const filtered = BUILD_FILTERS.some((k) => state.filters[k]);
    const where = state.session === NO_SESSION ? "The builds without a session include none"
      : state.session && !filtered ? `Session ${state.session} has no context builds` : "No context build matches this selection";
    return `${where}; the store has ${all} (choose all sessions${filtered ? " or clear the filters" : ""} to see them).`;
  }

  function highlight(text, shortIds, id) {
    const out = el("div", { class: "content output", id: id || null });
    const re = new RegExp(`(${shortIds.join("|") || "^$"})`, "g");
    text.split(re).forEach((part) => out.appendChild(shortIds.includes(part) ? el("mark", { text: part }) : document.createTextNode(part)));
    return out;
  }

  async function viewInfluence(main) {
    const list = el("div", { class: "card list" });
    const detail = el("div", { id: "influence-detail" });
    const reverse = el("div", { id: "influence-reverse" });
    fill(main, el("h2", { text: "Influence" }), filterBar(() => { state.ctxOffset = 0; show("influence"); }, BUILD_FILTERS),
      el("p", { class: "muted", text: "Which memories fed a context build, with their tier and value at that moment, and which ones the output cited. Select a memory for the reverse: every context it entered." }),
      el("div", { class: "split" }, list, el("div", {}, detail, reverse)));
    const pick = async (seq) => {
      state.context = seq;
      list.querySelectorAll("tr.context-row").forEach((r) => r.classList.toggle("selected", Number(r.dataset.seq) === seq));
      const c = await api(`contexts/${seq}`);
      const chart = el("div", { id: "influence-chart" });
      const cited = c.lines.filter((l) => l.cited).map((l) => l.short_id);
      fill(detail, el("div", { class: "card" },
        el("h3", {}, `Build #${c.seq}: “`, bidi(c.query), "”"),
        el("p", { class: "muted", text: c.output ? `${c.output.cited.length} of ${c.lines.length} memories cited` + (c.output.success === null ? "" : c.output.success ? " · task succeeded" : " · task failed") : "no output recorded for this build" }),
        influenceLegend(!!c.output), chart,
        c.output ? [el("h3", { text: "Output" }), highlight(c.output.text, cited)] : null));
      C.influence(chart, c.lines, !!c.output, inspect);
    };
    const items = await contextList(list, pick, true);
    const first = items.find((b) => b.has_output) || items[0];
    if (first) await pick(state.context && items.some((b) => b.seq === state.context) ? state.context : first.seq);
    else fill(detail, el("p", { class: "muted", id: "no-builds", text: await noBuilds() }));
    await renderReverse(reverse);
  }

  // what the influence diagram's colours say: a bar's colour is the memory's tier when the build took it
  // (the label names the prompt section), its length the value then; orange is a citation, a link or a
  // bar's outline (without a legend the orange of a cited link read as the short-term tier's)
  function influenceLegend(hasOutput) {
    const item = (cls, color, text) => el("span", { class: cls, "data-color": color }, el("i", { style: `background:${color}` }), text);
    return el("div", { class: "legend chart-legend", id: "influence-legend" },
      el("span", { class: "muted", text: "bar colour: tier then" }),
      Object.entries(C.TIER_COLORS).map(([tier, color]) => item("legend-tier", color, tier.replace("_", " "))),
      el("span", { class: "muted", text: "· bar length: value then ·" }),
      hasOutput ? [item("legend-cite line", C.CITE_COLORS.cited, "cited by the output (its bar outlined)"),
        item("legend-cite line", C.CITE_COLORS.uncited, "not cited")] : el("span", { class: "muted", text: "no links: no output recorded" }));
  }

  async function renderReverse(box) {
    if (!state.selected) {
      fill(box, el("p", { class: "muted", text: "Select a memory (click one anywhere) to list the contexts it entered." }));
      return;
    }
    const page = await api(`memories/${state.selected}/contexts?limit=100`), rows = page.items;  // newest first
    const shown = page.total > rows.length ? `${page.total}, the newest ${rows.length} shown` : `${page.total}`;
    const name = state.selected.replace(/-/g, "").slice(-8);
    const none = rows.length ? null : el("tr", {}, el("td", { colspan: 7, class: "muted", text: "None yet: no context build has included it." }));
    fill(box, el("div", { class: "card" }, el("h3", { text: `Contexts that memory ${name} entered (${shown})` }),
      el("table", { id: "reverse-table" }, el("tr", {}, ["#", "when", "query", "section", "tier then", "value then", "cited"].map((h) => el("th", { text: h }))),
        rows.map((r) => el("tr", { class: "clickable", onopen: () => { state.context = r.seq; show("influence"); } },
          el("td", { text: r.seq }), el("td", { text: when(r.at) }), el("td", { text: r.query.slice(0, 50) }), el("td", {}, secPill(r.section)),
          el("td", {}, tierPill(r.tier)), el("td", { text: num(r.value, 2) }),
          el("td", { class: r.cited ? "cited-yes" : "cited-no", text: r.cited === null ? "–" : r.cited ? "cited" : "no" }))), none)));
  }

  // the two working-tier hit rates: the live one (Metrics) and the replay's (What-if), defined differently
  const HIT_RATE_LIVE = "Of the memories a tracked recall or a context build needed, the share already in the working tier when needed, like a cache hit rate";
  const HIT_RATE_REPLAY = "Of the memories the recorded outputs cited, the share the replayed prompt held in its pinned or working section (not recalled). Metrics' working-tier hit rate counts every recall and build need by the memory's tier, so the two differ.";

  function metricCard(k, v, hint, id) {
    return el("div", { class: "metric", id: id || null, title: hint || "" }, el("div", { class: "v", text: v }), el("div", { class: "k", text: k }));
  }

  async function viewMetrics(main) {
    const [m, w, manual] = await Promise.all([api("metrics" + qs({ session: realSession() })), api("weights"), api("manual?limit=20")]);
    const tokens = el("div", { id: "tokens-chart" }), latency = el("div", { id: "latency-chart" });
    const tools = el("div", { id: "tools-chart" }), kinds = el("div", { id: "kinds-chart" }), weights = el("div", { id: "weights-chart" });
    fill(main, el("h2", { text: "Metrics" + (realSession() ? ` · ${realSession()}` : " · all sessions") }),
      state.session === NO_SESSION ? el("p", { class: "muted", text: "Memories without a session have no metrics of their own: these are the tenant's." })
        : state.session ? el("p", { class: "muted", text: "Counts, rates and context builds follow the session selector; recall latency, events by kind and tool reliability are the tenant's." }) : null,
      el("div", { class: "cards", id: "metric-cards" },
        metricCard("working-tier hit rate (recalls + builds)", pct(m.working_hit_rate), `${HIT_RATE_LIVE} (${m.needs} needs here). The what-if view's rate counts only the memories the recorded outputs cited, by the section of the replayed prompt they sat in, so the two differ.`, "metric-working-hit"),
        metricCard("recall p50 / p95 ms", `${num(m.retrieval_ms.p50)} / ${num(m.retrieval_ms.p95)}`, `Latency of tracked recalls, query embedding included (${m.retrieval_ms.n} recalls, tenant-wide).`),
        metricCard("context build p95 ms", num(m.context_ms.p95), `95th percentile time to build a context (${m.context_ms.n} builds).`),
        metricCard("eviction regret", pct(m.eviction_regret), `Of the memories archived or compressed (${m.evictions}), the share needed again later (recalled, cited, or pinned by a person): ${m.regretted.length} shown.`),
        metricCard("tokens per build (mean)", num(m.context_tokens.mean), `Mean prompt tokens per context build; p95 ${num(m.context_tokens.p95)}, max ${m.context_tokens.max}.`),
        metricCard("duplicate rate", pct(m.duplicate_rate), "Active memories whose normalised text repeats an earlier active memory."),
        metricCard("junk rate", pct(m.junk_rate), "Active memories with fewer than three words, or never used with a value under 0.15 a day after they were recorded."),
        metricCard("stale rate", pct(m.stale_rate), "Active memories past their expiry, revised by a newer one, or in the working tier untouched for over three half-lives."),
        metricCard("memories (active)", `${m.memories} (${m.active})`, "Memories in this scope, and how many are active (not archived, obsolete or expired)."),
        metricCard("events", m.events, "Events in the tenant's log (every write, move and read that is recorded).")),
      el("div", { class: "card" }, el("h3", { text: "Context tokens per build (dashed: budget)" }), tokens),
      el("div", { class: "card" }, el("h3", { text: "Recall latency, ms (last 300 tracked recalls)" }), latency),
      el("div", { class: "card" }, el("h3", { text: "Per-tool reliability (recent calls; red: unreliable)" }), tools,
        el("table", { id: "tools-table" }, el("tr", {}, ["tool", "calls", "errors", "timeouts", "interrupted", "p50 s", "p95 s", "verdict", "fallback that worked", "last error"].map((h) => el("th", { text: h }))),
          m.tools.map((t) => el("tr", {}, el("td", { text: t.tool }), el("td", { text: t.calls }), el("td", { text: t.errors }),
            el("td", { text: t.timeouts }), el("td", { text: t.interrupted }), el("td", { text: num(t.p50_s, 2) }), el("td", { text: num(t.p95_s, 2) }),
            el("td", { class: t.unreliable ? "cited-yes" : "", text: t.unreliable ? "unreliable" : "ok" }),
            el("td", { text: t.fallback ? `${t.fallback.tool} (${t.fallback.successes}×)` : "–" }),
            el("td", { text: (t.last_error || "").slice(0, 80) }))))),
      el("div", { class: "card" }, el("h3", { text: "Events by kind" }), kinds),
      el("div", { class: "card" }, el("h3", { text: "Scorer weights (learned from manual actions)" }), weights,
        el("h3", { text: "Learning history" }),
        el("table", { id: "learning-table" }, el("tr", {}, ["#", "when", "action", "target", "weight changes"].map((h) => el("th", { text: h }))),
          w.history.slice().reverse().slice(0, 15).map((e) => el("tr", {}, el("td", { text: e.seq }), el("td", { text: when(e.at) }), el("td", { text: e.action }),
            el("td", { text: num(e.target, 2) }), el("td", { text: Object.entries(e.delta || {}).map(([k, v]) => `${k} ${v > 0 ? "+" : ""}${v.toFixed(4)}`).join(", ") }))))),
      el("div", { class: "card" }, el("h3", { text: `Manual actions (${manual.total})` }),
        el("table", { id: "manual-table" }, el("tr", {}, ["#", "when", "action", "by", "memory", "value before → after"].map((h) => el("th", { text: h }))),
          manual.items.map((a) => el("tr", { class: "clickable", onopen: () => inspect(a.memory_id) }, el("td", { text: a.seq }), el("td", { text: when(a.at) }),
            el("td", { text: a.action }), el("td", { text: a.by }), el("td", {}, el("code", { text: (a.memory_id || "").replace(/-/g, "").slice(-8) })),
            el("td", { text: `${num(a.before.value, 2)} → ${num(a.after.value, 2)}` }))))));
    C.lineChart(tokens, m.context_tokens.series.map((s) => ({ y: s.tokens, y2: s.budget, label: `#${s.seq}: ${s.tokens}/${s.budget}` })), { xlabel: "builds, oldest → newest", fmt: (v) => String(Math.round(v)) });
    C.lineChart(latency, m.latency_series.map((v, i) => ({ y: v, label: `recall ${i + 1}: ${v} ms` })), { color: "#2f9e44", xlabel: "recalls, oldest → newest", fmt: (v) => v.toFixed(1) });
    C.bars(tools, m.tools.map((t) => ({ label: t.tool, value: t.error_rate || 0, color: t.unreliable ? "#e03131" : "#1c7ed6",
      note: `${pct(t.error_rate)} errors · ${pct(t.timeout_rate)} timeouts · ${t.calls} calls` })), { max: 1 });
    C.bars(kinds, Object.entries(m.events_by_kind).map(([k, v]) => ({ label: k, value: v })), {});
    const scal = Object.entries(w.weights).filter(([k]) => k !== "base").map(([k, v]) => ({ label: k, value: Math.round(v * 1000) / 1000 }));
    const base = Object.entries(w.weights.base).map(([k, v]) => ({ label: "base: " + k, value: Math.round(v * 1000) / 1000, color: "#7048e8" }));
    C.bars(weights, base.concat(scal), { max: 1 });
  }

  const VIEWS = { sessions: viewSessions, timeline: viewTimeline, heatmap: viewHeatmap, graph: viewGraph,
    contexts: viewContexts, influence: viewInfluence, metrics: viewMetrics };

  // ---- deep links: the fragment holds the view, the session, the selected memory and build, the filters ----
  function writeHash(replace) {
    const p = new URLSearchParams();
    p.set("view", state.view);
    if (state.session) p.set("session", state.session);
    if (state.selected) p.set("memory", state.selected);
    if (state.context) p.set("build", state.context);
    if (state.diffWith) p.set("diff", state.diffWith);
    if (state.traceTask && state.view === "trace") p.set("task", state.traceTask);
    for (const [k, v] of Object.entries(state.filters)) if (v) p.set("f." + k, v);
    if (state.view === "sessions") for (const [k, v] of Object.entries(state.sessFilters)) if (v) p.set("s." + k, v);
    if (state.view === "whatif") for (const [k, v] of Object.entries(state.whatif)) if (v) p.set("wi." + k, v);
    const hash = "#" + p.toString();
    // the address moved to a link the page has not read yet (a click, a pasted link, Back): its hashchange
    // is on its way and says what to show; a render in between must not write the old state over it
    if (writeHash.last !== undefined && location.hash !== writeHash.last) return;
    if (location.hash !== hash) {
      // another view, session or memory is a step Back returns from; a filter, a build or a page is not
      const before = new URLSearchParams(location.hash.slice(1));
      const moved = !replace && writeHash.last !== undefined && ["view", "session", "memory"].some((k) => before.get(k) !== p.get(k));
      if (moved) history.pushState(null, "", hash); else history.replaceState(null, "", hash);
    }
    writeHash.last = hash;
  }

  function readHash(hash) {
    const raw = (hash === undefined ? location.hash : hash).slice(1);
    if (!raw.includes("=")) { state.view = raw || "sessions"; return; }  // an old "#metrics" link
    const p = new URLSearchParams(raw);
    state.view = p.get("view") || "sessions";
    state.session = p.get("session") || "";
    state.selected = p.get("memory") || null;
    state.context = p.get("build") ? Number(p.get("build")) : null;
    state.diffWith = p.get("diff") ? Number(p.get("diff")) : null;
    for (const k of Object.keys(state.filters)) state.filters[k] = p.get("f." + k) || "";
    for (const k of Object.keys(state.sessFilters)) state.sessFilters[k] = p.get("s." + k) || "";
    state.traceTask = p.get("task") || "";
    for (const k of Object.keys(state.whatif)) state.whatif[k] = p.get("wi." + k) || "";
  }

  async function loadRole() {
    try {
      const headers = { Accept: "application/json" };
      if (state.key) headers.Authorization = "Bearer " + state.key;
      const res = await fetch("../v1/whoami", { headers });
      state.role = res.ok ? (await res.json()).role : null;
    } catch (e) {
      state.role = null;
    }
    document.body.dataset.role = state.role || "none";
  }

  // One render at a time and the latest request wins, so a live refresh and a click never interleave
  // their output in the page.
  let renders = Promise.resolve(), renderTicket = 0;

  function show(view) {
    state.view = VIEWS[view] ? view : "sessions";
    writeHash();
    document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("active", a.dataset.view === state.view));
    const ticket = ++renderTicket;
    renders = renders.then(() => (ticket === renderTicket ? render(state.view) : undefined));
    return renders;
  }

  async function render(view) {
    const main = $("#view");
    main.dataset.view = view;
    main.dataset.ready = "0";
    if (!main.firstChild) fill(main, el("p", { class: "muted", text: "loading…" }));
    try {
      await VIEWS[view](main);
    } catch (e) {
      fill(main, el("div", { class: "card" }, el("b", { text: "Could not load this view: " }), String(e.message || e)));
    }
    main.dataset.ready = "1";
  }

  // The value as the scorer computes it: (base + signals + cost) × recency multiplier + the usage terms,
  // clamped to [0, 1] (pinned: 1). Each row is one term; the multiplier row is drawn as a multiplier.
  function formula(f) {
    const bar = (v, scale) => el("div", {}, el("div", { class: "bar", style: `width:${Math.min(100, Math.abs(v) * 100 * (scale || 1))}%;${v < 0 ? "background:#e03131" : ""}` }));
    const row = (k, v, sign, hint) => [el("div", { text: k, title: hint || "" }), bar(v), el("div", { text: `${sign}${num(v, 3)}` })];
    const added = Object.entries(f.added);
    return el("div", { id: "value-formula" },
      el("div", { class: "breakdown" },
        row("base", f.base, "", "what this kind of memory is worth to start with"),
        row("signals", f.signals, "+ ", "content signals: errors, conclusions, numbers, code, entities"),
        row("cost", f.cost, "+ ", "what producing it cost (time, tokens, money)"),
        [el("div", { class: "sum", text: "= prior" }), bar(f.prior), el("div", { class: "sum", text: num(f.prior, 3) })],
        [el("div", { class: "mult", text: "× recency", title: `multiplier = floor ${num(f.recency_floor, 2)} + (1 − floor) × recency ${num(f.recency, 3)}` }),
          el("div", { class: "mult-bar" }, el("div", { class: "bar mult", style: `width:${100 * f.multiplier}%` })), el("div", { class: "mult", text: `× ${num(f.multiplier, 3)}` })],
        [el("div", { class: "sum", text: "= decayed" }), bar(f.decayed), el("div", { class: "sum", text: num(f.decayed, 3) })],
        added.map(([k, v]) => row(k, v, v < 0 ? "" : "+ ")),
        [el("div", { class: "sum", text: f.pinned ? "value (pinned)" : "= value" }), bar(f.value), el("div", { class: "sum", id: "formula-value", text: num(f.value, 3) })]),
      el("p", { class: "muted", text: f.pinned ? "pinned: worth 1 whatever the terms say" : `(${num(f.prior, 3)} × ${num(f.multiplier, 3)}) + ${num(f.raw - f.decayed, 3)} = ${num(f.raw, 3)}` + (f.raw !== f.value ? ` → clamped to ${num(f.value, 3)}` : "") }));
  }

  async function renderRevisions(box, id) {
    if (state.selected !== id) return;  // the inspector moved on (or the memory was forgotten)
    const r = await api(`memories/${id}/revisions`).catch(() => null);
    if (!r || r.revisions.length < 2) { fill(box); return; }
    fill(box, el("h3", { text: `Revisions (${r.revisions.length})` }),
      // each revision's diff on a row of its own, the panel's full width (a third column left it ~75 px)
      el("table", { id: "revisions-table" }, r.revisions.slice().reverse().flatMap((v) => [
        el("tr", { class: "clickable", onopen: () => inspect(v.id) },
          el("td", {}, el("code", { text: v.short_id })), el("td", { text: `${v.status} · ${when(v.created_at)}` })),
        el("tr", { class: "revision-diff" }, el("td", { colspan: 2 }, v.diff.length ? el("pre", { class: "diff" }, v.diff.slice(2).map((line) =>
          el("div", { class: line.startsWith("+") ? "diff-add" : line.startsWith("-") ? "diff-del" : "muted", text: line }))) : el("span", { class: "muted", text: "first version" })))])));
  }

  // ---- inspector ----------------------------------------------------------------------------------
  // the toast after a manual action: what the server answered it did (the value and tier after it)
  function acted(label, r) {
    return `${label}: value ${num(r.before.value, 2)} → ${num(r.after.value, 2)}, tier ${r.after.tier}` + learnedNote(r);
  }

  const learnedNote = (r) => { const n = Object.keys(r.learned || {}).length; return n ? ` · ${n} scorer weights adjusted` : ""; };

  // Set value cannot write a value: the server sets the feedback votes whose value comes nearest the one
  // asked, and votes move a value in steps and only so far from what the scorer's other terms give. The
  // toast says the value reached, and the one asked where they differ ("value set" alone claimed it was)
  function valueSet(asked, r) {
    const reached = r.after.value, missed = Math.abs(reached - asked) >= 0.005;
    return `value set to ${num(reached, 2)}` + (missed ? ` (asked ${num(asked, 2)}: the nearest the scorer's feedback votes reach;`
      + " they move a value in steps and only so far)" : "") + ` · was ${num(r.before.value, 2)}, tier ${r.after.tier}` + learnedNote(r);
  }

  // closed by its ✕, by Escape, when its memory is forgotten or the key is refused: out of the address
  // too, so a reload does not open it again
  function closeInspector() {
    inspector.ticket++;  // an opening still reading must not fill the closed panel
    const box = $("#inspector");
    box.hidden = true;
    fill(box);
    state.selected = null;
    document.querySelectorAll("[data-id].selected").forEach((n) => n.classList.remove("selected"));
    writeHash();
  }

  // The latest opening owns the panel: a live refresh that began while the edited memory was selected
  // asks for that memory, and under load its answer came after the new revision's panel was drawn and
  // replaced it (the old memory, ready, without its revisions: the selection had moved on).
  const inspector = { ticket: 0 };

  async function inspect(id) {
    if (!id) return;
    const ticket = ++inspector.ticket;
    const current = () => ticket === inspector.ticket;
    state.selected = id;
    writeHash();
    document.querySelectorAll("[data-id]").forEach((n) => n.classList && n.classList.toggle("selected", n.dataset.id === id));
    const box = $("#inspector");
    // a new opening (not a live refresh or an action's redraw of the memory shown) on a phone, where the
    // inspector sits under the lists: brought into view (a tapped row opened it ~930 px below the screen)
    const opening = box.hidden || box.dataset.memory !== id;
    box.hidden = false;
    box.dataset.ready = "0";
    box.dataset.memory = id;
    if (opening && isPhone()) box.scrollIntoView({ block: "start" });
    let d;
    try {
      d = await api(`memories/${id}`);
    } catch (e) {
      if (!current()) return;
      fill(box, el("p", { text: String(e.message || e) }));
      box.dataset.ready = "1";
      return;
    }
    if (!current()) return;  // a newer opening (another memory, or this one again) draws the panel
    const m = d.memory, x = d.explain;
    const spark = el("div", { id: "value-spark" });
    // the edit box, the value and the note survive a live re-render: what was typed so far, until it is sent
    const draft = state.draft && state.draft.id === id ? state.draft : (state.draft = { id, open: false, text: m.content });
    const value = el("input", { type: "number", min: 0, max: 1, step: 0.05, id: "value-input", oninput: (e) => { draft.value = e.target.value; } });
    value.value = draft.value ?? Number(m.value).toFixed(2);
    const note = el("input", { type: "text", placeholder: "note…", id: "note-input", oninput: (e) => { draft.note = e.target.value; } });
    note.value = draft.note ?? "";
    // ``label``: what the action did, or a function of the server's answer that says it (Set value)
    const act = async (path, body, label) => {
      try {
        const r = await post(`memories/${id}/${path}`, body);
        toast(typeof label === "function" ? label(r) : acted(label, r));
        await inspect(id);
        await show(state.view);
      } catch (e) {
        toast(String(e.message || e), true);
      }
    };
    const editor = el("textarea", { id: "edit-content", rows: 4, oninput: (e) => { draft.text = e.target.value; } });
    editor.value = draft.text;
    const chosen = draft.tier || m.tier;
    const tier = el("select", { id: "tier-select", onchange: (e) => { draft.tier = e.target.value; } },
      ["working", "short_term", "long_term", "archive"].map((t) => el("option", { value: t, selected: t === chosen || null, text: t.replace("_", " ") })));
    const change = async (label, run) => {
      try {
        const r = await run();
        toast(label);
        await show(state.view);
        await inspect(r && r.id ? r.id : id);
      } catch (e) {
        toast(String(e.message || e), true);
      }
    };
    const history = el("div", { id: "revisions" });
    fill(box, 
      el("div", { class: "toolbar" }, el("h2", { text: `Memory ${d.row.short_id}` }), el("span", { class: "spacer" }),
        el("button", { id: "inspector-close", onclick: closeInspector, text: "✕", title: "close (Esc)" })),
      el("div", { class: "kv", id: "inspector-fields" },
        el("div", { text: "kind / state" }), el("div", { text: `${m.kind}${m.state ? " / " + m.state : ""}` }),
        el("div", { text: "tier" }), el("div", {}, tierPill(m.tier), m.pinned ? [" ", el("span", { id: "pinned-flag", class: "pill pinned", text: "pinned" })] : null),
        // the value under the scorer's current weights, as the breakdown below makes it; the stored one dates
        // from the memory's last write (the lists show it) and differs once the scorer has learned since
        el("div", { text: "value" }), el("div", {}, el("span", { id: "value-now", text: num(d.formula.value, 3) }),
          Math.abs(d.formula.value - m.value) > 0.0005 ? el("span", { class: "muted", id: "value-stored", text: ` (stored ${num(m.value, 3)})`,
            title: "the value written at the memory's last change, which the lists show; the scorer's weights moved since" }) : null),
        el("div", { text: "status" }), el("div", { text: m.status }),
        el("div", { text: "session" }), el("div", { text: m.session_id || "–" }),
        el("div", { text: "agent / task" }), el("div", { text: `${m.agent_id || "–"} / ${m.task_id || "–"}` }),
        el("div", { text: "tool" }), el("div", { text: m.tool_name || "–" }),
        el("div", { text: "created" }), el("div", { text: when(m.created_at) }),
        el("div", { text: "usage" }), el("div", { text: `${m.access_count} accesses, ${m.usage.injected} contexts, ${m.usage.cited} citations, votes ${m.usage.feedback}` }),
        el("div", { text: "tokens" }), el("div", { text: m.token_count }),
        el("div", { text: "tags" }), el("div", { text: m.tags.join(", ") || "–" }),
        el("div", { text: "id" }), el("div", {}, el("code", { text: m.id }))),
      canWrite() ? [
        // an obsolete or expired memory is history: it can be annotated or forgotten, not pinned or moved
        m.status === "active" ? el("div", { class: "actions", id: "actions" },
          m.pinned ? el("button", { id: "unpin-button", onclick: () => act("unpin", {}, "unpinned"), text: "Unpin" })
            : el("button", { id: "pin-button", class: "primary", onclick: () => act("pin", {}, "pinned"), text: "Pin" }),
          el("button", { id: "archive-button", onclick: () => act("archive", {}, "archived"), text: "Archive" }),
          value, el("button", { id: "value-button", onclick: () => {
            const given = value.value.trim();  // Number("") is 0: an empty box set the value to 0
            if (given === "" || !Number.isFinite(Number(given))) { toast("value: enter a number from 0 to 1", true); return; }
            draft.value = undefined;  // sent: the box shows the stored value again
            act("value", { value: Number(given) }, (r) => valueSet(Number(given), r));
          }, text: "Set value" })) : null,
        el("div", { class: "actions" }, m.status === "active" ? [tier,
          el("button", { id: "tier-button", onclick: () => { draft.tier = null; act("tier", { tier: tier.value }, `moved to ${tier.value}`); }, text: m.tier === "archive" ? "Un-archive to tier" : "Move to tier" })] : null,
          el("button", { id: "forget-button", class: "danger", text: "Forget", onclick: () => {
            if (!window.confirm(`Forget memory ${d.row.short_id} for good?`)) return;
            closeInspector();  // first: a live refresh meanwhile must not ask for it again
            post(`memories/${id}/forget`, { expected_version: m.version }).then(() => {
              toast(`forgot ${d.row.short_id}`);
              return show(state.view);
            }).catch((e) => toast(String(e.message || e), true));
          } })),
        el("div", { class: "actions" }, note, el("button", { id: "annotate-button", onclick: () => { if (note.value.trim()) { draft.note = undefined; act("annotate", { text: note.value }, "annotated"); } }, text: "Annotate" }))] : null,
      el("div", { class: "actions" },
        el("button", { onclick: () => { state.focus = id; show("graph"); }, text: "Graph around it" }),
        el("button", { onclick: () => show("influence"), text: "Influence" }),
        m.session_id ? el("button", { onclick: () => { setSession(m.session_id); show("trace"); }, text: "Trace its session" }) : null),
      el("h3", { text: "Content" }), el("div", { class: "content", id: "inspector-content", text: m.content }),
      canWrite() && m.status === "active" ? [el("details", { id: "edit-box", open: draft.open || null, ontoggle: (e) => { draft.open = e.target.open; } },
        // the click, not only the toggle event (a task later), marks it open: a live re-render landing
        // in between rebuilt the box closed under a user who had just opened it
        el("summary", { text: "Edit (saved as a new revision)", onclick: (e) => { draft.open = !e.currentTarget.parentElement.open; } }), editor,
        el("div", { class: "actions" }, el("button", { id: "revise-button", class: "primary", text: "Save revision", onclick: () =>
          change("saved as a new revision", () => post(`memories/${id}/revise`, { content: editor.value, expected_version: m.version }).then((r) => { state.draft = null; return r; })) })))] : null,
      history,
      (m.metadata.annotations || []).length ? [el("h3", { text: "Annotations" }),
        el("ul", {}, m.metadata.annotations.map((a) => el("li", { text: `${when(a.at)} ${a.by}: ${a.text}` })))] : null,
      el("h3", { text: "Why this value" }), formula(d.formula),
      el("h3", { text: "Value over time" }), spark,
      el("h3", { text: `Contexts it entered (${d.contexts.length})` }),
      el("table", {}, d.contexts.slice(-8).reverse().map((c) => el("tr", { class: "clickable", onopen: () => { state.context = c.seq; show("contexts"); } },
        el("td", { text: `#${c.seq}` }), el("td", {}, secPill(c.section)), el("td", { text: num(c.value, 2) }),
        el("td", { class: c.cited ? "cited-yes" : "cited-no", text: c.cited === null ? "" : c.cited ? "cited" : "" }), el("td", { text: c.query.slice(0, 40) })))),
      el("h3", { text: "Events" }),
      el("table", { id: "inspector-events" }, d.events.slice(-12).reverse().map((e) => el("tr", {}, el("td", { text: e.seq }), el("td", { text: e.kind }),
        el("td", { text: JSON.stringify(e.data).slice(0, 90) })))));
    C.sparkline(spark, d.values.map((v) => v.value).concat([m.value]));
    // ready once the revisions are in too: a live refresh rebuilds the inspector, and a table filled only
    // after "ready" could be thrown away by the next rebuild before anyone saw it
    await renderRevisions(history, id);
    if (!current()) return;  // the newer opening says when the panel is ready
    box.dataset.ready = "1";
    // the influence view lists this memory's contexts, once that view is on the page (while it is still
    // loading, its own render lists them)
    const reverse = $("#influence-reverse");
    if (state.view === "influence" && reverse) renderReverse(reverse).catch((e) => toast(String(e.message || e), true));
  }

  // ---- chrome -------------------------------------------------------------------------------------
  function setSession(sid) {
    if (sid !== state.session) { state.context = null; state.diffWith = null; state.traceTask = ""; }
    state.session = sid;
    state.memPage.offset = 0; state.heat.offset = 0; state.ctxOffset = 0; state.focus = null;
    $("#session").value = sid;
    writeHash();
  }

  // the overview (its seq starts the live stream), or null when it could not be read
  async function loadChrome() {
    try {
      const o = await api("overview");
      $("#tenant").textContent = `tenant ${o.tenant}`;
      $("#status").textContent = `${o.memories} memories · ${o.contexts} context builds · ${o.events} events`;
      $("#status").title = $("#status").textContent;
      const s = await api("sessions?limit=500");
      const sel = $("#session");
      fill(sel, el("option", { value: "", text: "all sessions" }),
        s.items.map((x) => el("option", { value: x.session_id,
          text: x.session_id === NO_SESSION ? `no session (${x.memories})` : `${x.session_id} (${x.memories})` })));
      sel.value = state.session;
      return o;
    } catch (e) {
      $("#status").textContent = String(e.message || e);
      return null;
    }
  }

  // ---- live updates -------------------------------------------------------------------------------
  // The tenant's event stream (server-sent events, /v1/events/stream) read with fetch: EventSource cannot
  // send the Authorization header, and the key must not travel in a URL. Each event asks for a refresh of
  // what is on screen: at most one a second, put off while a form field has the focus or the tab is hidden.
  const live = { seq: 0, abort: null, timer: null, last: 0, dirty: false };
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function setLive(on, why) {
    const node = $("#live");
    node.dataset.state = on ? "on" : "off";
    node.textContent = on ? "● live" : "○ offline";
    node.title = on ? "live: following the event log" : `live updates: ${why}`;
  }

  function follow(seq) {
    if (live.abort) live.abort.abort();
    const ctrl = new AbortController();
    live.abort = ctrl;
    live.seq = seq;
    (async () => {
      while (!ctrl.signal.aborted) {
        try {
          await readStream(ctrl.signal);
        } catch (e) {
          if (ctrl.signal.aborted) return;
          if (e instanceof ApiError) { setLive(false, e.message); return; }  // a new key restarts it
        }
        setLive(false, "reconnecting");
        await sleep(2000);  // the server ended the stream (restart, max duration) or the network failed
      }
    })();
  }

  async function readStream(signal) {
    const headers = { Accept: "text/event-stream", Authorization: "Bearer " + state.key };
    const res = await fetch("../v1/events/stream" + qs({ after_seq: live.seq }), { headers, signal, cache: "no-store" });
    if (res.status === 401 || res.status === 403) throw new ApiError("the key was refused");
    if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
    setLive(true);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        onMessage(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  }

  function onMessage(block) {  // "id: <seq>" + "data: <event>" lines, or ": comment" lines (heartbeats)
    let isEvent = false;
    for (const line of block.split("\n")) {
      if (line.startsWith("id: ")) live.seq = Number(line.slice(4));
      else if (line.startsWith("data: ")) isEvent = true;
    }
    if (isEvent) scheduleRefresh();
  }

  function scheduleRefresh() {
    live.dirty = true;
    if (!live.timer) live.timer = setTimeout(refreshLive, Math.max(0, live.last + 1000 - Date.now()));
  }

  async function refreshLive() {
    const focused = document.activeElement && ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (focused || document.hidden) {
      live.timer = setTimeout(refreshLive, 1000);
      return;
    }
    live.dirty = false;
    live.last = Date.now();
    try {
      const inspecting = state.selected && !$("#inspector").hidden;
      await Promise.all([loadChrome(), show(state.view), inspecting ? inspect(state.selected) : null]);
    } catch (e) {
      toast(String(e.message || e), true);
    } finally {
      live.timer = null;
      if (live.dirty) scheduleRefresh();  // events that came during this refresh
    }
  }

  async function connect() {
    await loadRole();
    const o = await loadChrome();
    if (o) follow(o.seq);
    else setLive(false, "no usable API key");
  }

  async function start() {
    if (location.hash.startsWith("#key=")) {  // a link with the key in its fragment (never sent to servers)
      state.key = decodeURIComponent(location.hash.slice(5));
      // saved for the browser only when none is: a link someone sent (another tenant's key) replaced the
      // saved key without a word, and every later visit wrote into that tenant; it holds for this tab
      if (!localStorage.getItem("clawvm_key")) localStorage.setItem("clawvm_key", state.key);
      else sessionStorage.setItem("clawvm_key", state.key);
      history.replaceState(null, "", "#view=sessions");
    }
    readHash();
    $("#session").addEventListener("change", (e) => { setSession(e.target.value); show(state.view); });
    $("#refresh").addEventListener("click", () => { loadChrome(); show(state.view); if (state.selected) inspect(state.selected); });
    document.addEventListener("keydown", (e) => {  // Escape closes the inspector (not while typing)
      const typing = e.target.closest && e.target.closest("input, textarea, select");
      if (e.key === "Escape" && !typing && !$("#inspector").hidden) closeInspector();
    });
    $("#key-button").addEventListener("click", () => { $("#keybar").hidden = !$("#keybar").hidden; });
    $("#key").value = state.key;
    $("#keybar").addEventListener("submit", (e) => {
      e.preventDefault();
      state.key = $("#key").value.trim();
      localStorage.setItem("clawvm_key", state.key);  // typed in: the browser's key, this tab's too
      sessionStorage.removeItem("clawvm_key");
      $("#keybar").hidden = true;
      connect().then(() => show(state.view));
    });
    document.querySelectorAll("#tabs a").forEach((a) => a.addEventListener("click", (e) => {
      e.preventDefault();
      show(a.dataset.view);
    }));
    // a pasted deep link, or Back/Forward (popstate for the entries the page pushed, then hashchange; the
    // first one shows it): the page shows what the address says, the inspector closed where it has no memory
    const navigate = (target) => {
      if (target === writeHash.last) return;  // the page shows it already
      readHash(target);
      if (!VIEWS[state.view]) state.view = "sessions";
      // read: the address, as the page writes it, in place of the one navigated to (an old "#metrics" link,
      // a view that no longer exists): a step of its own there would bring Back here again, and again
      writeHash.last = target;
      writeHash(true);
      state.memPage.offset = 0;
      $("#session").value = state.session;
      show(state.view);
      if (state.selected) inspect(state.selected);
      else if (!$("#inspector").hidden) closeInspector();
    };
    // the address navigated to, not location.hash: a later navigation may have moved it on already
    window.addEventListener("hashchange", (e) => navigate(new URL(e.newURL).hash));
    window.addEventListener("popstate", () => navigate(location.hash));
    const selected = state.selected;
    await connect();
    $("#session").value = state.session;
    await show(state.view);
    if (selected) await inspect(selected);
  }

  const ML = { state, realSession, bidi, show, inspect, api, post, qs, el, fill, toast, pct, num, when, tierPill, secPill, pager, canWrite,
    setSession, writeHash, highlight, metricCard, filterBar, filterParams, download, saveText, toCsv, toJsonl, exportButtons, clipCell,
    HIT_RATE_REPLAY, Charts: C };
  Object.assign(VIEWS, window.MemLensViews ? window.MemLensViews(ML) : {});
  window.MemLens = Object.assign(ML, { live });
  start();
})();
