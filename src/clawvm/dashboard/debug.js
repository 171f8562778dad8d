// MemLens debugging views: a run's trace, the teams face, and the what-if replay. Loaded before app.js,
// which calls window.MemLensViews(helpers) and adds the views it returns to its tabs.
"use strict";

window.MemLensViews = function (ML) {
  const { state, api, post, qs, el, fill, toast, num, pct, when, tierPill, canWrite } = ML;
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
    if (!state.session) return noSession(main, "Run trace");
    const task = state.traceTask || "";
    const t = await api("trace" + qs({ session: state.session, task, limit: 200 }));
    const tasks = el("select", { id: "trace-task", onchange: (e) => { state.traceTask = e.target.value; ML.show("trace"); } },
      el("option", { value: "", text: "all tasks" }), t.tasks.map((x) => el("option", { value: x, selected: x === task || null, text: x })));
    const tot = t.totals;
    fill(main,
      el("h2", { text: `Run trace · ${t.session}` + (t.task ? ` · task ${t.task}` : "") }),
      el("div", { class: "toolbar" }, tasks,
        el("button", { id: "trace-expand", text: "expand all", onclick: () => main.querySelectorAll("details").forEach((d) => { d.open = true; }) }),
        el("button", { text: "collapse all", onclick: () => main.querySelectorAll("details").forEach((d) => { d.open = false; }) }),
        el("span", { class: "muted", id: "trace-totals", text: `${tot.memories} memories · ${tot.contexts} context builds (${tot.context_tokens} tokens) · ` +
          `${tot.errors} errors · tools ${secs(tot.tool_seconds)} · LLM tokens ${tot.llm_tokens}` + (tot.money ? ` · cost ${num(tot.money, 4)}` : "") })),
      el("div", { class: "card trace", id: "trace-tree" }, t.steps.map(step)),
      t.total > t.steps.length ? el("p", { class: "muted", text: `first ${t.steps.length} of ${t.total} steps` }) : null);
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
    const t = await api("teams");
    const review = async (id, verdict) => {
      try {
        await post(`review/${id}/${verdict}`, {});
        toast(`${verdict === "approve" ? "approved" : "rejected"} ${shortOf(id)}`);
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
    fill(main, el("h2", { text: "Teams" }),
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
          el("p", {}, el("b", { text: "Conflict " }), el("code", { text: c.short_id }), " ", c.preview),
          el("div", { class: "sides" }, c.sides.map((m) => el("div", { class: "side card" },
            el("div", {}, el("code", { text: m.short_id }), ` ${m.kind} · ${m.agent_id || "?"} · confidence ${num(m.confidence, 2)}`),
            el("p", { text: m.preview }),
            canWrite() ? el("button", { class: "keep-button", text: "Keep this side", onclick: () => review(m.id, "approve") }) : null))),
          canWrite() ? el("div", { class: "actions" }, el("button", { text: "Not a conflict", onclick: () => review(c.id, "reject") })) : null))
          : el("p", { class: "muted", text: "No open conflicts." })),
      el("div", { class: "card" }, el("h3", { text: "Team knowledge: what guidance draws on" }),
        el("table", { id: "knowledge-table" }, el("tr", {}, ["memory", "kind", "team", "sources (tasks)", "adoption", "confidence", "content"].map((h) => el("th", { text: h }))),
          t.knowledge.map((m) => el("tr", {}, memCell(m), el("td", { text: m.kind }), el("td", { text: m.team_id }),
            el("td", { text: m.source_tasks.join(", ") || "–" }), el("td", { class: "adoption", text: rate(m) }),
            el("td", { text: num(m.confidence, 2) }), el("td", { text: m.preview }))))),
      el("div", { class: "card" }, el("h3", { text: `Guidance blocks (newest ${t.guidance.length})` }),
        t.guidance.length ? t.guidance.map((g) => el("details", { class: "guidance" },
          el("summary", { text: `#${g.seq} ${g.agent_id}: “${g.task}” · ${g.tokens}/${g.budget} tokens · ${g.items.length} lines` }),
          el("table", {}, el("tr", {}, ["section", "line", "sources", "adoption"].map((h) => el("th", { text: h }))),
            g.items.map((i) => el("tr", { class: "clickable", onclick: () => ML.inspect(i.id) }, el("td", { text: i.section }), el("td", { text: i.line }),
              el("td", { text: (i.source_tasks || []).join(", ") || "–" }), el("td", { text: i.adoption_rate === null ? "–" : pct(i.adoption_rate) }))))))
          : el("p", { class: "muted", text: "No guidance built yet (Harness.guidance)." })));
  }

  // ---- what-if replay -------------------------------------------------------------------------------------
  async function viewWhatIf(main) {
    if (!state.session) return noSession(main, "What-if replay");
    const w = state.whatif || (state.whatif = { budget: "", working_items: "", working_tokens: "", weights: "" });
    const input = (k, placeholder, size) => el("input", { id: `whatif-${k}`, placeholder, size: size || 8, value: w[k], onchange: (e) => { w[k] = e.target.value.trim(); } });
    const result = el("div", { id: "whatif-result" });
    const run = async () => {
      fill(result, el("p", { class: "muted", text: "replaying the session offline…" }));
      try {
        const r = await api("whatif" + qs(Object.assign({ session: state.session }, w)));
        renderReport(result, r);
      } catch (e) { fill(result, el("div", { class: "card" }, String(e.message || e))); }
    };
    fill(main, el("h2", { text: `What-if replay · ${state.session}` }),
      el("p", { class: "muted", text: "Replays this session's event log offline through the real pager and context builder, under the current policy (A) and a changed one (B). Nothing is written to the store." }),
      el("div", { class: "toolbar" }, el("label", {}, "context budget ", input("budget", "recorded")),
        el("label", {}, "working items ", input("working_items", "current")), el("label", {}, "working tokens ", input("working_tokens", "current")),
        el("label", {}, "weights ", input("weights", "cite_weight=0.3,…", 22)),
        el("button", { id: "whatif-run", class: "primary", text: "Replay", onclick: run })),
      result);
    if (w.budget || w.working_items || w.working_tokens || w.weights) await run();
  }

  function renderReport(box, r) {
    const rows = [["prompt tokens", "tokens", String], ["evidence kept", "evidence_kept", pct], ["eviction regret", "eviction_regret", String],
      ["working-tier hit rate", "working_hit_rate", pct], ["paged out of working", "evicted", String], ["recorded lines kept", "recorded_kept", pct]];
    const hints = { evidence_kept: "the share of what the recorded outputs cited that the replayed prompts held",
      eviction_regret: "memories paged out of working that a later build needed and left out",
      working_hit_rate: "needed memories found in the pinned or working section of the build",
      recorded_kept: "how closely the replay reproduces the live prompts (near 100% for A)" };
    fill(box,
      el("div", { class: "card" }, el("h3", { text: "Aggregate effect" }),
        el("table", { id: "whatif-summary" }, el("tr", {}, ["", "A: current", "B: changed"].map((h) => el("th", { text: h }))),
          rows.map(([label, key, fmt]) => el("tr", { title: hints[key] || "" }, el("td", { text: label }),
            el("td", { text: r.a[key] === null ? "–" : fmt(r.a[key]) }), el("td", { class: r.b[key] !== r.a[key] ? "changed" : "", text: r.b[key] === null ? "–" : fmt(r.b[key]) }))))),
      el("div", { class: "card" }, el("h3", { text: `Per context build (${r.builds.length})` }),
        el("table", { id: "whatif-builds" }, el("tr", {}, ["build", "query", "tokens A → B", "lines in", "lines out", "needed kept A / B", "dropped"].map((h) => el("th", { text: h }))),
          r.builds.map((d) => el("tr", { class: d.dropped_needed.length ? "dropped" : "" },
            el("td", {}, el("a", { href: "#", text: `#${d.seq}`, onclick: (e) => { e.preventDefault(); state.context = d.seq; ML.show("contexts"); } })),
            el("td", { text: d.query.slice(0, 60) }), el("td", { text: `${d.tokens_a} → ${d.tokens_b}` }),
            el("td", { text: d.lines_in.map(shortOf).join(" ") || "–" }), el("td", { text: d.lines_out.map(shortOf).join(" ") || "–" }),
            el("td", { text: `${d.kept_a.length} / ${d.kept_b.length} of ${d.needed.length}` }),
            el("td", {}, d.dropped_needed.map((id) => el("a", { href: "#", class: "memlink dropped-id", text: shortOf(id) + " ", onclick: (e) => { e.preventDefault(); ML.inspect(id); } }))))))));
  }

  return { trace: viewTrace, teams: viewTeams, whatif: viewWhatIf };
};
