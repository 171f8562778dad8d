// MemLens charts: small SVG helpers written by hand (no library, no build step).
// Every function draws into a container element and returns nothing; data come from the JSON API.
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg";
  const TIER_COLORS = { working: "#d9480f", short_term: "#f59f00", long_term: "#1c7ed6", archive: "#868e96" };
  const SECTION_COLORS = { warnings: "#c92a2a", pinned: "#7048e8", working: "#d9480f", retrieved: "#1c7ed6", free: "#e9ecef" };
  // the influence diagram's links (and the outline of a cited memory's bar): cited by the output or not
  const CITE_COLORS = { cited: "#f08c00", uncited: "#dee2e6" };
  const EDGE_COLORS = { parent: "#495057", entity: "#74c0fc", caused_by: "#e03131", revises: "#f08c00",
    summarizes: "#2f9e44", derived_from: "#9c36b5", refers_to: "#1098ad" };

  function svg(tag, attrs, parent) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, s, attrs) {
    const t = svg("text", Object.assign({ x, y, "font-size": 11, fill: "#495057" }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  function title(node, s) {
    svg("title", {}, node).textContent = s;
  }

  // a chart fits its box (width 100%); its drawn width is kept in --natural-w for the phone layout, which
  // draws a wide chart at that size in a box that scrolls (fitted to 360 px, its text came out 3 px tall)
  function frame(container, width, height) {
    container.innerHTML = "";
    const s = svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img",
      preserveAspectRatio: "xMinYMin meet" }, container);
    s.style.setProperty("--natural-w", `${width}px`);
    return s;
  }

  function fmtTime(ms) {
    const d = new Date(ms);
    return d.toISOString().slice(5, 16).replace("T", " ");
  }

  // viridis-like scale for values in [0, 1]
  const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function valueColor(v) {
    if (v === null || v === undefined) return "#f1f3f5";
    const x = Math.max(0, Math.min(1, v)) * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2);
    const f = x - i;
    const c = STOPS[i].map((a, k) => Math.round(a + (STOPS[i + 1][k] - a) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function axisY(g, x, top, bottom, max, ticks, fmt) {
    svg("line", { x1: x, y1: top, x2: x, y2: bottom, stroke: "#adb5bd" }, g);
    for (let i = 0; i <= ticks; i++) {
      const v = (max * i) / ticks;
      const y = bottom - ((bottom - top) * i) / ticks;
      svg("line", { x1: x - 3, y1: y, x2: x, y2: y, stroke: "#adb5bd" }, g);
      text(g, x - 6, y + 4, fmt ? fmt(v) : String(Math.round(v * 100) / 100), { "text-anchor": "end" });
    }
  }

  // Stacked area: edges (ms) x series {name: [counts]}.
  function stackedArea(container, edges, series, order, colors) {
    const W = 900, H = 300, L = 48, R = 120, T = 12, B = 36;
    const s = frame(container, W, H);
    const n = edges.length;
    if (!n) { text(s, L, 40, "no data"); return; }
    const totals = edges.map((_, i) => order.reduce((a, k) => a + (series[k][i] || 0), 0));
    const max = Math.max(1, ...totals);
    const x = (i) => L + ((W - L - R) * i) / Math.max(1, n - 1);
    const y = (v) => H - B - ((H - T - B) * v) / max;
    const base = new Array(n).fill(0);
    order.forEach((k) => {
      const top = base.map((b, i) => b + (series[k][i] || 0));
      let d = `M${x(0)},${y(top[0])}`;
      for (let i = 1; i < n; i++) d += ` L${x(i)},${y(top[i])}`;
      for (let i = n - 1; i >= 0; i--) d += ` L${x(i)},${y(base[i])}`;
      const p = svg("path", { d: d + " Z", fill: colors[k], opacity: 0.85, "data-series": k }, s);
      title(p, `${k}: ${series[k][n - 1] || 0} now`);
      top.forEach((v, i) => { base[i] = v; });
    });
    axisY(s, L, T, H - B, max, 4, (v) => String(Math.round(v)));
    [0, Math.floor(n / 2), n - 1].forEach((i) => text(s, x(i), H - B + 16, fmtTime(edges[i]), { "text-anchor": "middle" }));
    order.forEach((k, i) => {
      svg("rect", { x: W - R + 12, y: T + i * 18, width: 12, height: 12, fill: colors[k] }, s);
      text(s, W - R + 30, T + i * 18 + 10, k.replace("_", " "));
    });
  }

  // Heatmap: rows [{id, label, values}] x edges; cells coloured by value; click -> onRow(id).
  // opts.labelW, opts.chars: the label column's width and the characters a label keeps (narrower on a phone)
  function heatmap(container, edges, rows, onRow, opts) {
    const { labelW, chars } = Object.assign({ labelW: 330, chars: 50 }, opts || {});
    const cell = 14, H = rows.length * cell + 40, W = labelW + edges.length * cell + 70;
    const s = frame(container, W, Math.max(H, 60));
    rows.forEach((r, i) => {
      const g = svg("g", { class: r.id ? "hm-row clickable" : "hm-row", "data-id": r.id || "" }, s);
      // cut to what fits left of the cells (10 px text: ~6 px a character), the whole label on hover; the
      // preview after "<id> <kind>: " between first-strong isolate marks (FSI … PDI), so an Arabic one keeps
      // its own direction and its "…" without mixing into the id and kind
      const cut = r.label.length > chars ? r.label.slice(0, chars - 1) + "…" : r.label;
      const at = r.id ? cut.indexOf(": ") : -1;
      const label = text(g, labelW - 6, i * cell + 11, at < 0 ? cut : `${cut.slice(0, at + 2)}\u2068${cut.slice(at + 2)}\u2069`,
        { "text-anchor": "end", "font-size": 10 });
      title(label, r.label);
      r.values.forEach((v, j) => {
        const c = svg("rect", { x: labelW + j * cell, y: i * cell, width: cell - 1, height: cell - 1,
          fill: valueColor(v) }, g);
        title(c, `${r.label}\n${fmtTime(edges[j])}: ${v === null ? "not yet recorded" : v}`);
      });
      if (r.id && onRow) g.addEventListener("click", () => onRow(r.id));
    });
    const y0 = rows.length * cell + 14;
    if (edges.length) {
      text(s, labelW, y0, fmtTime(edges[0]));
      text(s, labelW + edges.length * cell, y0, fmtTime(edges[edges.length - 1]), { "text-anchor": "end" });
    }
    for (let k = 0; k <= 10; k++) {
      svg("rect", { x: labelW + k * 12, y: y0 + 8, width: 12, height: 8, fill: valueColor(k / 10) }, s);
    }
    text(s, labelW + 140, y0 + 16, "value 0 → 1");
  }

  // Line chart with optional second series; points [{x, y, y2}]
  function lineChart(container, points, opts) {
    const W = 900, H = 240, L = 52, R = 16, T = 12, B = 30;
    const s = frame(container, W, H);
    if (!points.length) { text(s, L, 40, "no data yet"); return; }
    const max = Math.max(1e-9, ...points.map((p) => Math.max(p.y, p.y2 || 0)));
    const x = (i) => L + ((W - L - R) * i) / Math.max(1, points.length - 1);
    const y = (v) => H - B - ((H - T - B) * v) / max;
    const path = (key) => points.map((p, i) => `${i ? "L" : "M"}${x(i)},${y(p[key])}`).join(" ");
    if (points.some((p) => p.y2 !== undefined)) {
      svg("path", { d: path("y2"), fill: "none", stroke: "#adb5bd", "stroke-dasharray": "4 3" }, s);
    }
    svg("path", { d: path("y"), fill: "none", stroke: opts.color || "#1c7ed6", "stroke-width": 2 }, s);
    points.forEach((p, i) => {
      const c = svg("circle", { cx: x(i), cy: y(p.y), r: 2.5, fill: opts.color || "#1c7ed6" }, s);
      title(c, p.label || String(p.y));
    });
    axisY(s, L, T, H - B, max, 4, opts.fmt);
    text(s, L, H - 8, opts.xlabel || "");
  }

  // Horizontal bars: items [{label, value, color?, note?}], value in [0, max]
  function bars(container, items, opts) {
    const rowH = 22, L = 190, W = 900, H = items.length * rowH + 16;
    const s = frame(container, W, Math.max(H, 40));
    const max = opts.max || Math.max(1e-9, ...items.map((i) => i.value));
    items.forEach((it, i) => {
      const y = 6 + i * rowH;
      text(s, L - 8, y + 13, it.label, { "text-anchor": "end" });
      const w = ((W - L - 120) * Math.max(0, it.value)) / max;
      const r = svg("rect", { x: L, y, width: Math.max(w, 1), height: rowH - 6, fill: it.color || opts.color || "#1c7ed6" }, s);
      title(r, `${it.label}: ${it.value}`);
      const note = text(s, L + w + 6, y + 13, it.note !== undefined ? it.note : String(it.value));
      // a note past the chart's right edge (a long bar's "100.0% errors · … · 5 calls" ran off it) goes
      // inside its bar's end, in white
      if (L + w + 6 + textWidth(note) > W - 2) {
        note.setAttribute("x", L + w - 6);
        note.setAttribute("text-anchor", "end");
        note.setAttribute("fill", "#fff");
      }
    });
  }

  // a drawn text's width in the chart's units (an estimate where the chart is not on screen yet)
  function textWidth(t) {
    let w = 0;
    try { w = t.getComputedTextLength(); } catch (e) { w = 0; }
    return w || t.textContent.length * 0.6 * Number(t.getAttribute("font-size") || 11);
  }

  // One stacked bar: parts [{name, value}] of a total (the context window inspector)
  function stackedBar(container, parts, total) {
    const W = 900, H = 64;
    const s = frame(container, W, H);
    let x = 0;
    parts.forEach((p) => {
      const w = (W * p.value) / Math.max(1, total);
      const r = svg("rect", { x, y: 4, width: Math.max(w, 0), height: 30, fill: SECTION_COLORS[p.name] || "#ced4da",
        "data-section": p.name }, s);
      title(r, `${p.name}: ${p.value} tokens`);
      if (w > 60) text(s, x + 6, 24, `${p.name} ${p.value}`, { fill: p.name === "free" ? "#495057" : "#fff" });
      x += w;
    });
    text(s, 0, 54, `${parts.filter((p) => p.name !== "free").reduce((a, p) => a + p.value, 0)} of ${total} tokens`);
  }

  // Fruchterman-Reingold layout with gravity (so unlinked memories stay near the middle, not on the rim).
  function layout(n, links, W, H) {
    const k = Math.sqrt((W * H) / Math.max(n, 1)) * 0.55;
    const pos = Array.from({ length: n }, (_, i) => {
      const t = i * 2.399963, r = 12 * Math.sqrt(i + 1);  // a sunflower spiral: deterministic, spread out
      return { x: W / 2 + r * Math.cos(t), y: H / 2 + r * Math.sin(t) };
    });
    let temp = W / 8;
    const iterations = 300;
    for (let it = 0; it < iterations; it++) {
      const dx = new Float64Array(n), dy = new Float64Array(n);
      for (let i = 0; i < n; i++) {
        for (let j = i + 1; j < n; j++) {
          const ex = pos[i].x - pos[j].x, ey = pos[i].y - pos[j].y;
          const d2 = Math.max(ex * ex + ey * ey, 0.01);
          const f = (k * k) / d2;  // repulsion k^2/d, along the unit vector (e/d)
          dx[i] += ex * f; dy[i] += ey * f; dx[j] -= ex * f; dy[j] -= ey * f;
        }
      }
      for (const l of links) {
        const ex = pos[l.a].x - pos[l.b].x, ey = pos[l.a].y - pos[l.b].y;
        const d = Math.sqrt(ex * ex + ey * ey) || 0.01;
        const f = (d / k) * (l.type === "entity" ? 0.5 : 1);  // attraction d^2/k, along e/d
        dx[l.a] -= ex * f; dy[l.a] -= ey * f; dx[l.b] += ex * f; dy[l.b] += ey * f;
      }
      for (let i = 0; i < n; i++) {
        // gravity: as if linked to an invisible centre node (attraction d^2/k), so it grows with distance
        const gx = W / 2 - pos[i].x, gy = (H / 2 - pos[i].y) * (W / H);
        const g = (0.12 * Math.sqrt(gx * gx + gy * gy)) / k;
        dx[i] += gx * g; dy[i] += gy * g;
        const d = Math.sqrt(dx[i] * dx[i] + dy[i] * dy[i]) || 1;
        const step = Math.min(d, temp);
        pos[i].x = Math.max(16, Math.min(W - 16, pos[i].x + (dx[i] / d) * step));
        pos[i].y = Math.max(16, Math.min(H - 16, pos[i].y + (dy[i] / d) * step));
      }
      temp = Math.max(1, temp * 0.985);
    }
    return pos;
  }

  // Force-directed graph, laid out synchronously (bounded node count), then drawn once.
  // Memory graph: colour = tier, size = value. Wheel or +/− zooms (about the pointer), dragging pans; node
  // labels (short ids) show when zoomed in or when the graph is small; a tier legend and an edge legend.
  function forceGraph(container, nodes, edges, onNode, selected) {
    const W = 900, H = 560;
    container.innerHTML = "";
    const tools = document.createElement("div");
    tools.className = "toolbar graph-legend";
    container.appendChild(tools);
    const holder = document.createElement("div");
    container.appendChild(holder);
    const s = frame(holder, W, H);
    if (!nodes.length) { text(s, 20, 40, "no memories in this scope"); return; }
    const view = svg("g", { class: "viewport" }, s);
    const index = new Map(nodes.map((n, i) => [n.id, i]));
    const links = edges.filter((e) => index.has(e.source) && index.has(e.target))
      .map((e) => ({ a: index.get(e.source), b: index.get(e.target), type: e.type, label: e.label }));
    const pos = layout(nodes.length, links, W, H);
    links.forEach((l) => {
      const line = svg("line", { x1: pos[l.a].x, y1: pos[l.a].y, x2: pos[l.b].x, y2: pos[l.b].y,
        stroke: EDGE_COLORS[l.type] || "#ced4da", "stroke-width": l.type === "entity" ? 1 : 1.6,
        opacity: l.type === "entity" ? 0.55 : 0.9, class: `edge edge-${l.type}`, "vector-effect": "non-scaling-stroke" }, view);
      title(line, l.label ? `${l.type}: ${l.label}` : l.type);
    });
    const labels = svg("g", { class: "labels" }, view);
    nodes.forEach((n, i) => {
      const r = 5 + 9 * n.value;
      const c = svg("circle", { cx: pos[i].x, cy: pos[i].y, r, fill: TIER_COLORS[n.tier] || "#adb5bd",
        stroke: n.id === selected ? "#000" : (n.pinned ? "#7048e8" : "#fff"), "stroke-width": n.id === selected || n.pinned ? 3 : 1.5,
        class: "node clickable", "data-id": n.id, opacity: n.status === "active" ? 1 : 0.45 }, view);
      title(c, `${n.short_id} ${n.kind} (${n.tier}, value ${n.value})\n${n.preview}`);
      c.addEventListener("click", () => onNode(n.id));
      const label = text(labels, pos[i].x + r + 2, pos[i].y + 3, `${n.short_id} ${n.kind}`, { "font-size": 9, class: "node-label", "pointer-events": "none" });
      // a node near the right edge has its label on its left (it was cut off by the edge)
      if (pos[i].x + r + 2 + textWidth(label) > W - 2) {
        label.setAttribute("x", pos[i].x - r - 2);
        label.setAttribute("text-anchor", "end");
      }
    });
    // legends: tiers (node colour) and the edge types present
    Object.entries(TIER_COLORS).forEach(([k, col]) => {
      const item = document.createElement("span");
      item.className = "legend-tier";
      item.innerHTML = `<i style="background:${col}"></i>${k.replace("_", " ")}`;
      tools.appendChild(item);
    });
    Object.entries(EDGE_COLORS).forEach(([k, col]) => {
      if (!links.some((l) => l.type === k)) return;
      const item = document.createElement("span");
      item.innerHTML = `<i style="background:${col};border-radius:0;height:3px"></i>${k.replace("_", " ")}`;
      tools.appendChild(item);
    });
    // zoom and pan
    let k = 1, tx = 0, ty = 0;
    const apply = () => {
      view.setAttribute("transform", `translate(${tx},${ty}) scale(${k})`);
      labels.style.display = k >= 1.6 || nodes.length <= 60 ? "" : "none";
      s.dataset.zoom = k.toFixed(2);
      s.dataset.pan = `${Math.round(tx)},${Math.round(ty)}`;
    };
    const zoomAt = (factor, cx, cy) => {
      const next = Math.min(8, Math.max(0.5, k * factor));
      tx = cx - ((cx - tx) * next) / k;
      ty = cy - ((cy - ty) * next) / k;
      k = next;
      apply();
    };
    const toSvg = (e) => {
      const box = s.getBoundingClientRect();
      return [((e.clientX - box.left) * W) / box.width, ((e.clientY - box.top) * W) / box.width];
    };
    s.addEventListener("wheel", (e) => { e.preventDefault(); const [x, y] = toSvg(e); zoomAt(e.deltaY < 0 ? 1.2 : 1 / 1.2, x, y); }, { passive: false });
    let drag = null;
    s.addEventListener("pointerdown", (e) => { if (e.target.tagName !== "circle") { drag = { x: e.clientX, y: e.clientY, tx, ty }; s.setPointerCapture(e.pointerId); } });
    s.addEventListener("pointermove", (e) => {
      if (!drag) return;
      const box = s.getBoundingClientRect();
      tx = drag.tx + ((e.clientX - drag.x) * W) / box.width;
      ty = drag.ty + ((e.clientY - drag.y) * W) / box.width;
      apply();
    });
    s.addEventListener("pointerup", () => { drag = null; });
    const button = (label, id, fn) => {
      const b = document.createElement("button");
      b.textContent = label; b.id = id; b.addEventListener("click", fn);
      tools.prepend(b);
    };
    button("reset", "graph-reset", () => { k = 1; tx = 0; ty = 0; apply(); });
    button("−", "graph-zoom-out", () => zoomAt(1 / 1.4, W / 2, H / 2));
    button("+", "graph-zoom-in", () => zoomAt(1.4, W / 2, H / 2));
    apply();
  }

  // Influence diagram: memories (left, grouped by section) -> output (right); cited links solid.
  function influence(container, lines, hasOutput, onNode) {
    const rowH = 20, W = 900, H = Math.max(lines.length * rowH + 30, 120);
    const s = frame(container, W, H);
    const outX = 640, outY = H / 2 - 40;
    svg("rect", { x: outX, y: outY, width: 240, height: 80, rx: 8, fill: hasOutput ? "#fff4e6" : "#f1f3f5", stroke: CITE_COLORS.cited }, s);
    text(s, outX + 120, outY + 44, hasOutput ? "agent output" : "no output recorded", { "text-anchor": "middle", "font-size": 13 });
    lines.forEach((l, i) => {
      const y = 12 + i * rowH;
      const w = 40 + 200 * (l.value || 0);
      if (l.cited !== null) {
        const p = svg("path", { d: `M${w + 210},${y + 8} C${outX - 120},${y + 8} ${outX - 120},${outY + 40} ${outX},${outY + 40}`,
          fill: "none", stroke: l.cited ? CITE_COLORS.cited : CITE_COLORS.uncited, "stroke-width": l.cited ? 2.5 : 1,
          class: l.cited ? "cite cited" : "cite" }, s);
        title(p, l.cited ? "cited by the output" : "not cited");
      }
      const g = svg("g", { class: "clickable infl-line", "data-id": l.id }, s);
      text(g, 0, y + 12, `${l.short_id} ${l.section}`, { "font-size": 10 });
      const r = svg("rect", { x: 110, y: y + 1, width: w, height: rowH - 6, rx: 3, fill: TIER_COLORS[l.tier] || "#adb5bd",
        stroke: l.cited ? CITE_COLORS.cited : "none", "stroke-width": 2 }, g);
      title(r, `${l.short_id}: tier ${l.tier}, value ${l.value} then, ${l.tokens} tokens\n${l.preview}`);
      text(g, 114 + w, y + 12, `${l.value}`, { "font-size": 10 });
      g.addEventListener("click", () => onNode(l.id));
    });
  }

  // Small sparkline for a memory's value history; a single value is written out, to 3 places as the
  // inspector writes values (it printed the raw float, "value 0.446827005940697")
  function sparkline(container, values) {
    const W = 300, H = 50;
    const s = frame(container, W, H);
    if (values.length < 2) { text(s, 0, 30, values.length ? `value ${Number(values[0]).toFixed(3)}` : "no history yet"); return; }
    const x = (i) => (W * i) / (values.length - 1);
    const y = (v) => H - 4 - (H - 8) * v;
    svg("path", { d: values.map((v, i) => `${i ? "L" : "M"}${x(i)},${y(v)}`).join(" "), fill: "none", stroke: "#1c7ed6", "stroke-width": 2 }, s);
  }

  window.Charts = { stackedArea, heatmap, lineChart, bars, stackedBar, forceGraph, influence, sparkline,
    valueColor, TIER_COLORS, SECTION_COLORS, CITE_COLORS };
})();
