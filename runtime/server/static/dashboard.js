// agentlang live dashboard: polls /dashboard/data once a second and draws it.
// No libraries: the radix tree is an icicle on a canvas, the page map a canvas grid, the
// program graphs and time series hand-written SVG. window.dashboard exposes the render
// functions and the last layout (the browser tests read them).
"use strict";
(function () {
  const POLL_MS = 1000, MAX_NODES = 500, MIN_PX = 1;
  const KEY = "agentlang_api_key";
  const $ = (id) => document.getElementById(id);
  const state = { data: null, layout: [], polls: 0, timer: null };
  const PAGE_COLOURS = ["#e4e4e0", "#4f8cc9", "#e8923a", "#8e5bc4"];
  const PAGE_NAMES = ["free", "cached", "in_use", "shared"];
  const fmt = (x, d = 0) => (x === null || x === undefined) ? "–" : Number(x).toFixed(d);
  const el = (tag, attrs = {}, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svgEl = (tag, attrs = {}) => {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  };

  // ---- data --------------------------------------------------------------------------------
  async function poll() {
    const headers = {};
    const key = sessionStorage.getItem(KEY);
    if (key) headers["Authorization"] = "Bearer " + key;
    let r;
    try {
      r = await fetch("/dashboard/data?max_nodes=" + MAX_NODES, { headers });
    } catch (e) {
      $("status").textContent = "server unreachable";
      return;
    }
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      $("keyform").hidden = false;
      $("keyerror").textContent = key ? "wrong key" : "";
      $("status").textContent = "API key needed";
      stop();
      return;
    }
    if (!r.ok) { $("status").textContent = "error " + r.status; return; }
    const data = await r.json();
    state.data = data;
    state.polls += 1;
    render(data);
  }

  function start() { if (!state.timer) { poll(); state.timer = setInterval(poll, POLL_MS); } }
  function stop() { clearInterval(state.timer); state.timer = null; }

  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("apikey").value);
    $("keyform").hidden = true;
    start();
  });

  function render(d) {
    $("status").textContent = "updated " + new Date(d.time * 1000).toLocaleTimeString();
    $("cost").textContent = "snapshot " + fmt(d.cost_ms, 2) + " ms engine time";
    if (d.tree) renderTree(d.tree, d.pool.page_size);
    renderEvictions(d.evictions);
    renderPool(d.pool);
    renderRequests(d.requests, d.pool.figures);
    renderSessions(d.sessions, d.pool.figures);
    renderPrograms(d.programs);
    renderSeries(d.series);
  }

  // ---- radix tree: icicle ------------------------------------------------------------------
  // nodes: [id, parent, depth, tokens, pages, lock_ref, refcount, last_access,
  //         hidden_children, hidden_pages, label]; parents come before children.
  function renderTree(tree, pageSize) {
    const t0 = performance.now();
    const rows = tree.nodes, n = rows.length;
    const index = new Map(), kids = new Array(n), size = new Float64Array(n);
    for (let i = 0; i < n; i++) { index.set(rows[i][0], i); kids[i] = []; }
    for (let i = 0; i < n; i++) {
      const p = index.get(rows[i][1]);
      if (p !== undefined) kids[p].push(i);
      size[i] = rows[i][3] + rows[i][9] * pageSize;
    }
    for (let i = n - 1; i >= 0; i--) {             // children after parents: sum bottom-up
      const p = index.get(rows[i][1]);
      if (p !== undefined) size[p] += size[i];
    }
    const roots = [];
    for (let i = 0; i < n; i++) if (!index.has(rows[i][1])) roots.push(i);
    const canvas = $("tree"), ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height;
    let maxDepth = 1;
    for (let i = 0; i < n; i++) maxDepth = Math.max(maxDepth, rows[i][2]);
    const rowH = Math.max(6, Math.min(28, H / (maxDepth + 1)));
    ctx.clearRect(0, 0, W, H);
    const total = roots.reduce((s, i) => s + size[i], 0) || 1;
    const layout = [];
    let drawn = 0, collapsed = 0;
    const stack = [];
    let x = 0;
    roots.forEach((r, k) => {
      const w = W * size[r] / total;
      stack.push([r, x, w, k]);
      x += w;
    });
    while (stack.length) {
      const [i, x0, w, ns] = stack.pop();
      const row = rows[i], y = row[2] * rowH;
      const hue = (ns * 67 + 200) % 360;
      ctx.fillStyle = row[2] === 0 ? `hsl(${hue},25%,85%)`
        : `hsl(${hue},${row[5] > 0 ? 60 : 40}%,${Math.max(45, 78 - row[2] * 4)}%)`;
      ctx.fillRect(x0, y, Math.max(w - 0.5, 0.5), rowH - 1);
      if (row[5] > 0 && w > 3) {
        ctx.strokeStyle = "#111"; ctx.lineWidth = 2;
        ctx.strokeRect(x0 + 1, y + 1, w - 2.5, rowH - 3);
      }
      if (row[6] > 1 && w > 2) { ctx.fillStyle = "#111"; ctx.fillRect(x0, y, w - 0.5, 3); }
      if (w > 40 && rowH >= 12) {
        ctx.fillStyle = "#111"; ctx.font = "11px sans-serif";
        const text = typeof row[10] === "string" ? row[10].replace(/\s+/g, " ")
          : (row[10].kv || row[10].name || "") + (row[10].salt ? " · salt " + row[10].salt : "");
        ctx.fillText(text.slice(0, Math.floor(w / 6.5)), x0 + 3, y + rowH / 2 + 4);
      }
      layout.push({ id: row[0], x: x0, y, w, h: rowH, i });
      drawn += 1;
      // own tokens first, then the children widest first; the narrow tail (and the cold
      // subtrees the server collapsed) is drawn as one grey block
      let cx = x0 + w * (row[3] / size[i] || 0);
      let restW = w * row[9] * pageSize / size[i];
      kids[i].sort((a, b) => size[b] - size[a]);
      for (const c of kids[i]) {
        const cw = w * size[c] / size[i];
        if (cw < MIN_PX) { restW += cw; collapsed += 1; continue; }
        stack.push([c, cx, cw, ns]);
        cx += cw;
      }
      if (restW >= 0.5) {
        ctx.fillStyle = "#c8c8c8";
        ctx.fillRect(cx, y + rowH, restW, rowH - 1);
      }
    }
    state.layout = layout;
    state.treeIndex = { rows, kids, size, index };
    const shown = tree.shown_pages, all = tree.cached_pages;
    $("tree-summary").textContent = `${n} nodes (${drawn} drawn, narrower ones summarised grey), ${shown} of ${all} ` +
      `cached pages` + (tree.truncated ? " · cold subtrees collapsed" : "");
    renderPrefixes(rows, kids, size);
    return { ms: performance.now() - t0, nodes: n, drawn, collapsed };
  }

  function renderPrefixes(rows, kids, size) {
    const body = $("prefixes").tBodies[0];
    const list = [];
    for (let i = 0; i < rows.length; i++) {
      if (rows[i][2] > 0 && kids[i].length + rows[i][8] >= 2) list.push(i);
    }
    list.sort((a, b) => size[b] - size[a]);
    body.replaceChildren(...list.slice(0, 8).map((i) => {
      const r = rows[i], tr = el("tr", { "data-node": r[0] });
      let root = i;
      while (rows[root][2] > 0) root = state.treeIndex.index.get(rows[root][1]);
      const ns = rows[root][10];
      tr.append(el("td", { class: "label", title: r[10] }, r[10]), el("td", {}, r[3]),
        el("td", { class: "children" }, kids[i].length + r[8]), el("td", {}, r[5]),
        el("td", {}, r[6]), el("td", {}, (ns.kv || ns.name || "") + (ns.salt ? " · salt " + ns.salt : "")));
      return tr;
    }));
  }

  $("tree").addEventListener("mousemove", (ev) => {
    const c = $("tree"), b = c.getBoundingClientRect();
    const x = (ev.clientX - b.left) * c.width / b.width, y = (ev.clientY - b.top) * c.height / b.height;
    const hit = state.layout.find((n) => x >= n.x && x < n.x + n.w && y >= n.y && y < n.y + n.h);
    const tip = $("tooltip");
    if (!hit) { tip.hidden = true; return; }
    const r = state.treeIndex.rows[hit.i];
    const label = typeof r[10] === "string" ? JSON.stringify(r[10]) : JSON.stringify(r[10]);
    tip.textContent = `${label}\n${r[3]} tokens · ${r[4]} pages · locks ${r[5]} · refcount ${r[6]}` +
      (r[8] ? `\n${r[8]} cold children collapsed (${r[9]} pages)` : "");
    tip.style.left = ev.clientX + 12 + "px"; tip.style.top = ev.clientY + 12 + "px";
    tip.hidden = false;
  });
  $("tree").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });

  function renderEvictions(evs) {
    const ul = $("evictions");
    if (!evs.length) { ul.replaceChildren(el("li", { class: "dim" }, "none yet")); return; }
    ul.replaceChildren(...evs.slice().reverse().map((e) => el("li", {},
      `${new Date(e.time * 1000).toLocaleTimeString()} · ${e.tokens} tokens · ${e.namespace.kv || ""}`)));
  }

  // ---- KV pool -----------------------------------------------------------------------------
  function renderPool(pool) {
    const map = pool.map, n = map.length;
    const canvas = $("pagemap"), ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height;
    const cell = Math.max(1, Math.floor(Math.sqrt(W * H / Math.max(n, 1))));
    const cols = Math.max(1, Math.floor(W / cell));
    ctx.clearRect(0, 0, W, H);
    for (let p = 0; p < n; p++) {
      ctx.fillStyle = PAGE_COLOURS[map.charCodeAt(p) - 48];
      ctx.fillRect((p % cols) * cell, Math.floor(p / cols) * cell, Math.max(cell - (cell > 3 ? 1 : 0), 1),
        Math.max(cell - (cell > 3 ? 1 : 0), 1));
    }
    const f = pool.figures, dl = $("figures");
    const items = [
      ["free", "free pages", f.free], ["cached", "cached only", f.cached],
      ["in_use", "in use (one request)", f.in_use], ["shared", "shared (refcount > 1)", f.shared],
      ["used", "pages used", f.used], ["total", "pages in all", f.total],
      ["utilization", "utilisation", f.utilization], ["waste_pct", "waste %", f.waste_pct],
      ["evictable", "evictable", f.evictable], ["pinned", "pinned", f.pinned],
      ["cow_copies", "copy-on-write copies", f.cow_copies], ["evicted_pages", "evicted pages", f.evicted_pages],
    ];
    dl.replaceChildren(...items.flatMap(([k, name, v]) => {
      const dt = el("dt", {}, "");
      if (PAGE_NAMES.includes(k)) dt.append(el("span", { class: "swatch " + k }), " ");
      dt.append(name);
      const shown = k === "utilization" ? fmt(100 * v, 1) + " %" : k === "waste_pct" ? fmt(v, 1) : String(v);
      return [dt, el("dd", { "data-series": pool.series[k], "data-value": String(v), id: "fig-" + k }, shown)];
    }));
    $("pool-summary").textContent = `${f.used} / ${f.total} pages · ${pool.page_size} tokens per page`;
  }

  // ---- requests ----------------------------------------------------------------------------
  function renderRequests(reqs, figures) {
    const body = $("requests").tBodies[0];
    body.replaceChildren(...reqs.map((r) => {
      const tr = el("tr", { class: r.state, "data-rid": r.rid });
      const frac = r.max_tokens ? Math.min(1, r.output_tokens / r.max_tokens) : 0;
      const bar = el("span", { class: "bar" });
      bar.append(el("span", { style: `width:${(100 * frac).toFixed(0)}%` }));
      const prog = el("td", {});
      prog.append(bar, ` ${r.output_tokens}/${r.max_tokens}`);
      tr.append(el("td", {}, r.rid + (r.index ? "#" + r.index : "")), el("td", {}, r.state), prog,
        el("td", {}, r.prompt_tokens), el("td", {}, r.cached_tokens),
        el("td", {}, r.ttft_s === null ? "–" : fmt(1000 * r.ttft_s) + " ms"),
        el("td", {}, fmt(r.age_s, 1) + " s"), el("td", {}, r.preemptions));
      return tr;
    }));
    $("no-requests").hidden = reqs.length > 0;
    $("req-summary").textContent = `${figures.running} running · ${figures.waiting} waiting · ` +
      `${figures.preemptions} preemptions · hit rate ${fmt(100 * figures.hit_rate, 1)} %`;
  }

  // ---- sessions: what each keeps for its next turn ------------------------------------------
  function renderSessions(rows, figures) {
    const body = $("sessions").tBodies[0];
    body.replaceChildren(...rows.map((r) => {
      const tr = el("tr", { "data-session": r.id, class: r.held_pages ? "held" : "" });
      tr.append(el("td", {}, r.id), el("td", {}, r.turns), el("td", {}, r.held_pages),
        el("td", {}, r.hold_expires_s === null ? "–" : fmt(r.hold_expires_s, 1) + " s"),
        el("td", {}, fmt(r.idle_s, 1) + " s"));
      return tr;
    }));
    $("no-sessions").hidden = rows.length > 0;
    $("sess-summary").textContent = `${figures.sessions} open · ${figures.session_held} pages ` +
      "held for their next turn";
  }

  // ---- programs: fork/join graphs ----------------------------------------------------------
  function renderPrograms(programs) {
    const box = $("programs");
    box.replaceChildren(...programs.slice(0, 6).map((p) => {
      const branches = [...new Set(p.nodes.map((n) => n.branch))];
      const col = new Map(branches.map((b, k) => [b, k]));
      const level = new Array(p.nodes.length).fill(0);   // longest path from the start
      for (let pass = 0, changed = true; changed && pass < 64; pass++) {
        changed = false;
        for (const [a, b] of p.edges) {
          if (level[b] < level[a] + 1) { level[b] = level[a] + 1; changed = true; }
        }
      }
      const X = (n) => 24 + 46 * col.get(n.branch), Y = (i) => 24 + 34 * level[i];
      const W = 48 + 46 * Math.max(branches.length - 1, 0), H = 48 + 34 * Math.max(0, ...level);
      const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
      for (const [a, b, kind] of p.edges) {
        svg.append(svgEl("line", { x1: X(p.nodes[a]), y1: Y(a), x2: X(p.nodes[b]), y2: Y(b), class: kind }));
      }
      p.nodes.forEach((n, i) => {
        const c = svgEl("circle", { cx: X(n), cy: Y(i), r: 8, class: n.state,
          "data-branch": n.branch, "data-state": n.state });
        const title = svgEl("title");
        title.textContent = `branch ${n.branch}, generation ${n.step}: ${n.state}`;
        c.append(title);
        svg.append(c);
      });
      const div = el("div", { class: "program", "data-program": p.id });
      div.append(el("div", {}, `${p.name} · ${branches.length} branches · ${p.nodes.length} gens` +
        (p.active.length ? ` · decoding: ${p.active.join(", ")}` : " · idle")), svg);
      return div;
    }));
  }

  // ---- time series -------------------------------------------------------------------------
  const CHARTS = [["tokens_per_s", "output tokens/s", 0], ["hit_rate", "prefix hit rate", 2],
                  ["queue", "queue length", 0], ["kv_use", "KV use", 2]];
  function renderSeries(s) {
    const t = s.t;
    $("charts").replaceChildren(...CHARTS.map(([k, name, digits]) => {
      const v = s[k], div = el("div", { class: "chart", "data-chart": k });
      const last = v.length ? v[v.length - 1] : null;
      div.append(el("span", { class: "now" }, fmt(last, digits)), el("span", {}, name));
      const svg = svgEl("svg", { viewBox: "0 0 300 60", preserveAspectRatio: "none" });
      const vals = v.map((y) => (y === null ? 0 : y));
      const hi = Math.max(1e-9, ...vals, k === "hit_rate" || k === "kv_use" ? 1 : 0);
      const t0 = t.length ? t[0] : 0, span = Math.max(1, (t.length ? t[t.length - 1] : 1) - t0);
      const pts = vals.map((y, i) => `${(300 * (t[i] - t0) / span).toFixed(1)},${(58 - 56 * y / hi).toFixed(1)}`);
      svg.append(svgEl("polyline", { points: pts.join(" ") }));
      div.append(svg);
      return div;
    }));
  }

  window.dashboard = { renderTree, renderPool, renderRequests, renderPrograms, renderSeries,
                       state, poll, start, stop };
  start();
})();
