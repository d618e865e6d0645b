// agentrl view: the page. Routes live in the URL hash, so every view is a permalink:
//   #/list?step=2&env=arith&status=completed&offset=0   #/t/<id>   #/tokens/<id>
//   #/group/<key>   #/compare?a=run:1&b=run:5   #/plots
// Safety: text from trajectories (model, tool, env) only ever reaches the page through
// textContent (the el() helper) or attributes set one by one; no innerHTML anywhere, and the
// server's Content-Security-Policy runs scripts from this server alone.
"use strict";

const FILTERS = ["run", "step", "env", "status", "group", "reward_min", "reward_max", "length_min", "length_max"];
const PAGE = 50;
let timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

async function api(path) {
  const r = await fetch(path);
  if (!r.ok) throw new Error(`${r.status}: ${(await r.text()).slice(0, 300)}`);
  return r.json();
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "";
  if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(digits);
  return String(x);
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/list";
  const [path, query] = hash.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

function main() { return document.getElementById("main"); }

function show(...nodes) { main().replaceChildren(...nodes); }

function statusCell(s) { return el("span", { class: `status-${s}` }, s); }

async function render() {
  clearInterval(timer);
  timer = null;
  const { parts, params } = route();
  try {
    if (parts[0] === "t" && parts[1]) await renderTrajectory(parts[1]);
    else if (parts[0] === "tokens" && parts[1]) await renderTokens(parts[1]);
    else if (parts[0] === "group" && parts[1]) await renderGroup(parts[1]);
    else if (parts[0] === "compare") await renderCompare(params);
    else if (parts[0] === "plots") await renderPlots();
    else await renderList(params);
  } catch (e) {
    show(el("div", { class: "banner" }, `error: ${e.message}`));
  }
}

function follow(fn) {
  if (document.getElementById("follow").checked) timer = setInterval(fn, 3000);
}

// ---------------------------------------------------------------- list
async function renderList(params) {
  const info = await api("/api/info");
  document.getElementById("count").textContent = `${info.count} trajectories`;
  const form = el("form", { class: "filters", id: "filters" });
  const field = (name, label, input) => form.append(el("label", {}, label, input));
  const select = (name, values) => {
    const s = el("select", { name }, el("option", { value: "" }, "any"));
    for (const v of values) s.append(el("option", { value: v }, String(v)));
    s.value = params.get(name) || "";
    return s;
  };
  const input = (name, ph) => el("input", { name, placeholder: ph, value: params.get(name) || "" });
  if (info.runs.length > 1) field("run", "run", select("run", info.runs));
  field("step", "step", input("step", "3 or 2-5"));
  field("env", "env", select("env", info.envs));
  field("status", "status", select("status", info.statuses));
  field("group", "group", input("group", "group key"));
  field("reward_min", "reward ≥", input("reward_min", ""));
  field("reward_max", "reward ≤", input("reward_max", ""));
  field("length_min", "gen tokens ≥", input("length_min", ""));
  field("length_max", "gen tokens ≤", input("length_max", ""));
  form.append(el("button", { type: "submit" }, "Filter"), el("button", { type: "reset", id: "clear" }, "Clear"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v !== "") q.set(k, v);
    location.hash = `#/list?${q}`;
  });
  form.addEventListener("reset", (ev) => { ev.preventDefault(); location.hash = "#/list"; });
  const table = el("table", { id: "list" });
  const pager = el("div", { class: "pager" });
  show(el("h2", {}, "Trajectories"), form, pager, table);
  const load = async () => {
    const q = new URLSearchParams();
    for (const k of FILTERS) if (params.get(k)) q.set(k, params.get(k));
    const offset = Number(params.get("offset") || 0);
    q.set("offset", offset);
    q.set("limit", PAGE);
    const page = await api(`/api/trajectories?${q}`);
    const head = el("tr", {}, ["run", "step", "group", "env", "status", "reward", "advantage", "gen tokens", "turns", "id"].map((h) => el("th", {}, h)));
    const rows = page.items.map((t) => el("tr", { class: "row", "data-id": t.id, on: { click: () => { location.hash = `#/t/${encodeURIComponent(t.id)}`; } } },
      el("td", {}, t.run), el("td", {}, fmt(t.step)),
      el("td", {}, el("a", { href: `#/group/${encodeURIComponent(t.group)}`, on: { click: (e) => e.stopPropagation() } }, t.group)),
      el("td", {}, t.env), el("td", {}, statusCell(t.status)), el("td", {}, fmt(t.reward)),
      el("td", {}, fmt(t.advantage)), el("td", {}, t.length), el("td", {}, t.turns),
      el("td", {}, el("a", { href: `#/t/${encodeURIComponent(t.id)}` }, t.id.slice(0, 12)))));
    table.replaceChildren(head, ...rows);
    const nav = (off) => { const p = new URLSearchParams(params); p.set("offset", off); return `#/list?${p}`; };
    pager.replaceChildren(
      el("span", { id: "total" }, `${page.total} match${page.total === 1 ? "" : "es"}; showing ${page.total ? offset + 1 : 0}–${offset + page.items.length}`),
      offset > 0 ? el("a", { href: nav(Math.max(0, offset - PAGE)) }, "← previous") : "",
      offset + PAGE < page.total ? el("a", { href: nav(offset + PAGE) }, "next →") : "");
  };
  await load();
  follow(load);
}

