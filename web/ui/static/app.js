// dualflow UI: a dependency-free single-page app over /api/v1.
'use strict';

const API = '/api/v1';
const $ = (sel, root = document) => root.querySelector(sel);
const SVGNS = 'http://www.w3.org/2000/svg';

// h builds an element: h('td', {class: 'x', onclick: f}, 'text', child).
function h(tag, attrs, ...kids) {
  const svg = ['svg', 'g', 'line', 'path', 'circle', 'rect', 'text', 'polyline', 'title', 'marker'].includes(tag);
  const el = svg ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

// ---- API access, progress and errors ----
let pending = 0;
function busy(on) {
  pending += on ? 1 : -1;
  $('#progress').hidden = pending <= 0;
}
function token() { return localStorage.getItem('dualflow.token') || ''; }
function headers(extra) {
  const hd = Object.assign({}, extra || {});
  if (token()) hd.Authorization = 'Bearer ' + token();
  return hd;
}
class APIError extends Error {
  constructor(status, body) {
    super((body && body.message) || ('HTTP ' + status));
    this.status = status; this.field = body && body.field;
  }
}
async function api(path, opts = {}) {
  busy(true);
  try {
    const init = { method: opts.method || 'GET', headers: headers(opts.body ? { 'Content-Type': 'application/json' } : {}) };
    if (opts.body) init.body = JSON.stringify(opts.body);
    if (opts.signal) init.signal = opts.signal;
    const r = await fetch(API + path, init);
    if (opts.raw && r.ok) return r;
    const text = await r.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = { message: text }; }
    if (!r.ok) {
      if (r.status === 401) $('#token-dialog').showModal();
      throw new APIError(r.status, body);
    }
    return body;
  } finally { busy(false); }
}
function banner(msg, info) {
  const b = $('#banner');
  if (!msg) { b.hidden = true; b.textContent = ''; return; }
  b.textContent = msg; b.className = 'banner' + (info ? ' info' : ''); b.hidden = false;
}
function showError(e) {
  banner(e.field ? e.field + ': ' + e.message : e.message);
}

// ---- formatting ----
const fmtTime = ms => { const d = new Date(ms); return d.toISOString().replace('T', ' ').slice(0, 23); };
function fmtBytes(n) {
  const u = ['B', 'kB', 'MB', 'GB', 'TB']; let i = 0; n = Number(n) || 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}
const famBadge = v => h('span', { class: 'badge v' + v, title: 'IPv' + v }, 'IPv' + v);
function side(f, s) {
  const ns = f[s + '_namespace'], pod = f[s + '_pod'];
  return pod ? ns + '/' + pod : f[s + '_ip'];
}
function flowVerdict(f) {
  const vs = [f.ingress_verdict, f.egress_verdict];
  if (vs.includes('denied') || vs.includes('rejected')) return vs.includes('rejected') ? 'rejected' : 'denied';
  if (vs.includes('allowed')) return 'allowed';
  if (vs.includes('not_isolated')) return 'not_isolated';
  return 'unknown';
}
// parseEndpoint reads "kind:ns/name" (kind defaults to workload; ip:addr).
function parseEndpoint(s) {
  s = s.trim(); if (!s) return null;
  let kind = 'workload', rest = s;
  const i = s.indexOf(':');
  if (i > 0 && ['pod', 'workload', 'service', 'ip'].includes(s.slice(0, i))) { kind = s.slice(0, i); rest = s.slice(i + 1); }
  if (kind === 'ip') return { kind, name: rest };
  const j = rest.indexOf('/');
  return j < 0 ? { kind, name: rest } : { kind, namespace: rest.slice(0, j), name: rest.slice(j + 1) };
}
const epLabel = e => e.kind + ':' + (e.namespace ? e.namespace + '/' : '') + e.name;

// ---- drawer ----
function openDrawer(title, ...content) {
  $('#drawer-title').textContent = title;
  const body = $('#drawer-body'); body.replaceChildren(...content);
  $('#drawer').hidden = false;
  $('#drawer-close').focus();
}
function closeDrawer() { $('#drawer').hidden = true; }
function kv(obj) {
  const dl = h('dl', { class: 'kv' });
  for (const [k, v] of Object.entries(obj)) {
    if (v === '' || v === undefined || v === null) continue;
    dl.append(h('dt', {}, k), h('dd', {}, typeof v === 'object' ? JSON.stringify(v) : String(v)));
  }
  return dl;
}

