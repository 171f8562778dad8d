// MemLens debugging views: a run's trace, the teams face, and the what-if replay. Loaded before app.js,
// which calls window.MemLensViews(helpers) and adds the views it returns to its tabs.
"use strict";

window.MemLensViews = function (ML) {
  const { state, api, post, qs, el, fill, toast, num, pct, when, tierPill, canWrite, filterBar, filterParams, exportButtons } = ML;
  const TRACE_FILTERS = ["q", "kind", "agent", "tool", "tag", "tier", "status", "since", "until"];
  const TEAM_FILTERS = ["q", "kind", "agent", "tag", "since", "until"];
  const BUILDS_PAGE = 15;
  // plain glyphs (a headless or minimal system has no emoji font)
  const ICONS = { user_input: "»", llm_thought: "◆", tool_call: "▸", tool_result: "↳", decision: "✓", error: "✗",
    observation: "○", knowledge: "■", summary: "Σ", note: "·", agent_state: "◇", context: "≡", output: "←" };

  const secs = (s) => (s === null || s === undefined ? "" : s < 1 ? `${num(s * 1000, 0)} ms` : `${num(s, 2)} s`);
  const shortOf = (id) => id.replace(/-/g, "").slice(-8);

  function noSession(main, what) {
    fill(main, el("h2", { text: what }), el("div", { class: "card" },
      el("p", { text: "Pick a session in the selector above (or click one on the Sessions tab)." })));
  }

  // ---- run trace ------------------------------------------------------------------------------------------
  async function viewTrace(main) {
    if (!ML.realSession()) return noSession(main, "Run trace");
    const task = state.traceTask || "";
    const t = await api("trace" + qs(Object.assign(filterParams(), { task, limit: 200 })));
    const tasks = el("select", { id: "trace-task", onchange: (e) => { state.traceTask = e.target.value; ML.show("trace"); } },
      el("option", { value: "", text: "all tasks" }), t.tasks.map((x) => el("option", { value: x, selected: x === task || null, text: x })));
    const tot = t.totals;
    const exportAs = (fmt) => {
      const rows = flatten(t.steps, 0);
      const name = `memlens-trace-${t.session}${t.task ? "-" + t.task : ""}.${fmt}`;
      if (fmt === "csv") ML.saveText(ML.toCsv(rows, TRACE_COLUMNS), name, "text/csv");
      else ML.saveText(ML.toJsonl(rows), name, "application/x-ndjson");
    };
    fill(main,
      el("h2", { text: `Run trace · ${t.session}` + (t.task ? ` · task ${t.task}` : "") }),
      filterBar(() => ML.show("trace"), TRACE_FILTERS, null, "trace-filters"),
      el("div", { class: "toolbar" }, tasks,
        el("button", { id: "trace-expand", text: "expand all", onclick: () => main.querySelectorAll("details").forEach((d) => { d.open = true; }) }),
        el("button", { text: "collapse all", onclick: () => main.querySelectorAll("details").forEach((d) => { d.open = false; }) }),
        el("span", { class: "muted", id: "trace-totals", text: `${tot.memories} memories · ${tot.contexts} context builds (${tot.context_tokens} tokens) · ` +
          `${tot.errors} errors · tools ${secs(tot.tool_seconds) || "–"} · LLM tokens ${tot.llm_tokens}` + (tot.money ? ` · cost ${num(tot.money, 4)}` : "") }),
        el("span", { class: "spacer" }), exportButtons("trace", exportAs, "the steps of this trace, in order (children after their parent, with depth)")),
      el("div", { class: "card trace", id: "trace-tree" }, t.steps.length ? t.steps.map(step) : el("p", { class: "muted", text: "No step matches these filters." })),
      t.total > t.steps.length ? el("p", { class: "muted", text: `first ${t.steps.length} of ${t.total} steps` }) : null);
  }

  const TRACE_COLUMNS = ["depth", "type", "at", "kind", "state", "tool", "id", "seq", "latency_s", "tokens", "money", "query", "preview"];

  // the tree as rows, depth first (a parent before its children), each with its depth
  function flatten(steps, depth) {
    return steps.flatMap((s) => {
      const { children, lines, ...rest } = s;
      return [Object.assign({ depth }, rest, lines ? { lines } : {}), ...flatten(children || [], depth + 1)];
    });
  }

  function step(s) {
    const kind = s.type === "memory" ? s.kind : s.type;
    const facts = [];
    if (s.latency_s) facts.push(secs(s.latency_s));
    if (s.type === "context") facts.push(`${s.tokens}/${s.budget} tokens`, `${s.lines.length} lines` + (s.cited === null ? "" : `, ${s.cited} cited`));
    else if (s.tokens) facts.push(`${s.tokens} tokens`);
    if (s.money) facts.push(`cost ${num(s.money, 4)}`);
    const head = el("summary", { class: `step step-${kind}` + (s.state === "error" ? " step-error" : "") },
      el("span", { class: "step-icon", text: ICONS[kind] || "•" }),
      el("span", { class: "step-kind", text: kind.replace("_", " ") + (s.tool ? ` ${s.tool}` : "") + (s.state && s.state !== "success" ? ` (${s.state})` : "") }),
      s.id ? el("a", { class: "memlink", href: "#", "data-id": s.id, text: s.short_id, onclick: (e) => { e.preventDefault(); ML.inspect(s.id); } }) : null,
      s.type === "context" ? el("a", { class: "buildlink", href: "#", text: `build #${s.seq}`, onclick: (e) => { e.preventDefault(); state.context = s.seq; ML.show("contexts"); } }) : null,
      el("span", { class: "step-text", text: s.type === "context" ? `“${s.query}”` : s.preview || "" }),
      el("span", { class: "step-facts muted", text: facts.join(" · ") }),
      el("span", { class: "muted step-time", text: when(s.at).slice(11) }));
    const kids = s.children || [];
    const lines = s.type === "context" ? el("div", { class: "step-lines muted" }, "lines: ",
      s.lines.map((id) => el("a", { class: "memlink", href: "#", "data-id": id, text: shortOf(id) + " ", onclick: (e) => { e.preventDefault(); ML.inspect(id); } }))) : null;
    return el("details", { class: "trace-step", open: kids.length ? true : null }, head, lines, kids.length ? el("div", { class: "step-children" }, kids.map(step)) : null);
  }

  // ---- teams ----------------------------------------------------------------------------------------------
  async function viewTeams(main) {
    const t = await api("teams" + qs(Object.assign(filterParams(), { session: "" })));
    const review = async (id, verdict) => {
      try {
        await post(`review/${id}/${verdict}`, {});
        toast(`${verdict === "approve" ? "approved" : "rejected"} ${shortOf(id)}`);
        await ML.show("teams");
      } catch (e) { toast(String(e.message || e), true); }
    };
    const keep = async (conflict, side) => {
      try {
        await post(`conflicts/${conflict}/keep`, { keep: side });
        toast(`kept ${shortOf(side)}, the other side rejected`);
        await ML.show("teams");
      } catch (e) { toast(String(e.message || e), true); }
    };
    const buttons = (m) => (canWrite() ? el("td", {},
      el("button", { class: "approve-button", "data-id": m.id, text: "Approve", onclick: () => review(m.id, "approve") }), " ",
      el("button", { class: "reject-button", "data-id": m.id, text: "Reject", onclick: () => review(m.id, "reject") })) : null);
    const memCell = (m) => el("td", {}, el("a", { href: "#", class: "memlink", "data-id": m.id, text: m.short_id, onclick: (e) => { e.preventDefault(); ML.inspect(m.id); } }));
    const rate = (m) => (m.adoption_rate === null ? "–" : `${pct(m.adoption_rate)} (${m.adopted}/${m.adopted + m.rejected})`);
    const byTeam = {};
    t.grants.forEach((g) => { (byTeam[g.team_id] = byTeam[g.team_id] || []).push(g); });
    fill(main, el("h2", { text: "Teams" }), filterBar(() => ML.show("teams"), TEAM_FILTERS, null, "teams-filters"),
      el("div", { class: "card" }, el("h3", { text: "Scopes and grants" }),
        Object.keys(byTeam).length ? el("table", { id: "grants-table" }, el("tr", {}, ["team", "agent", "read", "write"].map((h) => el("th", { text: h }))),
          Object.entries(byTeam).map(([team, gs]) => gs.map((g) => el("tr", {}, el("td", { text: team }), el("td", { text: g.agent_id }),
            el("td", { text: g.read ? "yes" : "–" }), el("td", { text: g.write ? "yes" : "–" })))))
          : el("p", { class: "muted", text: "No team grants (Harness.grant gives an agent read/write on a team's shared memories)." })),
      el("div", { class: "card" }, el("h3", { text: `Review queue (${t.review.length})` }),
        t.review.length ? el("table", { id: "review-table" }, el("tr", {}, ["memory", "kind", "team", "agent", "confidence", "state", "content", ""].map((h) => el("th", { text: h }))),
          t.review.map((m) => el("tr", {}, memCell(m), el("td", { text: m.kind }), el("td", { text: m.team_id || "–" }), el("td", { text: m.agent_id || "–" }),
            el("td", { text: num(m.confidence, 2) }), el("td", { text: m.review || "pending" }), el("td", { text: m.preview }), buttons(m))))
          : el("p", { class: "muted", text: "Nothing waits for review." })),
      el("div", { class: "card" }, el("h3", { text: `Flagged conflicts (${t.conflicts.length})` }),
        t.conflicts.length ? t.conflicts.map((c) => el("div", { class: "conflict", "data-id": c.id },
          el("p", {}, el("b", { text: "Conflict " }), el("code", { text: c.short_id }), " ", ML.bidi(c.preview)),
          el("div", { class: "sides" }, c.sides.map((m) => el("div", { class: "side card" },
            el("div", {}, el("code", { text: m.short_id }), ` ${m.kind} · ${m.agent_id || "?"} · confidence ${num(m.confidence, 2)}`),
            el("p", { text: m.preview }),
            canWrite() ? el("button", { class: "keep-button", "data-id": m.id, text: "Keep this side", title: "keep this side (approved), reject the other", onclick: () => keep(c.id, m.id) }) : null))),
          canWrite() ? el("div", { class: "actions" }, el("button", { class: "not-conflict-button", "data-id": c.id, text: "Not a conflict", title: "close the conflict, keep both sides", onclick: () => review(c.id, "reject") })) : null))
          : el("p", { class: "muted", text: "No open conflicts." })),
      el("div", { class: "card" }, el("h3", { text: "Team knowledge: what guidance draws on" }),
        el("table", { id: "knowledge-table" }, el("tr", {}, ["memory", "kind", "team", "sources (tasks)", "adoption", "confidence", "content"].map((h) => el("th", { text: h }))),
          t.knowledge.map((m) => el("tr", {}, memCell(m), el("td", { text: m.kind }), el("td", { text: m.team_id }),
            el("td", { text: m.source_tasks.join(", ") || "–" }), el("td", { class: "adoption", text: rate(m) }),
            el("td", { text: num(m.confidence, 2) }), el("td", { text: m.preview }))))),
      el("div", { class: "card" }, el("h3", { text: `Guidance blocks (newest ${t.guidance.length})` }),
        t.guidance.length ? t.guidance.map((g) => el("details", { class: "guidance" },
          el("summary", { text: `#${g.seq} ${g.agent_id}: “${g.task}” · ${g.tokens}/${g.budget} tokens · ${g.items.length} lines` }),
          el("table", { class: "guidance-items" }, el("tr", {}, ["section", "line", "sources", "adoption"].map((h) => el("th", { text: h }))),
            g.items.map((i) => el("tr", { class: "clickable", onopen: () => ML.inspect(i.id) }, el("td", { text: i.section }), el("td", { text: i.line }),
              el("td", { class: "sources", text: (i.source_tasks || []).join(", ") || "–" }),
              el("td", { class: "adoption", title: "adopted / (adopted + rejected) by the agents that got this line", text: i.adoption_rate === null ? "–" : pct(i.adoption_rate) }))))))
          : el("p", { class: "muted", text: "No guidance built yet (Harness.guidance)." })));
  }

  // ---- what-if replay -------------------------------------------------------------------------------------
  // The parameters live in state.whatif and in the URL (wi.*), so a link replays the same comparison.
  async function viewWhatIf(main) {
    if (!ML.realSession()) return noSession(main, "What-if replay");
    const w = state.whatif;
    const input = (k, placeholder, size) => el("input", { id: `whatif-${k}`, placeholder, size: size || 8, value: w[k], onchange: (e) => { w[k] = e.target.value.trim(); ML.writeHash(); } });
    const result = el("div", { id: "whatif-result" });
    const run = async () => {
      ML.writeHash();
      fill(result, el("p", { class: "muted", text: "replaying the session offline…" }));
      try {
        const r = await api("whatif" + qs(Object.assign({ session: state.session }, w)));
        state.whatifView = { q: "", dropped: false, offset: 0 };
        renderReport(result, r);
      } catch (e) { fill(result, el("div", { class: "card" }, String(e.message || e))); }
    };
    fill(main, el("h2", { text: `What-if replay · ${state.session}` }),
      el("p", { class: "muted", text: "Replays this session's event log offline through the real pager and context builder, under the current policy (A) and a changed one (B). Nothing is written to the store." }),
      el("div", { class: "toolbar" }, el("label", {}, "context budget ", input("budget", "recorded")),
        el("label", {}, "working items ", input("working_items", "current")), el("label", {}, "working tokens ", input("working_tokens", "current")),
        el("label", {}, "weights ", input("weights", "cite_weight=0.3,…", 22)),
        // a replay re-records every memory of the tenant up to the session's last build; a big tenant is
        // refused by the server, and this replays the session's own memories instead
        el("label", { title: "replay only this session's memories (the server refuses a tenant past its what-if limit)" },
          el("input", { type: "checkbox", id: "whatif-reach", checked: w.reach === "session" || null, onchange: (e) => { w.reach = e.target.checked ? "session" : ""; ML.writeHash(); } }),
          " this session's memories only"),
        el("button", { id: "whatif-run", class: "primary", text: "Replay", onclick: run })),
      result);
    if (w.budget || w.working_items || w.working_tokens || w.weights || w.reach) await run();
  }

  const BUILD_COLUMNS = ["seq", "query", "tokens_a", "tokens_b", "lines_in", "lines_out", "needed", "kept_a", "kept_b", "dropped_needed"];

  function renderReport(box, r) {
    const rows = [["prompt tokens", "tokens", String], ["evidence kept", "evidence_kept", pct], ["eviction regret", "eviction_regret", String],
      ["working-tier hit rate (cited lines)", "working_hit_rate", pct], ["paged out of working", "evicted", String], ["recorded lines kept", "recorded_kept", pct]];
    const hints = { evidence_kept: "the share of what the recorded outputs cited that the replayed prompts held",
      eviction_regret: "memories paged out of working that a later build needed and left out",
      working_hit_rate: ML.HIT_RATE_REPLAY,
      recorded_kept: "how closely the replay reproduces the live prompts (near 100% for A)" };
    const v = state.whatifView || (state.whatifView = { q: "", dropped: false, offset: 0 });
    const shown = r.builds.filter((d) => (!v.dropped || d.dropped_needed.length) && (!v.q || d.query.toLowerCase().includes(v.q.toLowerCase())));
    const again = () => renderReport(box, r);
    const ids = (list) => (list.length ? list.map((id) => el("code", { class: "sid", text: shortOf(id) })) : "–");
    const exportAs = (fmt) => {
      const name = `memlens-whatif-${state.session}.${fmt}`;
      if (fmt === "csv") ML.saveText(ML.toCsv(shown, BUILD_COLUMNS), name, "text/csv");
      else ML.saveText(ML.toJsonl([{ summary: { a: r.a, b: r.b }, params: Object.assign({}, state.whatif) }, ...shown]), name, "application/x-ndjson");
    };
    const page = shown.slice(v.offset, v.offset + BUILDS_PAGE);
    fill(box,
      el("div", { class: "card" }, el("h3", { text: "Aggregate effect" }),
        el("table", { id: "whatif-summary" }, el("tr", {}, ["", "A: current", "B: changed"].map((h) => el("th", { text: h }))),
          rows.map(([label, key, fmt]) => el("tr", { title: hints[key] || "", "data-key": key }, el("td", { text: label }),
            el("td", { text: r.a[key] === null ? "–" : fmt(r.a[key]) }), el("td", { class: r.b[key] !== r.a[key] ? "changed" : "", text: r.b[key] === null ? "–" : fmt(r.b[key]) }))))),
      el("div", { class: "card" }, el("h3", { text: `Per context build (${shown.length} of ${r.builds.length})` }),
        el("div", { class: "toolbar filters", id: "whatif-filters" },
          el("input", { type: "search", id: "whatif-q", placeholder: "query text…", size: 14, value: v.q, onchange: (e) => { v.q = e.target.value; v.offset = 0; again(); } }),
          el("label", {}, el("input", { type: "checkbox", id: "whatif-dropped", checked: v.dropped || null, onchange: (e) => { v.dropped = e.target.checked; v.offset = 0; again(); } }),
            " only builds that dropped a needed memory"),
          el("span", { class: "spacer" }), exportButtons("whatif", exportAs, "the per-build comparison shown (JSONL: the aggregate first)")),
        el("table", { id: "whatif-builds", class: "fit" }, el("tr", {}, [["build", "w-build"], ["query", ""], ["tokens A → B", "w-tokens"], ["lines in", "w-ids wide-only"], ["lines out", "w-ids wide-only"],
          ["needed kept A / B", "w-kept"], ["dropped", "w-ids"]].map(([h, c]) => el("th", { class: c, text: h }))),
          page.map((d) => el("tr", { class: "whatif-build" + (d.dropped_needed.length ? " dropped" : ""), "data-seq": d.seq },
            el("td", {}, el("a", { href: "#", text: `#${d.seq}`, onclick: (e) => { e.preventDefault(); state.context = d.seq; ML.show("contexts"); } })),
            el("td", { class: "clip", title: d.query, text: d.query }), el("td", { class: "nowrap", text: `${d.tokens_a} → ${d.tokens_b}` }),
            el("td", { class: "ids wide-only" }, ids(d.lines_in)), el("td", { class: "ids wide-only" }, ids(d.lines_out)),
            el("td", { class: "nowrap", text: `${d.kept_a.length} / ${d.kept_b.length} of ${d.needed.length}` }),
            el("td", { class: "ids" }, d.dropped_needed.map((id) => el("a", { href: "#", class: "memlink dropped-id sid", text: shortOf(id), onclick: (e) => { e.preventDefault(); ML.inspect(id); } })))))),
        ML.pager({ total: shown.length, offset: v.offset, limit: BUILDS_PAGE }, (o) => { v.offset = o; again(); })));
  }

  return { trace: viewTrace, teams: viewTeams, whatif: viewWhatIf };
};