// ---------------------------------------------------------------- one trajectory
function tabs(id, on) {
  return el("div", { class: "tabs" },
    el("a", { href: `#/t/${encodeURIComponent(id)}`, class: on === "t" ? "on" : "" }, "Conversation"),
    el("a", { href: `#/tokens/${encodeURIComponent(id)}`, class: on === "tokens" ? "on" : "" }, "Tokens"));
}

function contentNodes(content) {
  if (typeof content === "string") return [el("div", { class: "text" }, content)];
  const out = [];
  for (const part of content || []) {
    if (part && part.type === "text") out.push(el("div", { class: "text" }, part.text || ""));
    else if (part && part.type === "image_url") out.push(image(part.image_url && part.image_url.url));
    else out.push(el("pre", { class: "json" }, JSON.stringify(part, null, 2)));
  }
  return out;
}

function image(url) {
  // Only inline images (an env's screenshots); anything else is shown as text, never fetched.
  if (typeof url === "string" && /^data:image\/(png|jpeg|webp|gif);base64,[A-Za-z0-9+/=]+$/.test(url)) {
    const img = el("img", { class: "shot", alt: "screenshot" });
    img.src = url;
    return img;
  }
  return el("div", { class: "text muted" }, `[image: ${String(url).slice(0, 200)}]`);
}

function messageNode(m, turn) {
  const meta = [];
  if (m.name) meta.push(`name=${m.name}`);
  if (m.tool_call_id) meta.push(`tool_call_id=${m.tool_call_id}`);
  if (turn) meta.push(`finish=${turn.finish_reason} · version ${turn.weight_version} · llm ${fmt(turn.llm_time_s)} s · env ${fmt(turn.env_time_s)} s`);
  const node = el("div", { class: `msg role-${m.role}` },
    el("span", { class: "role" }, m.role), el("span", { class: "meta" }, meta.join(" · ")));
  if (m.reasoning_content) node.append(el("details", {}, el("summary", {}, "reasoning"), el("div", { class: "text" }, m.reasoning_content)));
  node.append(...contentNodes(m.content));
  for (const tc of m.tool_calls || []) {
    const fn = tc.function || {};
    const args = typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments, null, 1);
    node.append(el("div", { class: "toolcall" }, "→ ", el("span", { class: "name" }, fn.name || "?"), `(${args})`, el("span", { class: "meta" }, tc.id || "")));
  }
  return node;
}

function kv(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [k, v] of pairs) if (v !== null && v !== undefined && v !== "") dl.append(el("dt", {}, k), el("dd", {}, v));
  return dl;
}