// ---- Flows page ----
const flows = { next: '', rows: 0, follow: null };
function flowQuery() {
  const p = new URLSearchParams();
  const fam = $('#f-family').value, verdict = $('#f-verdict').value;
  if (fam) p.append('ip_version', fam);
  if (verdict) p.append('verdict', verdict);
  p.append('since', $('#f-since').value);
  for (const tok of $('#f-expr').value.trim().split(/\s+/)) {
    if (!tok) continue;
    const i = tok.indexOf('=');
    if (i <= 0) { throw new APIError(400, { message: 'want field=value, got ' + tok, field: 'filter' }); }
    p.append(tok.slice(0, i), tok.slice(i + 1));
  }
  return p;
}
function flowRow(f, fresh) {
  const v = flowVerdict(f);
  const tr = h('tr', { tabindex: 0, class: fresh ? 'fresh' : null, 'data-family': f.ip_version },
    h('td', {}, fmtTime(f.flow_end_ms)),
    h('td', {}, famBadge(f.ip_version)),
    h('td', { title: f.src_ip }, side(f, 'src')),
    h('td', { title: f.dst_ip }, f.service_name ? side(f, 'dst') + ' (svc ' + f.service_namespace + '/' + f.service_name + ')' : side(f, 'dst')),
    h('td', {}, f.protocol_name),
    h('td', {}, f.dst_port),
    h('td', {}, fmtBytes(f.bytes + f.reverse_bytes)),
    h('td', { class: 'verdict ' + v }, v));
  const open = () => openDrawer('Flow', h('p', {}, famBadge(f.ip_version), ' ', f.src_ip + ':' + f.src_port + ' → ' + f.dst_ip + ':' + f.dst_port), kv(f));
  tr.addEventListener('click', open);
  tr.addEventListener('keydown', e => { if (e.key === 'Enter') open(); });
  return tr;
}
async function loadFlows(more) {
  stopFollow();
  let p;
  try { p = flowQuery(); } catch (e) { showError(e); return; }
  if (more && flows.next) p.append('cursor', flows.next);
  p.append('limit', '100');
  const tbody = $('#flow-table tbody');
  try {
    const page = await api('/flows?' + p);
    banner('');
    if (!more) { tbody.replaceChildren(); flows.rows = 0; }
    for (const f of page.flows) tbody.append(flowRow(f));
    flows.rows += page.flows.length;
    flows.next = page.next || '';
    $('#flow-more').hidden = !flows.next;
    $('#flow-count').textContent = flows.rows + ' flows' + (flows.next ? ' (more available)' : '');
    if (!more) loadChart(p);
  } catch (e) { showError(e); }
  if ($('#f-follow').checked) startFollow();
}
async function loadChart(p) {
  const q = new URLSearchParams(p); q.delete('limit'); q.delete('cursor');
  try {
    const s = await api('/flows/summary?' + q);
    drawChart($('#flow-chart'), s);
  } catch (e) { $('#flow-chart').replaceChildren(h('span', { class: 'err' }, e.message)); }
}
function drawChart(box, s) {
  const W = 1000, H = 140, pad = 28;
  const byFam = { 4: [], 6: [] };
  for (const pt of s.series) (byFam[pt.ip_version] || []).push(pt);
  const all = s.series.map(p => p.time_ms);
  const t0 = Math.min(...all), t1 = Math.max(...all);
  const maxB = Math.max(1, ...s.series.map(p => p.bytes));
  const x = t => pad + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - 2 * pad);
  const y = b => H - pad + 8 - (b / maxB) * (H - pad - 8);
  const svg = h('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': 'bytes over time, IPv4 and IPv6' });
  svg.append(h('line', { x1: pad, y1: H - pad + 8, x2: W - pad, y2: H - pad + 8, stroke: '#cbd5e1' }));
  for (const fam of [4, 6]) {
    const pts = byFam[fam];
    if (!pts.length) continue;
    svg.append(h('polyline', { fill: 'none', stroke: fam === 4 ? '#2563eb' : '#9333ea', 'stroke-width': 2, points: pts.map(p => x(p.time_ms) + ',' + y(p.bytes)).join(' ') },
      h('title', {}, 'IPv' + fam + ' bytes')));
  }
  if (all.length) {
    svg.append(h('text', { x: pad, y: H - 4, 'font-size': 11, fill: '#64748b' }, fmtTime(t0).slice(11, 16)));
    svg.append(h('text', { x: W - pad, y: H - 4, 'font-size': 11, fill: '#64748b', 'text-anchor': 'end' }, fmtTime(t1).slice(11, 16)));
    svg.append(h('text', { x: pad, y: 12, 'font-size': 11, fill: '#64748b' }, 'max ' + fmtBytes(maxB) + ' / ' + s.step_seconds + 's'));
  }
  const totals = h('div', { class: 'totals' }, s.families.map(f => h('span', {}, famBadge(f.ip_version), ' ', fmtBytes(f.bytes), ' · ', f.flows + ' flows · ', h('span', { class: f.dropped ? 'verdict dropped' : 'muted' }, f.dropped + ' dropped'))));
  box.replaceChildren(totals, svg);
}
// Follow mode reads the server-sent events with fetch, so the bearer
// token can be sent (EventSource cannot set headers).
function stopFollow() { if (flows.follow) { flows.follow.abort(); flows.follow = null; } }
async function startFollow() {
  stopFollow();
  let p;
  try { p = flowQuery(); } catch (e) { showError(e); return; }
  p.delete('since'); p.append('follow', 'true');
  const ctl = new AbortController(); flows.follow = ctl;
  try {
    const r = await fetch(API + '/flows?' + p, { headers: headers(), signal: ctl.signal });
    if (!r.ok) { const b = await r.json().catch(() => ({})); throw new APIError(r.status, b); }
    banner('Following new flows…', true);
    const reader = r.body.getReader(); const dec = new TextDecoder(); let buf = '';
    const tbody = $('#flow-table tbody');
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const chunk = buf.slice(0, i); buf = buf.slice(i + 2);
        let ev = 'message', data = '';
        for (const line of chunk.split('\n')) {
          if (line.startsWith('event:')) ev = line.slice(6).trim();
          else if (line.startsWith('data:')) data += line.slice(5);
        }
        if (ev === 'flow') {
          tbody.prepend(flowRow(JSON.parse(data), true));
          flows.rows++;
          while (tbody.rows.length > 500) tbody.deleteRow(-1);
          $('#flow-count').textContent = flows.rows + ' flows (live)';
        } else if (ev === 'error' || ev === 'lag') banner(JSON.parse(data).message);
      }
    }
  } catch (e) { if (e.name !== 'AbortError') showError(e); }
  if (flows.follow === ctl) { flows.follow = null; banner(''); }
}

// ---- Service map ----
async function loadMap() {
  const f = $('#map-form');
  const p = new URLSearchParams();
  if (f.ip_version.value) p.append('ip_version', f.ip_version.value);
  p.append('since', f.since.value);
  for (const tok of f.expr.value.trim().split(/\s+/)) {
    const i = tok.indexOf('='); if (i > 0) p.append(tok.slice(0, i), tok.slice(i + 1));
  }
  try {
    const m = await api('/servicemap?' + p);
    banner('');
    drawMap($('#map'), m);
  } catch (e) { showError(e); }
}
function drawMap(box, m) {
  const W = 1100, H = 640, cx = W / 2, cy = H / 2, R = Math.min(W, H) / 2 - 80;
  const pos = {};
  m.nodes.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(1, m.nodes.length) - Math.PI / 2;
    pos[n.id] = [cx + R * Math.cos(a), cy + R * Math.sin(a)];
  });
  const maxB = Math.max(1, ...m.edges.map(e => e.bytes));
  const svg = h('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'service map' });
  for (const e of m.edges) {
    const [x1, y1] = pos[e.src], [x2, y2] = pos[e.dst];
    // IPv4 and IPv6 edges of a pair bend to opposite sides.
    const bend = e.ip_version === 4 ? 0.12 : -0.12;
    const mx = (x1 + x2) / 2 - (y2 - y1) * bend, my = (y1 + y2) / 2 + (x2 - x1) * bend;
    const dropped = e.verdict === 'dropped';
    svg.append(h('path', {
      d: `M${x1},${y1} Q${mx},${my} ${x2},${y2}`, fill: 'none',
      stroke: dropped ? '#dc2626' : (e.ip_version === 4 ? '#2563eb' : '#9333ea'),
      'stroke-width': 1.5 + 5 * (e.bytes / maxB), 'stroke-dasharray': dropped ? '6 4' : null, opacity: 0.8,
      class: 'edge v' + e.ip_version + ' ' + e.verdict,
    }, h('title', {}, `${e.src} → ${e.dst} IPv${e.ip_version} ${e.verdict}: ${e.flows} flows, ${fmtBytes(e.bytes)}`)));
  }
  for (const n of m.nodes) {
    const [x, y] = pos[n.id];
    const fill = n.kind === 'service' ? '#0d9488' : n.kind === 'external' ? '#94a3b8' : '#334155';
    const g = h('g', { class: 'node ' + n.kind },
      h('circle', { cx: x, cy: y, r: 16, fill },
        h('title', {}, n.id + ' (' + n.kind + ', IPv' + n.families.join('+IPv') + ')')),
      h('text', { x, y: y + 30, 'text-anchor': 'middle' }, n.id));
    n.families.forEach((f, i) => g.append(h('circle', { cx: x + 12 + i * 8, cy: y - 12, r: 4, fill: f === 4 ? '#2563eb' : '#9333ea' })));
    svg.append(g);
  }
  if (!m.nodes.length) svg.append(h('text', { x: cx, y: cy, 'text-anchor': 'middle' }, 'No flows in this window.'));
  box.replaceChildren(svg);
}