async function renderTrajectory(id) {
  const { summary: s, record: r } = await api(`/api/trajectories/${encodeURIComponent(id)}`);
  const comps = Object.entries(r.reward_components || {}).map(([k, v]) => `${k}=${fmt(v)}`).join(", ");
  const versions = [...new Set((r.turns || []).map((t) => t.weight_version))].join(", ");
  const head = kv([
    ["status", statusCell(s.status)], ["error", r.error], ["reward", fmt(s.reward)], ["components", comps],
    ["advantages", (r.advantages || []).map((a) => fmt(a)).join(", ")], ["run", s.run], ["step", fmt(s.step)],
    ["group", el("a", { href: `#/group/${encodeURIComponent(s.group)}` }, s.group)], ["env", s.env],
    ["agent", s.agent], ["turns", s.turns], ["tokens", `${s.tokens} (${s.length} generated)`], ["weight versions", versions],
    ["timings", `wall ${fmt(r.wall_time_s)} s · llm ${fmt(r.llm_time_s)} s · env ${fmt(r.env_time_s)} s`],
    ["metrics", Object.entries(r.metrics || {}).map(([k, v]) => `${k}=${fmt(v)}`).join(", ")],
  ]);
  const conv = el("div", { id: "conversation" });
  let j = 0;
  for (const m of r.messages || []) conv.append(messageNode(m, m.role === "assistant" ? (r.turns || [])[j++] : null));
  const nodes = [el("h2", {}, `Trajectory ${id}`), tabs(id, "t"), head, el("h3", {}, "Conversation"), conv];
  const report = Object.assign({}, r.report || {});
  const gateway = report.gateway;
  delete report.gateway;
  const shots = Array.isArray(report.screenshots) ? report.screenshots : [];
  delete report.screenshots;
  if (shots.length) nodes.push(el("h3", {}, "Screenshots"), ...shots.map(image));
  if (Object.keys(report).length) nodes.push(el("h3", {}, "Report (grader / checker)"), el("pre", { class: "json", id: "report" }, JSON.stringify(report, null, 2)));
  if (gateway && Array.isArray(gateway.log)) {
    nodes.push(el("h3", {}, `Gateway log (${gateway.log.length} requests)`));
    for (const [i, entry] of gateway.log.entries()) {
      nodes.push(el("details", {}, el("summary", {}, `#${i + 1} · HTTP ${entry.status} · ${fmt(entry.latency_s)} s · segment ${fmt(entry.segment)}${entry.rewrite ? ` · rewrite ${entry.rewrite}` : ""}`),
        el("div", { class: "muted" }, "request"), el("pre", { class: "json" }, JSON.stringify(entry.request, null, 2)),
        el("div", { class: "muted" }, "response"), el("pre", { class: "json" }, JSON.stringify(entry.response, null, 2))));
    }
  }
  show(...nodes);
}

// ---------------------------------------------------------------- tokens
const MODES = {
  lp: "rollout logprob", tlp: "trainer logprob", diff: "|trainer − rollout|", adv: "advantage", version: "weight version", mask: "loss mask",
};

function heat(v) { // 0 (bad) .. 1 (good) -> red .. white
  const x = Math.max(0, Math.min(1, v));
  return `rgb(255, ${Math.round(120 + 135 * x)}, ${Math.round(120 + 135 * x)})`;
}

function tokenColor(t, mode, maxVersion) {
  if (mode === "mask") return t.mask ? "#d7f0dd" : "";
  if (!t.mask) return "";
  if (mode === "lp") return heat(Math.exp(t.lp));
  if (mode === "tlp") return t.tlp === null ? "" : heat(Math.exp(t.tlp));
  if (mode === "diff") return t.tlp === null ? "" : heat(1 - Math.min(1, Math.abs(t.tlp - t.lp) * 5));
  if (mode === "adv") { // green for positive, red for negative, white for 0
    if (t.adv === null) return "";
    const x = Math.min(1, Math.abs(t.adv));
    const light = Math.round(255 - 120 * x);
    return t.adv >= 0 ? `rgb(${light}, 255, ${light})` : `rgb(255, ${light}, ${light})`;
  }
  if (mode === "version") return `hsl(${(t.version * 67) % 360}, 70%, ${maxVersion ? 80 : 88}%)`;
  return "";
}