// ---- Reachability ----
async function runReach(ev) {
  ev && ev.preventDefault();
  const f = $('#reach-form');
  const body = {
    sources: f.sources.value.split('\n').map(parseEndpoint).filter(Boolean),
    destinations: f.destinations.value.split('\n').map(parseEndpoint).filter(Boolean),
    protocol: f.protocol.value, port: Number(f.port.value) || 0, since: f.since.value,
  };
  const btn = f.querySelector('button[type=submit]'); btn.disabled = true;
  $('#reach-summary').textContent = 'Checking ' + body.sources.length + ' × ' + body.destinations.length + ' pairs over both families…';
  try {
    const m = await api('/reachability', { method: 'POST', body });
    banner('');
    $('#reach-summary').textContent = `${m.asymmetric} of ${m.sources.length * m.destinations.length} pairs differ between IPv4 and IPv6 (outlined) · ${m.elapsed_ms} ms. Click a cell for a dual trace.`;
    const out = $('#reach-out'); out.replaceChildren();
    for (const fam of ['4', '6']) out.append(matrix(m, fam, body));
  } catch (e) { showError(e); $('#reach-summary').textContent = ''; }
  btn.disabled = false;
}
function matrix(m, fam, req) {
  const table = h('table', { class: 'reach', 'data-family': fam });
  table.append(h('tr', {}, h('th', {}, 'from \\ to'), m.destinations.map(d => h('th', {}, epLabel(d)))));
  m.sources.forEach((s, i) => {
    const tr = h('tr', {}, h('th', { class: 'rowh' }, epLabel(s)));
    m.destinations.forEach((d, j) => {
      const c = m.cells[i][j], f = c.families[fam];
      const sub = f.observed.flows ? f.observed.flows + ' flows' + (f.observed.verdicts && f.observed.verdicts.dropped ? ', ' + f.observed.verdicts.dropped + ' dropped' : '') : 'no flows';
      const td = h('td', {
        class: 'cell ' + f.outcome + (c.asymmetric ? ' asym' : ''), tabindex: 0,
        title: (c.reasons || []).join('; ') || 'families agree',
        'data-outcome': f.outcome, 'data-asym': c.asymmetric ? 'true' : 'false',
      }, h('span', { class: 'verdict ' + f.outcome }, f.outcome), h('span', { class: 'sub' }, f.policy ? 'policy ' + f.policy.verdict : ''), h('span', { class: 'sub' }, sub));
      const go = () => cellTrace(s, d, req, c);
      td.addEventListener('click', go);
      td.addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); go(); } });
      tr.append(td);
    });
    table.append(tr);
  });
  return h('div', { class: 'matrix' }, h('h2', {}, famBadge(Number(fam)), 'IPv' + fam), table);
}
async function cellTrace(src, dst, req, cell) {
  const info = h('div', {}, h('p', {}, epLabel(src) + ' → ' + epLabel(dst)),
    (cell.reasons || []).length ? h('p', { class: 'verdict unavailable' }, cell.reasons.join('; ')) : null,
    h('p', { class: 'muted', id: 'cell-trace-status' }, 'Running a dual trace…'));
  openDrawer('Reachability', info);
  const out = h('div', { class: 'traces' });
  try {
    const r = await api('/traceflow', { method: 'POST', body: { source: src, destination: dst, protocol: req.protocol, port: req.port, family: 0 } });
    $('#cell-trace-status').textContent = 'Dual trace done.';
    renderTraces(out, r);
  } catch (e) { $('#cell-trace-status').textContent = e.message; $('#cell-trace-status').className = 'err'; }
  info.append(out);
}

// ---- Traceflow ----
async function runTrace(ev) {
  ev.preventDefault();
  const f = $('#trace-form');
  const body = { source: parseEndpoint(f.source.value), destination: parseEndpoint(f.destination.value), protocol: f.protocol.value, port: Number(f.port.value) || 0, family: Number(f.family.value) };
  const out = $('#trace-out');
  const btn = f.querySelector('button[type=submit]'); btn.disabled = true;
  out.replaceChildren(h('p', { class: 'muted' }, 'Tracing… injecting a packet per family and collecting observations.'));
  try {
    const r = await api('/traceflow', { method: 'POST', body });
    banner('');
    renderTraces(out, r);
  } catch (e) { showError(e); out.replaceChildren(); }
  btn.disabled = false;
}
function renderTraces(out, r) {
  out.replaceChildren();
  for (const t of r.results) {
    const path = h('ol', { class: 'path' });
    for (const hop of t.hops || []) {
      path.append(h('li', { class: hop.action === 'dropped' ? 'drop' : '' },
        h('span', { class: 'node' }, hop.node), ' · ', hop.component, ' · ',
        h('span', { class: 'verdict ' + hop.action }, hop.action),
        hop.detail ? ' · ' + hop.detail : '',
        hop.policy ? h('span', { class: hop.action === 'dropped' ? 'pol' : 'muted' }, ' · policy ' + hop.policy) : ''));
    }
    out.append(h('div', { class: 'trace v' + t.family, 'data-family': t.family, 'data-outcome': t.outcome },
      h('h2', {}, famBadge(t.family), ' ', t.src_ip || '', ' → ', t.dst_ip || ''),
      h('p', {}, h('span', { class: 'verdict ' + t.outcome }, t.outcome),
        t.drop_node ? ' at ' + t.drop_node : '', t.policy ? ' by ' + t.policy : ''),
      path));
  }
  for (const [fam, msg] of Object.entries(r.errors || {})) {
    out.append(h('div', { class: 'trace v' + fam }, h('h2', {}, famBadge(Number(fam))), h('p', { class: 'err' }, msg)));
  }
}

// ---- Audit ----
async function loadAudit() {
  const list = $('#audit-list');
  try {
    const r = await api('/audit');
    banner('');
    $('#audit-summary').textContent = `${r.findings.length} findings, ${r.dual_stack} dual-stack gaps (listed first).`;
    list.replaceChildren(...r.findings.map(f => h('li', { class: f.kind.startsWith('dual-stack-') ? 'dual' : '' },
      h('div', { class: 'kind' }, f.kind, f.port ? ' · ' + (f.protocol || '') + ' ' + f.port : ''),
      h('div', {}, f.message),
      h('div', { class: 'objs' }, (f.objects || []).map(o => o.kind + ' ' + (o.namespace ? o.namespace + '/' : '') + o.name + (o.direction ? ' (' + o.direction + (o.rule !== undefined ? ' rule ' + o.rule : '') + ')' : '')).join(' · ')))));
  } catch (e) { $('#audit-summary').textContent = ''; list.replaceChildren(h('li', { class: 'err' }, e.message)); }
}