async function renderTokens(id) {
  const view = await api(`/api/trajectories/${encodeURIComponent(id)}/tokens`);
  const params = route().params;
  const mode = MODES[params.get("mode")] ? params.get("mode") : "lp";
  const picker = el("select", { id: "mode", on: { change: (e) => { location.hash = `#/tokens/${encodeURIComponent(id)}?mode=${e.target.value}`; } } },
    Object.entries(MODES).map(([k, label]) => el("option", { value: k }, label)));
  picker.value = mode;
  const info = el("div", { class: "tokinfo", id: "tokinfo" }, "hover a token");
  const legend = el("div", { class: "legend" }, "colour:", picker,
    el("span", {}, " mask 0 (prompt, env, tool, template): grey text"),
    el("span", {}, "mask 1 (trained on): underlined; red = low probability / large difference"),
    el("span", {}, el("span", { class: "swatch mm" }), " red outline: ledger ≠ re-render"));
  const nodes = [el("h2", {}, `Tokens of ${id}`), tabs(id, "tokens"), legend, info];
  if (!view.tokenizer) nodes.push(el("div", { class: "banner" }, "no tokenizer: tokens show as ids (agentrl view --tokenizer DIR)"));
  for (const seg of view.segments) {
    const maxVersion = Math.max(0, ...seg.tokens.map((t) => t.version));
    const c = seg.check;
    nodes.push(el("h3", {}, `Segment ${seg.index} · ${seg.tokens.length} tokens · advantage ${fmt(seg.advantage)}`));
    if (c.done && c.ok) nodes.push(el("div", { class: "banner ok" }, "ledger equals a re-render of the messages"));
    else if (c.done) nodes.push(el("div", { class: "banner check" }, `ledger differs from a re-render at token ${c.token_index}: expected ${JSON.stringify(c.expected)}, ledger has ${JSON.stringify(c.got)}${c.note ? ` (${c.note})` : ""}`));
    else nodes.push(el("div", { class: "muted" }, `no re-render check: ${c.why}`));
    const box = el("div", { class: "tokens", "data-segment": seg.index });
    seg.tokens.forEach((t, i) => {
      const span = el("span", { class: `tok m${t.mask}${c.done && !c.ok && c.token_index === i ? " mismatch" : ""}`, "data-i": i });
      span.textContent = t.text;
      const bg = tokenColor(t, mode, maxVersion);
      if (bg) span.style.backgroundColor = bg;
      const tip = `#${i} id=${t.id} mask=${t.mask} rollout_lp=${fmt(t.lp, 4)} trainer_lp=${t.tlp === null ? "-" : fmt(t.tlp, 4)} version=${t.version} advantage=${t.adv === null ? "-" : fmt(t.adv, 4)}`;
      span.setAttribute("title", tip);
      span.addEventListener("mouseenter", () => { info.textContent = `${tip} text=${JSON.stringify(t.text)}`; });
      box.append(span);
    });
    nodes.push(box);
  }
  show(...nodes);
}

// ---------------------------------------------------------------- group
async function renderGroup(key) {
  const g = await api(`/api/group?key=${encodeURIComponent(key)}`);
  const cards = g.members.map((m) => el("div", { class: "card" },
    el("div", {}, el("a", { href: `#/t/${encodeURIComponent(m.id)}` }, m.id.slice(0, 12)), " ", statusCell(m.status)),
    el("div", {}, `reward ${fmt(m.reward)} · `, el("span", { class: `adv ${m.advantage > 0 ? "pos" : m.advantage < 0 ? "neg" : ""}` }, `advantage ${fmt(m.advantage)}`)),
    el("div", { class: "muted" }, `${m.length} generated tokens · ${m.turns} turns`),
    m.error ? el("div", { class: "status-error_env" }, m.error) : "",
    el("div", { class: "text" }, m.final)));
  show(el("h2", {}, `Group ${key}`), el("div", { class: "group", id: "group" }, cards));
}