// ---- SQL ----
async function runSQL(ev) {
  ev && ev.preventDefault();
  const q = $('#sql-text').value;
  const st = $('#sql-status'); st.textContent = 'Running…'; st.className = 'muted';
  try {
    const r = await api('/sql', { method: 'POST', body: { query: q } });
    banner('');
    $('#sql-table thead').replaceChildren(h('tr', {}, r.columns.map(c => h('th', { title: c.type }, c.name))));
    $('#sql-table tbody').replaceChildren(...r.rows.map(row => h('tr', {}, row.map(v => h('td', {}, typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v))))));
    st.textContent = `${r.rows.length} rows in ${(r.elapsed_seconds * 1000).toFixed(0)} ms (limits: ${r.limits.max_rows} rows, ${r.limits.max_execution_seconds} s)`;
  } catch (e) { st.textContent = e.message; st.className = 'err'; }
}
async function downloadCSV() {
  try {
    const r = await api('/sql', { method: 'POST', body: { query: $('#sql-text').value, format: 'csv' }, raw: true });
    const blob = await r.blob();
    const a = h('a', { href: URL.createObjectURL(blob), download: 'dualflow-query.csv' });
    document.body.append(a); a.click(); a.remove();
  } catch (e) { $('#sql-status').textContent = e.message; $('#sql-status').className = 'err'; }
}

// ---- routing ----
const loaders = { flows: () => loadFlows(false), map: loadMap, reach: () => {}, trace: () => {}, audit: loadAudit, sql: () => {} };
const loaded = {};
function route() {
  const page = (location.hash.match(/^#\/(\w+)/) || [])[1] || 'flows';
  const name = loaders[page] ? page : 'flows';
  document.querySelectorAll('.page').forEach(s => { s.hidden = s.id !== 'page-' + name; });
  document.querySelectorAll('#nav a').forEach(a => a.classList.toggle('active', a.dataset.page === name));
  if (name !== 'flows') stopFollow();
  closeDrawer(); banner('');
  document.title = 'dualflow · ' + $('#nav a[data-page=' + name + ']').textContent;
  if (!loaded[name] || name === 'audit') { loaded[name] = true; loaders[name](); }
}

async function whoami() {
  try {
    const w = await api('/whoami');
    $('#whoami').textContent = w.auth ? w.name + ' (' + w.role + ')' : 'no auth (loopback)';
  } catch (e) { $('#whoami').textContent = ''; }
}

function init() {
  $('#flow-filter').addEventListener('submit', e => { e.preventDefault(); loadFlows(false); });
  for (const id of ['#f-family', '#f-verdict', '#f-since']) $(id).addEventListener('change', () => loadFlows(false));
  $('#f-follow').addEventListener('change', e => { if (e.target.checked) startFollow(); else { stopFollow(); banner(''); } });
  $('#flow-more').addEventListener('click', () => loadFlows(true));
  $('#map-form').addEventListener('submit', e => { e.preventDefault(); loadMap(); });
  $('#reach-form').addEventListener('submit', runReach);
  $('#trace-form').addEventListener('submit', runTrace);
  $('#sql-form').addEventListener('submit', runSQL);
  $('#sql-csv').addEventListener('click', downloadCSV);
  $('#sql-text').addEventListener('keydown', e => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) runSQL(e); });
  $('#drawer-close').addEventListener('click', closeDrawer);
  document.addEventListener('keydown', e => {
    if (e.key === 'Escape') closeDrawer();
    if (e.key === '/' && !['INPUT', 'TEXTAREA', 'SELECT'].includes(document.activeElement.tagName)) {
      const inp = $('.page:not([hidden]) input, .page:not([hidden]) textarea'); if (inp) { e.preventDefault(); inp.focus(); }
    }
  });
  $('#token-btn').addEventListener('click', () => { $('#token-input').value = token(); $('#token-dialog').showModal(); });
  $('#token-dialog').addEventListener('close', () => {
    const v = $('#token-dialog').returnValue;
    if (v === 'save') localStorage.setItem('dualflow.token', $('#token-input').value.trim());
    if (v === 'clear') localStorage.removeItem('dualflow.token');
    if (v) { whoami(); Object.keys(loaded).forEach(k => delete loaded[k]); route(); }
  });
  window.addEventListener('hashchange', route);
  whoami();
  route();
}
document.addEventListener('DOMContentLoaded', init);