// ---------------------------------------------------------------- compare
async function renderCompare(params) {
  const info = await api("/api/info");
  const def = (i) => (info.runs.length > 1 ? `${info.runs[i] || info.runs[0]}:` : `${info.runs[0]}:`) + (info.steps.length ? info.steps[i ? info.steps.length - 1 : 0] : "");
  const a = params.get("a") || def(0);
  const b = params.get("b") || def(1);
  const ia = el("input", { name: "a", value: a });
  const ib = el("input", { name: "b", value: b });
  const form = el("form", { class: "filters" }, el("label", {}, "A (run:step)", ia), el("label", {}, "B (run:step)", ib), el("button", { type: "submit" }, "Compare"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); location.hash = `#/compare?a=${encodeURIComponent(ia.value)}&b=${encodeURIComponent(ib.value)}`; });
  const c = await api(`/api/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
  const side = (label, s) => el("div", {},
    el("h3", {}, `${label}: ${s.run || ""} step ${fmt(s.step)}`),
    kv([["trajectories", s.count], ["reward mean", fmt(s.reward_mean)], ["success rate", fmt(s.success_rate)], ["gen tokens mean", fmt(s.length_mean, 1)],
      ["statuses", Object.entries(s.statuses).map(([k, v]) => `${k}: ${v}`).join(", ")]]),
    el("table", {}, el("tr", {}, ["group", "status", "reward", "advantage", "gen tokens"].map((h) => el("th", {}, h))),
      s.items.map((t) => el("tr", { class: "row", on: { click: () => { location.hash = `#/t/${encodeURIComponent(t.id)}`; } } },
        el("td", {}, t.group), el("td", {}, statusCell(t.status)), el("td", {}, fmt(t.reward)), el("td", {}, fmt(t.advantage)), el("td", {}, t.length)))));
  show(el("h2", {}, "Compare two steps or two runs"), form, el("div", { class: "compare" }, side("A", c.a), side("B", c.b)));
}

// ---------------------------------------------------------------- plots
const PLOT_KEYS = [
  "rollout/reward_mean", "rollout/success_rate", "rollout/response_len_mean", "rollout/turns_mean",
  "eval/reward_mean", "timing/step_s", "timing/generate_s", "timing/logprob_s", "timing/update_s", "timing/sync_s",
];
const COLORS = ["#1a73e8", "#d93025", "#137333", "#9a6700", "#8e24aa", "#00838f"];

function plot(key, runs) {
  const series = Object.entries(runs).map(([run, rows]) => [run, rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]])]).filter(([, pts]) => pts.length);
  if (!series.length) return null;
  const all = series.flatMap(([, pts]) => pts);
  const [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  const [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  const W = 400, H = 180, L = 44, B = 20;
  const sx = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - 6);
  const sy = (y) => H - B - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (H - B - 8);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, "data-key": key });
  s.append(svg("line", { x1: L, y1: H - B, x2: W, y2: H - B, stroke: "#999" }), svg("line", { x1: L, y1: 0, x2: L, y2: H - B, stroke: "#999" }));
  const label = (x, y, text, anchor) => { const t = svg("text", { x, y, "font-size": 10, "text-anchor": anchor, fill: "#555" }); t.textContent = text; s.append(t); };
  label(L - 4, sy(y1) + 4, fmt(y1), "end");
  label(L - 4, sy(y0) + 4, fmt(y0), "end");
  label(L, H - 6, `step ${x0}`, "start");
  label(W - 4, H - 6, `${x1}`, "end");
  series.forEach(([run, pts], i) => {
    s.append(svg("polyline", { points: pts.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "), fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5 }));
    if (series.length > 1) label(W - 4, 12 + 12 * i, run, "end");
  });
  return el("div", { class: "plot" }, el("div", { class: "title" }, key), s);
}

async function renderPlots() {
  const draw = async () => {
    const { runs } = await api("/api/metrics");
    const keys = new Set(PLOT_KEYS);
    for (const rows of Object.values(runs)) for (const r of rows) for (const k of Object.keys(r)) if (/stale/.test(k)) keys.add(k);
    const plots = [...keys].map((k) => plot(k, runs)).filter(Boolean);
    show(el("h2", {}, "Run plots"), plots.length ? el("div", { class: "plots", id: "plots" }, plots) : el("div", { class: "muted" }, "no metrics.jsonl in the given run directories"));
  };
  await draw();
  follow(draw);
}

window.addEventListener("hashchange", render);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("follow").addEventListener("change", render);
  render();
});
