// dualflow UI: a single-page app over /api/v1. The graph (cytoscape), the
// charts (uPlot) and the Sankey (d3-sankey) are vendored, pinned npm
// packages (static/vendor).
'use strict';

const API = '/api/v1';
const $ = (sel, root = document) => root.querySelector(sel);
const SVGNS = 'http://www.w3.org/2000/svg';
const C4 = '#2563eb', C6 = '#9333ea', CDROP = '#dc2626';

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
// APIError reads both error shapes: {message, field} (4xx JSON) and the
// older {error} / {errors: {field: message}} bodies.
class APIError extends Error {
  constructor(status, body) {
    let msg = body && (body.message || body.error), field = body && body.field;
    if (!msg && body && body.errors && typeof body.errors === 'object') {
      const [k, v] = Object.entries(body.errors)[0] || [];
      if (k) { field = field || k; msg = String(v); }
    }
    super(msg || ('HTTP ' + status));
    this.status = status; this.field = field || '';
    this.detail = (body && body.detail) || '';
  }
}
async function api(path, opts = {}) {
  busy(true);
  try {
    // opts.body is sent as JSON; opts.text as is, of type opts.type (the
    // what-if's YAML).
    const type = opts.text !== undefined ? opts.type || 'text/plain' : opts.body ? 'application/json' : '';
    const init = { method: opts.method || 'GET', headers: headers(type ? { 'Content-Type': type } : {}) };
    if (opts.body) init.body = JSON.stringify(opts.body);
    if (opts.text !== undefined) init.body = opts.text;
    if (opts.signal) init.signal = opts.signal;
    const r = await fetch(API + path, init);
    if (opts.raw && r.ok) return r;
    const text = await r.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = { message: text.trim() }; }
    if (!r.ok) {
      if (r.status === 401 && !$('#token-dialog').open) {
        // The server says which token it wants (a local request without one
        // is a viewer; SQL and traces need the operator token's file).
        $('#token-why').textContent = (body && body.message) || '';
        $('#token-dialog').showModal();
      }
      const err = new APIError(r.status, body);
      err.retryAfter = Number(r.headers.get('Retry-After')) || 0;
      throw err;
    }
    return body;
  } finally { busy(false); }
}
// banner shows msg; detail (the store's whole answer, the SQL it refused)
// goes in a details line under it.
function banner(msg, info, detail) {
  const b = $('#banner');
  if (!msg) { b.hidden = true; b.textContent = ''; return; }
  b.textContent = msg; b.className = 'banner' + (info ? ' info' : ''); b.hidden = false;
  if (detail) {
    const d = document.createElement('details'), s = document.createElement('summary'), pre = document.createElement('pre');
    s.textContent = 'details'; pre.textContent = detail;
    d.append(s, pre); b.append(d);
  }
}
// errText names the field once: "dst_ip: want an address" (a message that
// already starts with its field is not prefixed again).
function errText(e) {
  const m = e.message || String(e);
  return e.field && !m.startsWith(e.field) ? e.field + ': ' + m : m;
}
// showError puts an error in the banner, the one place errors show.
function showError(e) { banner(errText(e), false, e.detail); }

// ---- formatting ----
const tzName = (() => {
  const p = new Intl.DateTimeFormat(undefined, { timeZoneName: 'short' }).formatToParts(new Date()).find(x => x.type === 'timeZoneName');
  return p ? p.value : 'local';
})();
const pad2 = n => String(n).padStart(2, '0');
// fmtTime shows local time; the zone is in the column header (tzName).
function fmtTime(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}.${String(d.getMilliseconds()).padStart(3, '0')}`;
}
const fmtTimeZ = ms => fmtTime(ms) + ' ' + tzName;
function fmtBytes(n) {
  const u = ['B', 'kB', 'MB', 'GB', 'TB']; let i = 0; n = Number(n) || 0;
  while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i ? n.toFixed(1) : Math.round(n)) + ' ' + u[i];
}
function fmtCount(n) {
  n = Number(n) || 0;
  if (n >= 1e6) return (n / 1e6).toFixed(1) + 'M';
  if (n >= 1e3) return (n / 1e3).toFixed(1) + 'k';
  return String(Math.round(n * 10) / 10);
}
const famBadge = v => h('span', { class: 'badge v' + v, title: 'IPv' + v }, 'IPv' + v);
// ICMP carries type and code in dst_port as type<<8 | code (IPFIX icmpTypeCode).
const icmp4 = { 0: 'echo reply', 3: 'destination unreachable', 5: 'redirect', 8: 'echo request', 11: 'time exceeded', 12: 'parameter problem', 13: 'timestamp', 14: 'timestamp reply' };
const icmp6 = { 1: 'destination unreachable', 2: 'packet too big', 3: 'time exceeded', 4: 'parameter problem', 128: 'echo request', 129: 'echo reply', 133: 'router solicitation', 134: 'router advertisement', 135: 'neighbor solicitation', 136: 'neighbor advertisement' };
function isICMP(f) { return /^icmp/i.test(f.protocol_name || ''); }
function icmpName(f) {
  const type = (f.dst_port >> 8) & 255, code = f.dst_port & 255;
  const names = /v6$/i.test(f.protocol_name) || f.ip_version === 6 ? icmp6 : icmp4;
  return (names[type] || 'type ' + type) + (code ? ' code ' + code : '');
}
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
function flowPolicy(f) { return [...new Set([f.egress_policy, f.ingress_policy].filter(Boolean))].join(', '); }
// dropReason says which direction's policy dropped the flow.
function dropReason(f) {
  const out = [];
  for (const [dir, v, p] of [['egress', f.egress_verdict, f.egress_policy], ['ingress', f.ingress_verdict, f.ingress_policy]]) {
    if (v === 'denied' || v === 'rejected') out.push(dir + ' ' + v + (p ? ' by ' + p : ' (default deny)'));
  }
  return out.join('; ');
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
// hashURL builds "#/page?k=v" from an object (empty values left out).
function hashURL(page, params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== '' && v !== undefined && v !== null) p.append(k, v);
  const q = p.toString();
  return '#/' + page + (q ? '?' + q : '');
}
const link = (href, text, title) => h('a', { href, title, class: 'act' }, text);

// ---- drawer ----
// openDrawer shows content, leaving out the null and false parts a
// caller passes for what a record lacks (replaceChildren would print them).
function openDrawer(title, ...content) {
  $('#drawer-title').textContent = title;
  const body = $('#drawer-body'); body.replaceChildren(...content.flat().filter(x => x !== null && x !== undefined && x !== false));
  $('#drawer').hidden = false;
  $('#drawer-close').focus();
}
function closeDrawer() { $('#drawer').hidden = true; }
function kv(obj) {
  const dl = h('dl', { class: 'kv' });
  for (const [k, v] of Object.entries(obj)) {
    if (v === '' || v === undefined || v === null) continue;
    dl.append(h('dt', {}, k), h('dd', {}, v instanceof Node ? v : typeof v === 'object' ? JSON.stringify(v) : String(v)));
  }
  return dl;
}

// ---- live view: names for autocomplete and default forms ----
// The catalog is the live Kubernetes view (/catalog), or when the server
// has none what the service map and the latest flows name; refreshed at
// most once a minute.
const catalog = { at: 0, sample: null, workloads: [], services: [], pods: [], namespaces: [], ports: [], backends: [] };
let catalogLoading = null;
function loadCatalog(force) {
  if (!force && Date.now() - catalog.at < 60000) return catalogLoading || Promise.resolve(catalog);
  catalog.at = Date.now();
  catalogLoading = fetchCatalog();
  return catalogLoading;
}
async function fetchCatalog() {
  try { return liveCatalog(await api('/catalog')); } catch (e) { /* no live view: names from recent flows */ }
  let sample = null;
  const w = new Set(), s = new Set(), p = new Set(), ns = new Set(), ports = new Map(), back = new Map();
  try {
    const [m, fl] = await Promise.all([api('/servicemap?since=24h'), api('/flows?since=1h&limit=1000')]);
    for (const n of m.nodes) {
      if (n.kind === 'workload') { w.add(n.id); ns.add(n.id.split('/')[0]); }
      if (n.kind === 'service') { s.add(n.id.slice(4)); ns.add(n.id.slice(4).split('/')[0]); }
    }
    for (const f of fl.flows) {
      for (const sd of ['src', 'dst']) {
        if (f[sd + '_pod']) { p.add(f[sd + '_namespace'] + '/' + f[sd + '_pod']); ns.add(f[sd + '_namespace']); }
      }
      if (!sample && f.src_pod && (f.service_name || f.dst_pod) && !isICMP(f) && /^(TCP|UDP|SCTP)$/.test(f.protocol_name)) sample = f;
      if (f.dst_port && !isICMP(f)) ports.set(f.dst_port, (ports.get(f.dst_port) || 0) + 1);
      if (f.service_name && f.dst_pod) {
        const svc = f.service_namespace + '/' + f.service_name;
        const be = f.dst_workload ? f.dst_namespace + '/' + f.dst_workload : f.dst_namespace + '/' + f.dst_pod;
        back.set(svc + ' ' + be + ' ' + f.ip_version, { svc, backend: be, ip_version: f.ip_version });
      }
    }
  } catch (e) { catalog.at = 0; return catalog; }
  const sorted = x => [...x].sort();
  Object.assign(catalog, {
    workloads: sorted(w), services: sorted(s), pods: sorted(p), namespaces: sorted(ns),
    ports: [...ports.entries()].sort((a, b) => b[1] - a[1]).map(x => x[0]), backends: [...back.values()], sample,
  });
  fillDatalists();
  return catalog;
}
// liveCatalog fills the catalog from GET /catalog: every pod, workload and
// Service, with or without flows; ports are the Services' (most used
// first), the trace sample a pod to a Service of another workload.
function liveCatalog(c) {
  const nn = x => x.namespace + '/' + x.name;
  const ports = new Map();
  for (const s of c.services) for (const p of s.ports) ports.set(p.port, (ports.get(p.port) || 0) + 1);
  let sample = null;
  const pod = c.pods.find(p => p.workload && !p.host_network) || c.pods[0];
  const svc = pod && c.services.find(s => s.ports.length && s.families.length && !(s.namespace === pod.namespace && s.name === pod.workload));
  if (pod && svc) {
    sample = { src_namespace: pod.namespace, src_pod: pod.name, service_namespace: svc.namespace, service_name: svc.name,
      protocol_name: svc.ports[0].protocol, service_port: svc.ports[0].port };
  }
  Object.assign(catalog, {
    workloads: [...new Set(c.workloads.map(nn))], services: c.services.map(nn), pods: c.pods.map(nn), namespaces: c.namespaces,
    ports: [...ports.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]).map(x => x[0]), backends: [], sample,
  });
  fillDatalists();
  return catalog;
}
function fillDatalists() {
  const opts = (id, vals) => $('#' + id).replaceChildren(...vals.map(v => h('option', { value: v })));
  opts('dl-endpoints', [...catalog.workloads.map(x => 'workload:' + x), ...catalog.services.map(x => 'service:' + x), ...catalog.pods.map(x => 'pod:' + x)]);
  opts('dl-filter', [...catalog.namespaces.map(x => 'namespace=' + x), ...catalog.workloads.map(x => 'workload=' + x),
    ...catalog.services.map(x => 'service=' + x), ...catalog.pods.map(x => 'pod=' + x), ...catalog.ports.map(x => 'dst_port=' + x)]);
  opts('dl-ports', catalog.ports.map(String));
  opts('dl-namespaces', catalog.namespaces);
  mapScopes();
}

// ---- Flows page ----
// Page state (family, verdict, window, filter) lives in the URL:
// #/flows?ip_version=6&verdict=dropped&since=1h&src_workload=shop/web
const flows = { next: '', rows: 0, follow: null, gen: 0 };
const flowFormKeys = ['ip_version', 'verdict', 'since'];
// applyFlowParams puts URL parameters into the filter form.
function applyFlowParams(params) {
  $('#f-family').value = params.get('ip_version') || '';
  $('#f-verdict').value = params.get('verdict') || '';
  $('#f-since').value = params.get('since') || '1h';
  $('#f-probes').checked = params.get('probes') === 'include';
  const expr = [];
  for (const [k, v] of params) if (!flowFormKeys.includes(k) && k !== 'follow' && !(k === 'probes' && v === 'include')) expr.push(k + '=' + v);
  $('#f-expr').value = expr.join(' ');
}
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
  // Trace probes' rows are left out unless the toggle (or the filter) asks.
  if ($('#f-probes').checked && !p.has('probes')) p.append('probes', 'include');
  return p;
}
// keepFlowURL records the filters in the address bar without reloading.
function keepFlowURL(p) {
  const url = '#/flows' + (p.toString() ? '?' + p : '');
  if (location.hash !== url) { history.replaceState(null, '', url); current.hash = url; }
}
// flowColumns are the flow table's columns: key (data-col and the
// localStorage choice), header, cell, and whether a fresh browser shows it.
// The default set fits 1000 px: the source port tells apart connections
// that would otherwise look like duplicates, and Verdict is never cut off.
const flowColumns = [
  { key: 'time', head: 'Time', on: true, cell: f => h('td', { class: 'time', title: new Date(f.flow_end_ms).toString() }, fmtTime(f.flow_end_ms)) },
  { key: 'family', head: 'Fam', on: true, cell: f => h('td', {}, famBadge(f.ip_version)) },
  { key: 'src', head: 'Source', on: true, cell: f => h('td', { title: f.src_ip }, side(f, 'src')) },
  { key: 'src_port', head: 'Src port', on: true, cell: f => h('td', { class: 'num', title: isICMP(f) ? 'ICMP echo identifier' : null }, f.src_port || '') },
  { key: 'dst', head: 'Destination', on: true, cell: f => h('td', { title: f.dst_ip + (f.service_name ? ' via Service ' + f.service_namespace + '/' + f.service_name : '') }, side(f, 'dst'), f.service_name ? h('span', { class: 'muted' }, ' svc ' + f.service_name) : '') },
  { key: 'proto', head: 'Proto', on: true, cell: f => h('td', { class: 'proto' }, isICMP(f) ? h('span', { title: 'type ' + (f.dst_port >> 8) + ' code ' + (f.dst_port & 255) }, f.protocol_name + ' ' + icmpName(f)) : f.protocol_name) },
  { key: 'dst_port', head: 'Port', on: true, cell: f => h('td', { class: 'num' }, isICMP(f) ? '' : f.dst_port) },
  { key: 'verdict', head: 'Verdict', on: true, cell: f => { const v = flowVerdict(f); return h('td', { class: 'verdict ' + v }, v); } },
  { key: 'bytes', head: 'Bytes', on: true, title: 'both directions', cell: f => h('td', { class: 'num' }, fmtBytes(f.bytes + f.reverse_bytes)) },
  { key: 'bytes_out', head: 'Bytes →', title: 'source to destination', cell: f => h('td', { class: 'num' }, fmtBytes(f.bytes)) },
  { key: 'bytes_in', head: 'Bytes ←', title: 'destination to source (replies)', cell: f => h('td', { class: 'num' }, fmtBytes(f.reverse_bytes)) },
  { key: 'packets', head: 'Packets', title: 'source to destination / replies', cell: f => h('td', { class: 'num' }, f.packets + ' / ' + f.reverse_packets) },
  { key: 'src_node', head: 'Src node', cell: f => h('td', {}, f.src_node || '') },
  { key: 'dst_node', head: 'Dst node', cell: f => h('td', {}, f.dst_node || '') },
  { key: 'tcp_state', head: 'TCP state', cell: f => h('td', {}, f.tcp_state || '') },
  { key: 'end_reason', head: 'End reason', cell: f => h('td', {}, f.end_reason || '') },
  { key: 'policy', head: 'Policy', cell: f => h('td', { class: 'policy' }, flowPolicy(f)) },
  { key: 'reason', head: 'Drop reason', cell: f => h('td', { class: 'reason' }, dropReason(f)) },
];
const flowColsKey = 'dualflow.flowColumns';
// shownColumns is the chosen set (localStorage), else the default one.
function shownColumns() {
  try {
    const v = JSON.parse(localStorage.getItem(flowColsKey) || 'null');
    if (Array.isArray(v)) return new Set(v);
  } catch (e) { /* a bad value: the default set */ }
  return new Set(flowColumns.filter(c => c.on).map(c => c.key));
}
// setColumn shows or hides one column in the table and remembers the choice.
function setColumn(key, on) {
  const cols = shownColumns();
  if (on) cols.add(key); else cols.delete(key);
  localStorage.setItem(flowColsKey, JSON.stringify(flowColumns.map(c => c.key).filter(k => cols.has(k))));
  document.querySelectorAll(`#flow-table [data-col="${key}"]`).forEach(c => { c.hidden = !on; });
}
// drawFlowColumns builds the header and the chooser's checkboxes.
function drawFlowColumns() {
  const cols = shownColumns();
  $('#flow-table thead').replaceChildren(h('tr', {}, flowColumns.map(c => h('th', { 'data-col': c.key, id: c.key === 'time' ? 'flow-time-h' : null, title: c.title, hidden: !cols.has(c.key) },
    c.key === 'time' ? 'Time (' + tzName + ')' : c.head))));
  $('#flow-cols-list').replaceChildren(...flowColumns.map(c => h('label', {},
    h('input', { type: 'checkbox', value: c.key, checked: cols.has(c.key), onchange: e => setColumn(c.key, e.target.checked) }), ' ', c.head)));
}
function flowRow(f, fresh) {
  const cols = shownColumns();
  const tr = h('tr', { tabindex: 0, class: fresh ? 'fresh' : null, 'data-family': f.ip_version, 'data-end': f.flow_end_ms },
    flowColumns.map(c => { const td = c.cell(f); td.dataset.col = c.key; td.hidden = !cols.has(c.key); return td; }));
  const open = () => flowDrawer(f);
  tr.addEventListener('click', open);
  tr.addEventListener('keydown', e => { if (e.key === 'Enter') open(); });
  return tr;
}
// endpointOf names a flow's side as an endpoint for traces and filters.
function endpointOf(f, s) {
  if (f[s + '_pod']) return { kind: 'pod', namespace: f[s + '_namespace'], name: f[s + '_pod'] };
  return { kind: 'ip', name: f[s + '_ip'] };
}
function flowDrawer(f) {
  const v = flowVerdict(f);
  const ep = s => kv({
    pod: f[s + '_pod'] ? f[s + '_namespace'] + '/' + f[s + '_pod'] : '',
    workload: f[s + '_workload'] ? (f[s + '_workload_kind'] ? f[s + '_workload_kind'] + ' ' : '') + f[s + '_namespace'] + '/' + f[s + '_workload'] : '',
    address: f[s + '_ip'] + (f[s + '_port'] && !isICMP(f) ? ' port ' + f[s + '_port'] : ''),
    node: f[s + '_node'],
    labels: f[s + '_labels'] ? Object.entries(f[s + '_labels']).map(([k, x]) => k + '=' + x).join(', ') : '',
  });
  const dst = f.service_name ? { kind: 'service', namespace: f.service_namespace, name: f.service_name } : endpointOf(f, 'dst');
  const traceHref = hashURL('trace', { source: epLabel(endpointOf(f, 'src')), destination: epLabel(dst), protocol: isICMP(f) ? 'ICMP' : f.protocol_name, port: isICMP(f) ? '' : (f.service_port || f.dst_port), family: 'dual', run: 1 });
  const actions = h('div', { class: 'actions' },
    f.src_pod ? link(hashURL('flows', { since: $('#f-since').value, pod: f.src_namespace + '/' + f.src_pod }), 'Filter by source pod ' + f.src_pod) : link(hashURL('flows', { since: $('#f-since').value, ip: f.src_ip }), 'Filter by source ' + f.src_ip),
    f.dst_pod ? link(hashURL('flows', { since: $('#f-since').value, pod: f.dst_namespace + '/' + f.dst_pod }), 'Filter by destination pod ' + f.dst_pod) : link(hashURL('flows', { since: $('#f-since').value, ip: f.dst_ip }), 'Filter by destination ' + f.dst_ip),
    h('a', { href: traceHref, class: 'act primary', id: 'trace-this' }, 'Trace this flow (dual)'),
    ['src', 'dst'].map(s => f[s + '_workload'] && link(recommendHref(Object.assign(workloadScope(f[s + '_namespace'], f[s + '_workload_kind'], f[s + '_workload']), { mode: 'least-privilege' })),
      'Recommend a policy for ' + (s === 'src' ? 'source ' : 'destination ') + f[s + '_workload'], 'NetworkPolicies for workload ' + f[s + '_namespace'] + '/' + f[s + '_workload'] + ' from its observed flows')));
  openDrawer('Flow',
    h('p', { class: 'flowline' }, famBadge(f.ip_version), ' ', h('span', { class: 'verdict ' + v }, v), ' ',
      f.protocol_name + (isICMP(f) ? ' ' + icmpName(f) : '')),
    actions,
    h('h3', {}, 'Source'), ep('src'),
    h('h3', {}, 'Destination'), ep('dst'),
    f.service_name ? h('h3', {}, 'Service') : null,
    f.service_name ? kv({ service: f.service_namespace + '/' + f.service_name, address: (f.service_ip || '') + (f.service_port ? ' port ' + f.service_port : '') }) : null,
    h('h3', {}, 'Policy'),
    kv({ egress: f.egress_verdict + (f.egress_policy ? ' by ' + f.egress_policy : ''), ingress: f.ingress_verdict + (f.ingress_policy ? ' by ' + f.ingress_policy : ''), 'drop reason': dropReason(f), 'datapath disagrees': f.verdict_mismatch ? 'yes' : '' }),
    whyDenied(f, v),
    h('h3', {}, 'Traffic'),
    kv({ start: fmtTimeZ(f.flow_start_ms), end: fmtTimeZ(f.flow_end_ms), sent: fmtBytes(f.bytes) + ' in ' + f.packets + ' packets', received: fmtBytes(f.reverse_bytes) + ' in ' + f.reverse_packets + ' packets', 'tcp state': f.tcp_state, 'end reason': f.end_reason, 'flow type': f.flow_type, exporter: f.exporter_node, 'names may be stale': f.k8s_view_stale ? 'yes: enriched while the Kubernetes API was unreachable' : '', 'trace probe': f.probe_trace_id ? 'yes: the probe of trace ' + f.probe_trace_id + ', not traffic' : '' }),
    h('details', {}, h('summary', {}, 'All fields'), kv(f)));
}
// whyDenied explains a denied flow as traces and reachability pairs do
// (GET /audit/evaluate: the one explanation of a drop), with the policies
// in force now; null for a flow that was not denied.
function whyDenied(f, v) {
  if (v !== 'denied' && v !== 'rejected') return null;
  const p = h('p', { class: 'note', id: 'flow-why' }, 'Explaining the denial…');
  const end = s => f[s + '_pod'] ? f[s + '_namespace'] + '/' + f[s + '_pod'] : f[s + '_ip'];
  const q = new URLSearchParams({ from: end('src'), to: end('dst'), proto: f.protocol_name, port: isICMP(f) ? 0 : f.dst_port, family: f.ip_version });
  api('/audit/evaluate?' + q).then(rs => {
    const r = (rs || []).find(x => x.ip_version === f.ip_version);
    p.textContent = r ? 'With the policies in force now: ' + r.message : 'The policies in force now do not evaluate this flow.';
  }, e => { p.className = 'muted'; p.textContent = 'No explanation: ' + errText(e); });
  return p;
}
async function loadFlows(more) {
  stopFollow();
  let p;
  try { p = flowQuery(); } catch (e) { showError(e); return; }
  if (!more) keepFlowURL(p);
  const q = new URLSearchParams(p);
  if (more && flows.next) q.append('cursor', flows.next);
  q.append('limit', '100');
  const tbody = $('#flow-table tbody');
  // A newer load (a filter changed again) supersedes this one: its answer,
  // or its error, may arrive after the newer one's and must not replace it.
  const gen = ++flows.gen, here = stillHere();
  try {
    const page = await api('/flows?' + q);
    if (gen !== flows.gen || !here()) return;
    banner('');
    if (!more) { tbody.replaceChildren(); flows.rows = 0; }
    for (const f of page.flows) tbody.append(flowRow(f));
    flows.rows += page.flows.length;
    flows.next = page.next || '';
    $('#flow-more').hidden = !flows.next;
    $('#flow-count').textContent = flows.rows + ' flows' + (flows.next ? ' (more available)' : '');
    if (!more) loadSummaryInto($('#flow-chart'), p, { compact: true });
  } catch (e) { if (gen !== flows.gen || !here()) return; showError(e); }
  if ($('#f-follow').checked) startFollow();
}
// insertLive puts a live row where its end time belongs (newest first).
function insertLive(tbody, tr) {
  const t = Number(tr.dataset.end);
  for (const r of tbody.rows) {
    if (Number(r.dataset.end) <= t) { tbody.insertBefore(tr, r); return; }
  }
  tbody.append(tr);
}
// Follow mode reads the server-sent events with fetch, so the bearer
// token can be sent (EventSource cannot set headers). Each event's id is
// kept: a dropped stream reconnects with Last-Event-ID and the server
// sends what was missed, so no flow is lost or shown twice.
function stopFollow() { if (flows.follow) { flows.follow.abort(); flows.follow = null; } }
async function startFollow() {
  stopFollow();
  let p;
  try { p = flowQuery(); } catch (e) { showError(e); return; }
  p.delete('since'); p.append('follow', 'true');
  const ctl = new AbortController(); flows.follow = ctl;
  let lastID = '', tries = 0;
  const tbody = $('#flow-table tbody');
  while (flows.follow === ctl) {
    try {
      const hd = lastID ? headers({ 'Last-Event-ID': lastID }) : headers();
      const r = await fetch(API + '/flows?' + p, { headers: hd, signal: ctl.signal });
      if (!r.ok) { const b = await r.json().catch(() => ({})); throw new APIError(r.status, b); }
      banner('Following new flows…', true); tries = 0;
      const reader = r.body.getReader(); const dec = new TextDecoder(); let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const chunk = buf.slice(0, i); buf = buf.slice(i + 2);
          let ev = 'message', data = '', id = '';
          for (const line of chunk.split('\n')) {
            if (line.startsWith('event:')) ev = line.slice(6).trim();
            else if (line.startsWith('data:')) data += line.slice(5);
            else if (line.startsWith('id:')) id = line.slice(3).trim();
          }
          if (id) lastID = id;
          if (ev === 'flow') {
            insertLive(tbody, flowRow(JSON.parse(data), true));
            flows.rows++;
            while (tbody.rows.length > 500) tbody.deleteRow(-1);
            $('#flow-count').textContent = flows.rows + ' flows (live)';
          } else if (ev === 'error' || ev === 'lag') banner(JSON.parse(data).message);
        }
      }
    } catch (e) {
      if (e.name === 'AbortError') break;
      if (e instanceof APIError && e.status >= 400 && e.status < 500) { showError(e); break; }
      banner('Live follow interrupted (' + errText(e) + '), reconnecting…', true);
    }
    if (flows.follow !== ctl) break;
    await new Promise(res => setTimeout(res, Math.min(10000, 500 * 2 ** tries++)));
  }
  if (flows.follow === ctl) { flows.follow = null; $('#f-follow').checked = false; }
}

// ---- Charts (uPlot) ----
const niceSteps = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
function parseDur(s) {
  const m = /^(\d+)(s|m|h)$/.exec(s || ''); if (!m) return 3600;
  return Number(m[1]) * { s: 1, m: 60, h: 3600 }[m[2]];
}
// bucketWindow aligns the window to whole buckets: until is the end of the
// bucket that holds now (the partial one), since is a whole number of
// steps before it, so every bucket but the last is complete.
function bucketWindow(sinceStr, now) {
  const win = parseDur(sinceStr);
  const step = niceSteps.find(s => win / s <= 60) || 86400;
  const until = Math.ceil(now / 1000 / step) * step;
  const n = Math.ceil(win / step);
  return { step, since: until - n * step, until, n, now: now / 1000 };
}
function chartParams(p, w) {
  const q = new URLSearchParams(p);
  for (const k of ['since', 'until', 'limit', 'cursor', 'follow', 'mode', 'compare', 'unit']) q.delete(k);
  q.append('since', String(w.since * 1000)); q.append('until', String(w.until * 1000)); q.append('step', w.step + 's');
  return q;
}
// buckets turns the summary's points into one value per bucket and family
// (missing buckets are zero, not a gap).
function buckets(s, w) {
  const xs = [], idx = {};
  for (let i = 0; i < w.n; i++) { const t = w.since + i * w.step; idx[t] = i; xs.push(t + w.step / 2); }
  const z = () => new Array(w.n).fill(0);
  const d = { xs, bytes: { 4: z(), 6: z() }, flows: { 4: z(), 6: z() }, dropped: { 4: z(), 6: z() } };
  for (const p of s.series) {
    const i = idx[Math.floor(p.time_ms / 1000)];
    if (i === undefined || !d.bytes[p.ip_version]) continue;
    d.bytes[p.ip_version][i] += p.bytes; d.flows[p.ip_version][i] += p.flows; d.dropped[p.ip_version][i] += p.dropped;
  }
  return d;
}
// partialPlugin shades the bucket that is still filling and labels it.
function partialPlugin(w) {
  return {
    hooks: {
      draw: u => {
        const b0 = w.until - w.step;
        if (w.now >= w.until || w.now < b0) return;
        const x0 = u.valToPos(b0, 'x', true), x1 = u.valToPos(w.until, 'x', true);
        const ctx = u.ctx; ctx.save();
        ctx.fillStyle = 'rgba(148,163,184,0.25)';
        ctx.fillRect(x0, u.bbox.top, x1 - x0, u.bbox.height);
        ctx.fillStyle = '#475569'; ctx.font = `${10 * devicePixelRatio}px sans-serif`; ctx.textAlign = 'right';
        ctx.fillText('partial ' + Math.round(100 * (w.now - b0) / w.step) + '%', x1 - 2, u.bbox.top + 12 * devicePixelRatio);
        ctx.restore();
      },
    },
  };
}
function timeAxisLabel(w) { return 'time (' + tzName + '), ' + (w.step >= 60 ? w.step / 60 + ' min' : w.step + ' s') + ' buckets'; }
// wholeIncrs are the y-axis steps of counted units (bytes, flows): whole
// numbers only, so a small or empty scale never repeats a rounded label
// ("1 B, 1 B, 0 B").
const wholeIncrs = [];
for (let m = 1; m < 1e16; m *= 10) wholeIncrs.push(m, 2 * m, 5 * m);
// emptyPlugin writes "no flows in this window" over a chart with no data.
function emptyPlugin(empty) {
  return { hooks: { draw: u => {
    if (!empty) return;
    const ctx = u.ctx; ctx.save();
    ctx.fillStyle = '#64748b'; ctx.font = `${13 * devicePixelRatio}px sans-serif`; ctx.textAlign = 'center';
    ctx.fillText('no flows in this window', u.bbox.left + u.bbox.width / 2, u.bbox.top + u.bbox.height / 2);
    ctx.restore();
  } } };
}
const sum = a => a.reduce((x, y) => x + y, 0);
// groupColours are the colours of a dimension's groups other than the
// families (blue and purple, the families') and drops (red); the rest
// ("(other)") is grey.
const groupColours = ['#0891b2', '#d97706', '#059669', '#db2777', '#4f46e5', '#65a30d', '#0d9488', '#c026d3', '#ea580c', '#0284c7', '#a16207', '#7c3aed'];
const COTHER = '#94a3b8', CPREV = '#334155';
// familyChart draws one value per bucket and family, each in its
// family's colour (see seriesChart).
function familyChart(el, title, w, xs, v4, v6, unit, fmt, opts) {
  const sfx = opts.suffix || '';
  return seriesChart(el, title, w, xs, [{ label: 'IPv4' + sfx, colour: C4, vals: v4 }, { label: 'IPv6' + sfx, colour: C6, vals: v6, dash: [6, 3] }],
    unit, fmt, Object.assign({ mode: opts.lines ? 'lines' : 'stacked' }, opts));
}
// seriesChart draws groups ([{label, colour, vals, dash}], one value per
// bucket, the first at the bottom) as opts.mode: stacked bars, a line
// each, or percent: stacked bars of each group's share of its bucket (a
// bucket with traffic sums to 100); a group with fam ({4, 6}: its window
// total per family) shows both in its legend. opts.prev (not in percent mode) adds
// the previous period's total per bucket as a dashed line. Without hover
// the legend shows the window's totals (in percent mode each group's
// share of the window), with it the bucket's values. The uPlot instance is
// el.uplot; el.dataset.mode says how it is drawn.
function seriesChart(el, title, w, xs, groups, unit, fmt, opts) {
  const mode = opts.mode || 'stacked';
  const totals = xs.map((_, i) => sum(groups.map(g => g.vals[i])));
  const all = sum(totals), empty = !all;
  const pct = mode === 'percent';
  const fmtPct = v => (Math.round(v * 10) / 10) + '%';
  const shown = pct ? groups.map(g => ({ ...g, vals: g.vals.map((v, i) => totals[i] ? 100 * v / totals[i] : 0) })) : groups;
  // A group of both families says how much is each's (raw.fam).
  const split = raw => raw.fam && raw.fam[4] && raw.fam[6] ? ' (IPv4 ' + fmt(raw.fam[4]) + ' · IPv6 ' + fmt(raw.fam[6]) + ')' : '';
  const val = (g, raw) => (u, v, si, i) => i == null ? (pct ? fmtPct(all ? 100 * sum(raw.vals) / all : 0) : 'Σ ' + fmt(sum(raw.vals)) + split(raw)) : (pct ? fmtPct(g.vals[i]) : fmt(g.vals[i]));
  let series, data;
  if (mode === 'lines') {
    series = shown.map(g => ({ label: g.label, stroke: g.colour, fill: g.colour + '22', width: 2, dash: g.dash, points: { show: false }, value: val(g, g) }));
    data = [xs, ...shown.map(g => g.vals)];
  } else {
    // Stacked: each series is the sum of its group and those below,
    // drawn from the top down so that each bar covers the one above.
    const bars = uPlot.paths.bars({ size: [0.9, 60] });
    const cum = [];
    shown.forEach((g, k) => cum.push(g.vals.map((v, i) => v + (k ? cum[k - 1][i] : 0))));
    series = shown.map((g, k) => ({ label: g.label, stroke: g.colour, fill: g.colour + 'cc', paths: bars, points: { show: false }, value: val(g, groups[k]) })).reverse();
    data = [xs, ...cum.reverse()];
  }
  if (opts.prev && !pct) {
    series.push({ label: 'previous period', stroke: CPREV, width: 1.5, dash: [4, 4], points: { show: false }, value: val({ vals: opts.prev }, { vals: opts.prev }) });
    data.push(opts.prev);
  }
  series.unshift({ label: 'time', value: (u, v) => v == null ? 'window' : fmtTime((v - w.step / 2) * 1000).slice(11, 19) });
  const width = Math.max(320, (el.clientWidth || el.parentElement.clientWidth || 900) - 8);
  const u = new uPlot({
    title, width, height: opts.height || 200,
    scales: { x: { time: true, range: [w.since, w.until] }, y: { range: pct ? [0, 100] : (u, mn, mx) => [0, Math.max(1, mx) * 1.1] } },
    axes: [
      { label: opts.compact ? null : timeAxisLabel(w), stroke: '#475569', grid: { stroke: '#e2e8f0' } },
      // An empty chart labels only its zero: no made-up "1 B".
      { label: pct ? '% of the bucket' : unit, stroke: '#475569', grid: { stroke: '#e2e8f0' }, size: 70, incrs: wholeIncrs, values: (u, vals) => vals.map(v => empty && v ? '' : pct ? v + '%' : fmt(v)) },
    ],
    series, plugins: [partialPlugin(w), emptyPlugin(empty)], legend: { show: true },
  }, data, el);
  el.dataset.buckets = String(w.n);
  el.dataset.mode = mode;
  el.uplot = u;
  return u;
}
// sankeyDimension is what a Sankey pairs for the chosen dimension: the
// store pairs namespaces or workloads; a family is the links' colour.
const sankeyDimension = dim => dim === 'workload' ? 'workload' : 'namespace';
// loadSummaryInto fills box with the summary charts of the filter p;
// opts.compare also asks for the window before (same length) and draws
// its totals; opts.mode sankey asks for the window's source → destination
// pairs instead of groups over time.
async function loadSummaryInto(box, p, opts) {
  const w = opts.window || bucketWindow(p.get('since') || '1h', Date.now());
  try {
    const q = chartParams(p, w);
    if (opts.policies) q.append('policies', String(opts.policies));
    const sankey = opts.mode === 'sankey';
    if (sankey) { q.set('pairs', sankeyDimension(q.get('dimension'))); q.delete('dimension'); q.delete('side'); }
    let prev = null;
    if (opts.compare && !sankey) {
      const pw = { ...w, since: w.since - w.n * w.step, until: w.since, now: w.since };
      const pq = chartParams(p, pw);
      pq.delete('dimension'); pq.delete('side'); pq.set('top', '1');
      prev = api('/flows/summary?' + pq).then(ps => buckets(ps, pw));
    }
    const [s, pd] = await Promise.all([api('/flows/summary?' + q), prev]);
    if (opts.stale && opts.stale()) return null;
    drawSummary(box, s, w, Object.assign({ prev: pd }, opts));
    return s;
  } catch (e) { box.replaceChildren(h('span', { class: 'err' }, errText(e))); return null; }
}
function familyTotals(s) {
  return h('div', { class: 'totals' }, s.families.map(f => h('span', { 'data-family': f.ip_version }, famBadge(f.ip_version), ' ', fmtBytes(f.bytes), ' · ', f.flows + ' flows · ',
    h('span', { class: f.dropped ? 'verdict dropped' : 'muted' }, f.dropped + ' dropped'))));
}
// chartGroups turns a summary into the groups of one metric (bytes or
// flows), one value per bucket: per family, or with s.dimension per group
// of it, both families summed, with each family's total in fam (the top groups by the window's bytes first,
// "(other)" last, as the store ordered them).
function chartGroups(s, w, d, metric) {
  if (!s.dimension) return [{ label: 'IPv4', colour: C4, vals: d[metric][4] }, { label: 'IPv6', colour: C6, vals: d[metric][6] }];
  const by = new Map(), idx = {};
  for (let i = 0; i < w.n; i++) idx[w.since + i * w.step] = i;
  for (const g of s.groups || []) {
    const i = idx[Math.floor(g.time_ms / 1000)];
    if (i === undefined) continue;
    if (!by.has(g.group)) by.set(g.group, { label: g.group, vals: new Array(w.n).fill(0), bytes: 0, fam: { 4: 0, 6: 0 } });
    const e = by.get(g.group); e.vals[i] += g[metric]; e.bytes += g.bytes; e.fam[g.ip_version] += g[metric];
  }
  const list = [...by.values()].filter(e => e.label !== '(other)').sort((x, y) => y.bytes - x.bytes || (x.label < y.label ? -1 : 1));
  list.forEach((e, k) => { e.colour = s.dimension === 'family' ? (e.label === 'IPv6' ? C6 : C4) : groupColours[k % groupColours.length]; });
  if (by.has('(other)')) list.push(Object.assign(by.get('(other)'), { colour: COTHER }));
  return list;
}
// sankeyChart draws s.pairs (the window's traffic from each source group
// to each destination group, per family) as a Sankey laid out by
// d3-sankey: sources on the left, destinations on the right, one link per
// pair and family in the family's colour, its width the pair's bytes or
// flows (unit); "(other)" nodes grey. Nodes and links carry their names,
// family and value as data-* attributes (and a hover title); el.dataset.mode
// is "sankey".
function sankeyChart(el, s, unit) {
  const metric = unit === 'flows' ? 'flows' : 'bytes';
  const fmt = metric === 'flows' ? v => fmtCount(v) + ' flows' : fmtBytes;
  const nodes = new Map();
  const node = (side, name) => { const id = side + ':' + name; if (!nodes.has(id)) nodes.set(id, { id, side, name }); return id; };
  const links = (s.pairs || []).filter(p => p[metric] > 0).map(p => ({ source: node('src', p.src), target: node('dst', p.dst), value: p[metric], fam: p.ip_version }));
  const width = Math.max(320, (el.clientWidth || el.parentElement.clientWidth || 900) - 8);
  const rows = Math.max(1, ...['src', 'dst'].map(sd => [...nodes.values()].filter(n => n.side === sd).length));
  const height = Math.max(200, Math.min(640, 48 + rows * 36));
  // The labels sit outside the two columns, in margins of their own.
  const margin = Math.min(220, Math.round(width * 0.22)), chars = Math.floor((margin - 70) / 6.5);
  const short = n => n.length > chars ? n.slice(0, chars - 1) + '…' : n;
  const dim = s.pairs_dimension || 'namespace';
  const fam = { 4: 0, 6: 0 };
  for (const l of links) fam[l.fam] += l.value;
  const svg = h('svg', { class: 'sankey', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': `${dim} to ${dim}, ${metric}` });
  el.replaceChildren(h('div', { class: 'u-title' }, `Source ${dim} → destination ${dim}, ${metric} (links in their family's colour)`), svg,
    h('div', { class: 'sankey-legend' }, [4, 6].map(v => h('span', { 'data-family': v }, famBadge(v), ' ', fmt(fam[v])))));
  el.dataset.mode = 'sankey';
  if (!links.length) {
    svg.append(h('text', { x: width / 2, y: height / 2, 'text-anchor': 'middle', class: 'empty' }, 'no flows in this window'));
    return;
  }
  // Biggest first in each column, "(other)" last.
  const order = (a, b) => (a.name === '(other)') - (b.name === '(other)') || b.value - a.value || (a.name < b.name ? -1 : 1);
  const g = d3.sankey().nodeId(n => n.id).nodeWidth(12).nodePadding(14).nodeSort(order)
    .extent([[margin, 26], [width - margin, height - 6]])({ nodes: [...nodes.values()], links });
  const path = d3.sankeyLinkHorizontal();
  svg.append(
    h('text', { x: margin, y: 14, 'text-anchor': 'end', class: 'head' }, 'sources'),
    h('text', { x: width - margin, y: 14, 'text-anchor': 'start', class: 'head' }, 'destinations'),
    h('g', { class: 'links' }, g.links.map(l => h('path', { d: path(l), fill: 'none', stroke: l.fam === 6 ? C6 : C4, 'stroke-width': Math.max(1, l.width),
      'data-src': l.source.name, 'data-dst': l.target.name, 'data-family': l.fam, 'data-value': l.value, 'data-width': l.width },
    h('title', {}, `${l.source.name} → ${l.target.name} · IPv${l.fam} · ${fmt(l.value)}`)))),
    h('g', { class: 'nodes' }, g.nodes.map(n => h('g', { 'data-side': n.side, 'data-name': n.name, 'data-value': n.value },
      h('rect', { x: n.x0, y: n.y0, width: n.x1 - n.x0, height: Math.max(1, n.y1 - n.y0), fill: n.name === '(other)' ? COTHER : '#334155' },
        h('title', {}, `${n.side === 'src' ? 'from' : 'to'} ${n.name} · ${fmt(n.value)}`)),
      h('text', { x: n.side === 'src' ? n.x0 - 6 : n.x1 + 6, y: (n.y0 + n.y1) / 2, dy: '0.35em', 'text-anchor': n.side === 'src' ? 'end' : 'start' }, short(n.name) + ' · ' + fmt(n.value))))));
}
// drawSummary draws bytes (and, on the Charts page, flows and drops, each
// in its own panel and y-scale: drops are often a small part of the flows).
// Bytes and flows are drawn per opts.dimension's groups in opts.mode, with
// the previous period's totals (opts.prev, buckets()) dashed; in sankey
// mode the window's pairs take their place (sankeyChart, in opts.unit).
function drawSummary(box, s, w, opts) {
  const d = buckets(s, w);
  box.replaceChildren(familyTotals(s));
  const panel = (id, kind) => { const el = h('div', { class: 'uchart', id, 'data-kind': kind }); box.append(el); return el; };
  if (opts.compact) {
    familyChart(panel(null, 'bytes'), null, w, d.xs, d.bytes[4], d.bytes[6], 'bytes / bucket', fmtBytes, { compact: true, height: 150 });
    return;
  }
  if (opts.mode === 'sankey') {
    sankeyChart(panel('chart-sankey', 'pairs'), s, opts.unit);
    familyChart(panel('chart-drops', 'dropped'), 'Dropped flows per family', w, d.xs, d.dropped[4], d.dropped[6], 'dropped / bucket', fmtCount, { lines: true, suffix: ' dropped', height: 180 });
    return;
  }
  const side = s.dimension && s.dimension !== 'family' ? (s.side === 'src' ? ' (source)' : ' (destination)') : '';
  const per = s.dimension ? 'per ' + s.dimension + side : 'per family';
  const how = { stacked: ' (stacked)', lines: '', percent: ' (share of each bucket)' }[opts.mode || 'stacked'];
  const prev = m => opts.prev && opts.prev[m][4].map((v, i) => v + opts.prev[m][6][i]);
  seriesChart(panel('chart-bytes', 'bytes'), 'Bytes ' + per + how, w, d.xs, chartGroups(s, w, d, 'bytes'), 'bytes / bucket', fmtBytes, { mode: opts.mode, prev: prev('bytes'), height: 220 });
  seriesChart(panel('chart-flows', 'flows'), 'Flows ' + per + how, w, d.xs, chartGroups(s, w, d, 'flows'), 'flows / bucket', fmtCount, { mode: opts.mode, prev: prev('flows'), height: 200 });
  familyChart(panel('chart-drops', 'dropped'), 'Dropped flows per family', w, d.xs, d.dropped[4], d.dropped[6], 'dropped / bucket', fmtCount, { lines: true, suffix: ' dropped', height: 180 });
}

// ---- Charts page ----
let chartsSeq = 0;
async function loadCharts() {
  const f = $('#charts-form');
  const p = new URLSearchParams();
  if (f.ip_version.value) p.append('ip_version', f.ip_version.value);
  p.append('since', f.since.value);
  // The view: group by (family unless asked) on which side, how many
  // groups, how drawn (a Sankey in which unit), and whether with the
  // previous period. A side is a namespace's or a workload's (a port is
  // the destination's, a family both ends'); a Sankey has both sides and
  // no previous period.
  const sankey = f.mode.value === 'sankey';
  const sided = ['namespace', 'workload'].includes(f.dimension.value) && !sankey;
  f.side.disabled = !sided; f.unit.disabled = !sankey; f.compare.disabled = sankey;
  if (f.dimension.value !== 'family') p.append('dimension', f.dimension.value);
  if (sided && f.side.value !== 'dst') p.append('side', f.side.value);
  if (f.top.value !== '10') p.append('top', f.top.value);
  if (f.mode.value !== 'stacked') p.append('mode', f.mode.value);
  if (sankey && f.unit.value !== 'bytes') p.append('unit', f.unit.value);
  if (f.compare.value !== 'previous') p.append('compare', f.compare.value);
  for (const tok of f.expr.value.trim().split(/\s+/)) {
    const i = tok.indexOf('='); if (i > 0) p.append(tok.slice(0, i), tok.slice(i + 1));
  }
  history.replaceState(null, '', '#/charts?' + p); current.hash = location.hash;
  // One aligned window for the charts, the talkers and the drops.
  const w = bucketWindow(p.get('since') || '1h', Date.now());
  // A later draw (the form changed meanwhile) wins over this one.
  const seq = ++chartsSeq, here = stillHere();
  const s = await loadSummaryInto($('#charts-out'), p, { window: w, policies: dropsShown, mode: f.mode.value, unit: f.unit.value, compare: f.compare.value === 'previous', stale: () => seq !== chartsSeq });
  if (!s || !here()) return;
  banner('');
  const rows = s.top_talkers.map(t => h('tr', { 'data-family': t.ip_version },
    h('td', {}, famBadge(t.ip_version)), h('td', {}, t.src), h('td', {}, t.dst), h('td', { class: 'num' }, fmtBytes(t.bytes)), h('td', { class: 'num' }, t.flows),
    h('td', {}, link(hashURL('flows', talkerFilter(t, p.get('since'))), 'flows'))));
  $('#talkers tbody').replaceChildren(...rows);
  drawDropsByPolicy(s, p);
}
// talkerFilter turns a map/talker label into flow filters.
function labelFilter(label, s) {
  if (label.startsWith('svc:')) return s === 'dst' ? { service: label.slice(4) } : {};
  if (label.includes('/')) return { [s + '_workload']: label };
  return { [s + '_ip']: label };
}
function talkerFilter(t, since) {
  return Object.assign({ since, ip_version: t.ip_version }, labelFilter(t.src, 'src'), labelFilter(t.dst, 'dst'));
}
// dropsShown is how many policies "Drops by policy" lists.
const dropsShown = 20;
// drawDropsByPolicy lists the window's dropped flows per deciding policy
// and family, as the store counts them (the summary's drops_by_policy).
function drawDropsByPolicy(s, p) {
  const by = new Map();
  for (const r of s.drops_by_policy || []) {
    const e = by.get(r.policy) || { policy: r.policy, 4: 0, 6: 0 };
    e[r.ip_version] += r.dropped; by.set(r.policy, e);
  }
  const list = [...by.values()];
  const shown = sum(list.map(e => e[4] + e[6])), total = sum(s.families.map(f => f.dropped));
  $('#drops-note').textContent = total + ' dropped flows' + (shown < total ? ', ' + shown + ' of them by the ' + list.length + ' policies that dropped most' : '');
  const tb = $('#drops tbody');
  tb.replaceChildren(...list.map(e => h('tr', {}, h('td', {}, e.policy || '(default deny, no policy named)'), h('td', { class: 'num' }, e[4]), h('td', { class: 'num' }, e[6]),
    h('td', {}, e.policy ? link(hashURL('flows', { since: p.get('since'), verdict: 'dropped', policy: e.policy }), 'flows') : ''))));
  if (!list.length) tb.replaceChildren(h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No dropped flows in this window.')));
}

// ---- Service map (cytoscape) ----
// Nodes are grouped in their namespace (compound nodes) and laid out by
// fcose; each edge is one family and verdict class: IPv4 blue, IPv6
// purple, dropped red and dashed, its rate shown on hover. Services link
// to the backends their flows reached (grey dotted edges). A click on a
// node opens Flows filtered to it; on an edge, a drawer with its flows
// per family, its reachability cell and a dual trace.
let cy = null;
cytoscape.use(cytoscapeFcose);
// The scope (a namespace) is the flow filter namespace=, which keeps the
// edges with an end in it: the namespace and its peers. The grouping is
// the map's own: group=node asks /servicemap for the nodes of each end.
async function loadMap() {
  const f = $('#map-form');
  const p = new URLSearchParams();
  if (f.ip_version.value) p.append('ip_version', f.ip_version.value);
  p.append('since', f.since.value);
  if (f.namespace.value) p.append('namespace', f.namespace.value);
  for (const tok of f.expr.value.trim().split(/\s+/)) {
    const i = tok.indexOf('='); if (i > 0) p.append(tok.slice(0, i), tok.slice(i + 1));
  }
  const group = f.group.value, shown = new URLSearchParams(p);
  if (group !== 'workload') shown.append('group', group);
  history.replaceState(null, '', '#/map?' + shown); current.hash = location.hash;
  const here = stillHere();
  try {
    const mq = new URLSearchParams(p); if (group === 'node') mq.set('group', 'node');
    const [m, backends] = await Promise.all([api('/servicemap?' + mq), group === 'workload' ? serviceBackends(p) : []]);
    if (!here()) return;
    banner('');
    drawMap($('#map'), regroupMap(m, group), backends, p);
  } catch (e) { if (here()) showError(e); }
}
// mapScopes lists the namespaces in the scope selector, the chosen one
// kept (it may have no flows in the window).
function mapScopes(chosen) {
  const sel = $('#map-form').namespace, v = chosen ?? sel.value;
  const nss = [...new Set([...catalog.namespaces, v].filter(Boolean))].sort();
  sel.replaceChildren(h('option', { value: '' }, 'all namespaces'), ...nss.map(x => h('option', { value: x }, x)));
  sel.value = v;
}
// regroupMap turns the /servicemap answer into the vertices of a
// grouping: workload (each workload or Service in its namespace's box),
// namespace (one vertex per namespace, its edges summed) or node (each
// workload once per Kubernetes node it ran on, in the node's box). A
// vertex keeps in ref the map id its flow filters name, in node its node.
function regroupMap(m, group) {
  if (group === 'workload') return m;
  const nodes = new Map(), edges = new Map();
  const vertex = (id, k8s, fam) => {
    let v;
    if (group === 'namespace') {
      const ns = nodeNamespace(id);
      v = ns ? { id: 'ns:' + ns, kind: 'nsgroup', ref: 'ns:' + ns, name: ns } : { id, kind: 'external', ref: id, name: id };
    } else {
      const kind = id.startsWith('svc:') ? 'service' : id.includes('/') ? 'workload' : 'external';
      v = { id: (k8s || '') + '|' + id, kind, ref: id, node: k8s || '', name: id.replace(/^svc:/, ''),
        box: k8s ? { id: 'k8s:' + k8s, label: 'node ' + k8s } : kind === 'external' ? null : { id: 'k8s:', label: 'node unknown' } };
    }
    const have = nodes.get(v.id) || Object.assign(v, { families: [] });
    if (!have.families.includes(fam)) have.families.push(fam), have.families.sort();
    nodes.set(v.id, have);
    return have.id;
  };
  for (const e of m.edges) {
    const src = vertex(e.src, e.src_node, e.ip_version), dst = vertex(e.dst, e.dst_node, e.ip_version);
    const k = [src, dst, e.ip_version, e.verdict].join(' ');
    const x = edges.get(k) || { src, dst, ip_version: e.ip_version, verdict: e.verdict, flows: 0, bytes: 0 };
    x.flows += e.flows; x.bytes += e.bytes; edges.set(k, x);
  }
  return { nodes: [...nodes.values()], edges: [...edges.values()] };
}
// serviceBackends reads which workloads answered for each Service from the
// latest flows through a Service (the map groups them under the Service).
async function serviceBackends(p) {
  const q = new URLSearchParams(p); q.set('limit', '1000');
  try {
    const r = await api('/flows?' + q);
    const out = new Map();
    for (const f of r.flows) {
      if (!f.service_name || !(f.dst_workload || f.dst_pod)) continue;
      const svc = 'svc:' + f.service_namespace + '/' + f.service_name;
      const be = f.dst_namespace + '/' + (f.dst_workload || f.dst_pod);
      out.set(svc + ' ' + be, { svc, backend: be });
    }
    return [...out.values()];
  } catch (e) { return []; }
}
function nodeNamespace(id) {
  const s = id.startsWith('svc:') ? id.slice(4) : id;
  return s.includes('/') ? s.split('/')[0] : '';
}
function fmtRate(bytes, secs) { return fmtBytes(bytes / Math.max(1, secs)) + '/s'; }
function mapElements(m, backends, secs) {
  const els = [], nss = new Set(), ids = new Set(m.nodes.map(n => n.id));
  const boxes = new Map();
  for (const n of m.nodes) {
    const ns = n.ref ? '' : nodeNamespace(n.id);
    if (ns) nss.add(ns);
    const name = n.name || (n.kind === 'external' ? n.id : n.id.replace(/^svc:/, '').split('/').slice(1).join('/'));
    const parent = n.box ? n.box.id : ns ? 'ns:' + ns : n.kind === 'external' ? 'outside' : undefined;
    if (n.box) boxes.set(n.box.id, n.box.label);
    els.push({ group: 'nodes', data: { id: n.id, ref: n.ref, node: n.node, label: (n.kind === 'service' ? 'svc ' : '') + name + '\n' + n.families.map(f => 'v' + f).join('+'), kind: n.kind, parent, families: n.families.join(',') }, classes: n.kind });
    if (parent === 'outside' && !ids.has('outside')) { ids.add('outside'); els.push({ group: 'nodes', data: { id: 'outside', label: 'outside the cluster', kind: 'outside' }, classes: 'namespace outside' }); }
  }
  for (const ns of nss) els.push({ group: 'nodes', data: { id: 'ns:' + ns, label: ns, kind: 'namespace' }, classes: 'namespace' });
  for (const [id, label] of boxes) els.push({ group: 'nodes', data: { id, label, kind: 'k8snode' }, classes: 'namespace k8snode' });
  m.edges.forEach((e, i) => {
    const dropped = e.verdict === 'dropped';
    els.push({ group: 'edges', data: {
      id: 'e' + i, source: e.src, target: e.dst, ip_version: e.ip_version, verdict: e.verdict, flows: e.flows, bytes: e.bytes,
      label: 'v' + e.ip_version + (dropped ? ' dropped ' + e.flows + ' flows' : ' ' + fmtRate(e.bytes, secs)),
      width: 1.2 + 3 * Math.sqrt(e.bytes / Math.max(1, ...m.edges.map(x => x.bytes))),
    }, classes: ['v' + e.ip_version, dropped ? 'dropped' : 'ok', e.src === e.dst ? 'self' : ''].join(' ') });
  });
  backends.forEach((b, i) => {
    if (!ids.has(b.svc)) return;
    if (!ids.has(b.backend)) {
      const ns = nodeNamespace(b.backend);
      els.push({ group: 'nodes', data: { id: b.backend, label: b.backend.split('/').slice(1).join('/'), kind: 'workload', parent: 'ns:' + ns }, classes: 'workload' });
      ids.add(b.backend);
      if (!nss.has(ns)) { nss.add(ns); els.push({ group: 'nodes', data: { id: 'ns:' + ns, label: ns, kind: 'namespace' }, classes: 'namespace' }); }
    }
    els.push({ group: 'edges', data: { id: 'b' + i, source: b.svc, target: b.backend, label: 'backend', kind: 'backend' }, classes: 'backend' });
  });
  return els;
}
const mapStyle = [
  { selector: 'node', style: { label: 'data(label)', 'text-wrap': 'wrap', 'font-size': 11, 'text-valign': 'bottom', 'text-margin-y': 4, 'background-color': '#334155', width: 22, height: 22, color: '#0f172a', 'min-zoomed-font-size': 7 } },
  { selector: 'node.service', style: { shape: 'round-rectangle', 'background-color': '#0d9488' } },
  { selector: 'node.nsgroup', style: { shape: 'round-rectangle', 'background-color': '#475569', width: 34, height: 24 } },
  { selector: 'node.external', style: { shape: 'diamond', 'background-color': '#94a3b8' } },
  { selector: 'node.namespace', style: { shape: 'round-rectangle', 'background-color': '#f1f5f9', 'background-opacity': 1, 'border-color': '#94a3b8', 'border-width': 1, 'border-style': 'dashed', label: 'data(label)', 'text-valign': 'top', 'text-halign': 'center', 'font-size': 13, 'font-weight': 'bold', color: '#475569', padding: 18 } },
  { selector: 'edge', style: { width: 'data(width)', 'curve-style': 'bezier', 'target-arrow-shape': 'triangle', 'arrow-scale': 1.1, 'font-size': 10, 'text-background-color': '#fff', 'text-background-opacity': 0.9, 'text-background-padding': 2, opacity: 0.85 } },
  { selector: 'edge.hover', style: { label: 'data(label)', opacity: 1, 'z-index': 10 } },
  { selector: 'edge.v4', style: { 'line-color': C4, 'target-arrow-color': C4, color: C4 } },
  { selector: 'edge.v6', style: { 'line-color': C6, 'target-arrow-color': C6, color: C6 } },
  { selector: 'edge.dropped', style: { 'line-color': CDROP, 'target-arrow-color': CDROP, color: CDROP, 'line-style': 'dashed', 'target-arrow-shape': 'tee' } },
  { selector: 'edge.self', style: { 'loop-direction': '90deg', 'loop-sweep': '-50deg', 'control-point-step-size': 30 } },
  { selector: 'edge.backend', style: { width: 1.5, 'line-color': '#64748b', 'target-arrow-color': '#64748b', 'line-style': 'dotted', color: '#64748b' } },
  { selector: ':selected', style: { 'overlay-color': '#f59e0b', 'overlay-opacity': 0.25 } },
];
// nodeFilter is the flow filter that selects a map node on one side ('' = either).
function nodeFilter(id, s) {
  const pre = s ? s + '_' : '';
  if (id.startsWith('svc:')) return { service: id.slice(4) };
  if (id.startsWith('ns:')) return { [pre + 'namespace']: id.slice(3) };
  if (id.startsWith('k8s:')) return { [pre + 'node']: id.slice(4) };
  if (id.includes('/')) return { [pre + 'workload']: id };
  return { [pre + 'ip']: id };
}
// vertexFilter is nodeFilter of a drawn vertex: its map id (ref, in a
// grouping by node) and its Kubernetes node.
function vertexFilter(d, s) {
  const f = nodeFilter(d.ref || d.id, s);
  if (d.node) f[(s ? s + '_' : '') + 'node'] = d.node;
  return f;
}
// gridPositions places each namespace's nodes on a small grid, in an
// order that keeps neighbours (by edges inside the namespace) together,
// and the namespaces in rows, largest first.
function gridPositions(els, wide) {
  const groups = new Map(), adj = new Map();
  for (const e of els) {
    if (e.group === 'nodes' && !['namespace', 'outside', 'k8snode'].includes(e.data.kind)) {
      const g = e.data.parent || 'external';
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(e.data.id);
    } else if (e.group === 'edges') {
      for (const [a, b] of [[e.data.source, e.data.target], [e.data.target, e.data.source]]) {
        if (!adj.has(a)) adj.set(a, new Set());
        adj.get(a).add(b);
      }
    }
  }
  const dx = wide ? 200 : 110, dy = wide ? 150 : 80, gap = wide ? 120 : 90, pos = {};
  const list = [...groups.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]));
  const area = list.reduce((s, [, ids]) => s + ids.length, 0) * dx * dy;
  const rowWidth = Math.max(800, Math.sqrt(area) * 1.8);
  let x = 0, y = 0, rowH = 0;
  for (const [, ids] of list) {
    // Breadth-first order inside the namespace: neighbours end up close.
    const inGroup = new Set(ids), seen = new Set(), order = [];
    for (const start of ids.sort()) {
      if (seen.has(start)) continue;
      const q = [start]; seen.add(start);
      while (q.length) {
        const v = q.shift(); order.push(v);
        for (const w of [...(adj.get(v) || [])].sort()) if (inGroup.has(w) && !seen.has(w)) { seen.add(w); q.push(w); }
      }
    }
    const cols = Math.ceil(Math.sqrt(order.length * 1.5)), rows = Math.ceil(order.length / cols);
    const w = cols * dx, hgt = rows * dy;
    if (x > 0 && x + w > rowWidth) { x = 0; y += rowH + gap; rowH = 0; }
    order.forEach((id, i) => {
      const r = Math.floor(i / cols), c = r % 2 ? cols - 1 - (i % cols) : i % cols; // snake rows keep chains adjacent
      pos[id] = { x: x + c * dx, y: y + r * dy };
    });
    x += w + gap; rowH = Math.max(rowH, hgt);
  }
  return pos;
}
// mapEndpoint is the Reachability/Traceflow endpoint of a map node (null
// for an address outside the cluster, which those pages do not take).
function mapEndpoint(id) {
  if (id.startsWith('svc:')) return 'service:' + id.slice(4);
  return id.includes('/') ? 'workload:' + id : null;
}
// edgeDrawer opens the drawer of one map edge: the flows of its pair per
// family (each a link to Flows filtered to that pair and family), the
// pair's reachability cell and a dual trace, both on the port its flows
// used most.
async function edgeDrawer(ev, since) {
  const d = ev.target.data(), sd = ev.target.source().data(), td = ev.target.target().data();
  const src = sd.ref || sd.id, dst = td.ref || td.id;
  const q = Object.assign({ since }, vertexFilter(sd, 'src'), vertexFilter(td, 'dst'));
  const pair = ev.cy.edges().filter(e => e.data('source') === d.source && e.data('target') === d.target && !e.hasClass('backend'));
  const fams = new Map();
  for (const e of pair) {
    const x = e.data(), f = fams.get(x.ip_version) || { flows: 0, bytes: 0, dropped: 0 };
    f.flows += x.flows; f.bytes += x.bytes; if (x.verdict === 'dropped') f.dropped += x.flows;
    fams.set(x.ip_version, f);
  }
  const rows = [...fams.entries()].sort((a, b) => b[0] - a[0]).map(([v, f]) => h('li', { 'data-family': v }, famBadge(v), ' ',
    link(hashURL('flows', Object.assign({}, q, { ip_version: v })), f.flows + ' flows, ' + fmtBytes(f.bytes)),
    f.dropped ? [' · ', link(hashURL('flows', Object.assign({}, q, { ip_version: v, verdict: 'dropped' })), f.dropped + ' dropped')] : ''));
  // The port: the most frequent destination port of the pair's latest flows.
  let port = '', protocol = 'TCP';
  try {
    const r = await api('/flows?' + new URLSearchParams(Object.assign({}, q, { limit: '200' })));
    const n = new Map();
    for (const f of r.flows) { const k = (f.protocol_name || 'TCP') + ' ' + (f.service_port || f.dst_port || ''); n.set(k, (n.get(k) || 0) + 1); }
    const top = [...n.entries()].sort((a, b) => b[1] - a[1])[0];
    if (top) [protocol, port] = top[0].split(' ');
  } catch (e) { /* the drawer still links to the flows */ }
  if (protocol.startsWith('ICMP')) { protocol = 'ICMP'; port = ''; }
  const es = mapEndpoint(src), ed = mapEndpoint(dst);
  const ends = es && ed;
  openDrawer(src + (sd.node ? ' (node ' + sd.node + ')' : '') + ' → ' + dst + (td.node ? ' (node ' + td.node + ')' : ''),
    h('h3', {}, 'Flows per family'),
    h('ul', { class: 'edge-families' }, rows),
    d.kind === 'backend' ? h('p', { class: 'muted' }, 'A backend of the Service: ', link(hashURL('flows', { since, service: src.slice(4), dst_workload: dst }), 'its flows through the Service')) : null,
    h('h3', {}, 'Policy'),
    ends ? h('div', { class: 'actions' },
      link(hashURL('reach', { sources: es, destinations: ed, protocol, port, run: 1, cell: '0,0' }), 'Reachability cell' + (port ? ' (' + protocol + ' ' + port + ')' : '')),
      link(hashURL('trace', { source: es, destination: ed, protocol, port, family: 'dual', run: 1 }), 'Dual trace'),
      ed.startsWith('workload:') ? link(recommendHref({ namespace: dst.split('/')[0], workload: dst.split('/').slice(1).join('/'), mode: 'least-privilege' }), 'Recommend a policy for ' + dst) : null)
      : h('p', { class: 'muted' }, 'Reachability and traces take workloads and Services: this edge has a namespace or an outside address at an end.'));
}
// segmentHitsBox tells whether the segment a→b crosses the box r
// (Liang–Barsky clipping).
function segmentHitsBox(a, b, r) {
  let t0 = 0, t1 = 1; const dx = b.x - a.x, dy = b.y - a.y;
  for (const [p, q] of [[-dx, a.x - r.x1], [dx, r.x2 - a.x], [-dy, a.y - r.y1], [dy, r.y2 - a.y]]) {
    if (p === 0) { if (q < 0) return false; continue; }
    const t = q / p;
    if (p < 0) { if (t > t1) return false; if (t > t0) t0 = t; } else { if (t < t0) return false; if (t < t1) t1 = t; }
  }
  return true;
}
// edgeCrossings lists, as [edge, node] pairs, the edges whose straight
// segment crosses a node box other than its ends and their namespaces;
// rendered picks the on-screen positions (the browser tests) over the
// model ones (the layout).
function edgeCrossings(cy, nodes, rendered) {
  const out = [], bb = { includeLabels: false, includeOverlays: false };
  cy.edges().forEach(e => {
    if (e.isLoop()) return;
    const s = e.source(), t = e.target(), mine = s.union(t).union(s.ancestors()).union(t.ancestors());
    const a = rendered ? s.renderedPosition() : s.position(), b = rendered ? t.renderedPosition() : t.position();
    nodes.forEach(n => {
      if (!mine.contains(n) && segmentHitsBox(a, b, rendered ? n.renderedBoundingBox(bb) : n.boundingBox(bb))) out.push([e, n]);
    });
  });
  return out;
}
// mapOverlaps names the crossings of the drawn map (for the browser tests).
const mapOverlaps = cy => edgeCrossings(cy, cy.nodes(), true).map(([e, n]) => e.id() + ' over ' + n.id());
// spreadApart pushes each top-level box (a namespace, the outside) that
// an edge of other nodes crosses off that edge's line, a few rounds at
// most: fcose keeps related nodes close but may still lay an edge over
// an unrelated box.
function spreadApart(cy) {
  for (let round = 0; round < 12; round++) {
    const bad = edgeCrossings(cy, cy.nodes().orphans(), false);
    if (!bad.length) return;
    const moved = new Set();
    for (const [e, n] of bad) {
      if (moved.has(n.id())) continue; // once a round: the edges moved too
      moved.add(n.id());
      const a = e.source().position(), b = e.target().position(), r = n.boundingBox({ includeLabels: false, includeOverlays: false });
      const len = Math.hypot(b.x - a.x, b.y - a.y) || 1, nx = -(b.y - a.y) / len, ny = (b.x - a.x) / len;
      const dist = ((r.x1 + r.x2) / 2 - a.x) * nx + ((r.y1 + r.y2) / 2 - a.y) * ny;
      const need = (Math.abs(nx) * r.w + Math.abs(ny) * r.h) / 2 + 24 - Math.abs(dist), sign = dist < 0 ? -1 : 1;
      (n.isParent() ? n.descendants() : n).shift({ x: sign * need * nx, y: sign * need * ny });
    }
  }
}
function drawMap(box, m, backends, p) {
  if (cy) { cy.destroy(); cy = null; }
  box.replaceChildren();
  if (!m.nodes.length) { box.append(h('p', { class: 'empty muted' }, 'No flows in this window.')); return; }
  const secs = parseDur(p.get('since'));
  const n = m.nodes.length;
  const els = mapElements(m, backends, secs);
  // The grid places each namespace's nodes in neighbour order; fcose then
  // starts from it (randomize off: the same map draws the same) and pulls
  // talking namespaces together, pushing the others off their edges.
  const start = gridPositions(els, n <= 40);
  cy = cytoscape({
    container: box, elements: els, style: mapStyle,
    wheelSensitivity: 0.3, minZoom: 0.05, maxZoom: 4, boxSelectionEnabled: false,
    layout: { name: 'preset', positions: start, fit: false },
  });
  cy.layout({
    name: 'fcose', randomize: false, animate: false, fit: false, quality: 'default',
    nodeDimensionsIncludeLabels: true, packComponents: true, tile: true,
    idealEdgeLength: e => e.source().parent().same(e.target().parent()) ? 90 : 180,
    nodeRepulsion: 9000, nestingFactor: 0.3, gravity: 0.2, gravityCompound: 1.2, numIter: 2500,
    nodeSeparation: 90,
  }).run();
  spreadApart(cy);
  cy.fit(undefined, 30);
  window.dualflowMap = cy; // for the browser tests and the console
  const since = p.get('since'), fam = p.get('ip_version') || '';
  cy.on('tap', 'node', ev => {
    const id = ev.target.id();
    if (id === 'outside') return;
    location.hash = hashURL('flows', Object.assign({ since, ip_version: fam }, vertexFilter(ev.target.data(), '')));
  });
  cy.on('tap', 'edge', ev => edgeDrawer(ev, since));
  // Hovering says what an element is, and shows an edge's label (edges
  // carry none: along near-vertical edges they were unreadable).
  cy.on('mouseover', 'edge', ev => {
    const d = ev.target.data();
    ev.target.addClass('hover');
    $('#map-hover').textContent = d.kind === 'backend' ? d.source + ' → ' + d.target + ': a backend of the Service'
      : `${d.source} → ${d.target} · IPv${d.ip_version} ${d.verdict} · ${d.flows} flows, ${fmtBytes(d.bytes)} (${fmtRate(d.bytes, secs)})`;
  });
  cy.on('mouseover', 'node', ev => {
    const d = ev.target.data();
    $('#map-hover').textContent = d.kind === 'outside' ? 'addresses outside the cluster' : d.kind === 'namespace' || d.kind === 'k8snode' ? d.label.replace(/^(?!node )/, 'namespace ') : `${d.ref || d.id}${d.node ? ' on node ' + d.node : ''} · ${d.kind === 'nsgroup' ? 'namespace' : d.kind}` + (d.families ? ' · IPv' + String(d.families).split(',').join(' + IPv') : '') + ` · ${ev.target.connectedEdges().length} edges`;
  });
  cy.on('mouseout', ev => { $('#map-hover').textContent = ''; if (ev.target !== cy) ev.target.removeClass('hover'); });
  $('#map-count').textContent = `${n} nodes, ${m.edges.length} edges over ${since}; rates are averages over the window. Hover an edge for its rate, click it for its flows per family, reachability and trace; click a node for its flows; scroll to zoom.`;
}

// ---- Reachability ----
function reachParams() {
  const f = $('#reach-form');
  return { sources: f.sources.value.trim().split('\n').join(','), destinations: f.destinations.value.trim().split('\n').join(','), protocol: f.protocol.value, port: f.port.value, since: f.since.value };
}
// reachProtocol shows what ICMP means and takes the port away from it
// (ICMP has none).
function reachProtocol() {
  const f = $('#reach-form'), icmp = f.protocol.value === 'ICMP';
  f.port.disabled = icmp;
  if (icmp) f.port.value = '';
  $('#reach-icmp-note').hidden = !icmp;
}
async function runReach(ev) {
  ev && ev.preventDefault();
  const f = $('#reach-form');
  reachProtocol();
  const body = {
    sources: f.sources.value.split('\n').map(parseEndpoint).filter(Boolean),
    destinations: f.destinations.value.split('\n').map(parseEndpoint).filter(Boolean),
    protocol: f.protocol.value, port: Number(f.port.value) || 0, since: f.since.value,
  };
  history.replaceState(null, '', hashURL('reach', Object.assign(reachParams(), { run: 1 }))); current.hash = location.hash;
  const btn = f.querySelector('button[type=submit]'); btn.disabled = true;
  $('#reach-summary').textContent = 'Checking ' + body.sources.length + ' × ' + body.destinations.length + ' cells over both families…';
  const here = stillHere();
  try {
    const m = await api('/reachability', { method: 'POST', body });
    if (here()) banner('');
    const disagree = countDisagree(m);
    $('#reach-summary').textContent = `${m.asymmetric} of ${m.sources.length * m.destinations.length} cells differ between IPv4 and IPv6 (outlined)` +
      (disagree ? `, ${disagree} where policy and observed flows disagree (⚠)` : '') + ` · ${m.elapsed_ms} ms. Click a cell for its pairs and a dual trace.`;
    const out = $('#reach-out'); out.replaceChildren();
    out.style.setProperty('--cols', m.destinations.length + 1);
    for (const fam of ['4', '6']) out.append(matrix(m, fam, body));
  } catch (e) { if (here()) showError(e); $('#reach-summary').textContent = ''; }
  btn.disabled = false;
}
// partialText reads "k/n" from a partial cell: pairs_allowed/pairs_total,
// or an older {partial: {k, n}} / pairs list.
function partialText(f) {
  if (typeof f.pairs_total === 'number' && f.pairs_total > 0) return (f.pairs_allowed || 0) + '/' + f.pairs_total;
  if (typeof f.partial === 'string') return f.partial;
  if (f.partial && typeof f.partial === 'object') {
    const k = f.partial.k ?? f.partial.allowed, n = f.partial.n ?? f.partial.total;
    if (k !== undefined && n !== undefined) return k + '/' + n;
  }
  if (Array.isArray(f.pairs) && f.pairs.length) {
    const ok = f.pairs.filter(p => /^allow/.test(p.verdict || p.outcome || '')).length;
    return ok + '/' + f.pairs.length;
  }
  return '';
}
// disagrees says how the policy's verdict and the observed flows differ:
// the server's mismatch when it says so, else from the observed verdicts.
function disagrees(f) {
  if (f.mismatch) return f.mismatch;
  const pol = f.policy && f.policy.verdict, v = (f.observed && f.observed.verdicts) || {};
  const dropped = (v.dropped || 0) + (v.denied || 0) + (v.rejected || 0), allowed = v.allowed || 0;
  if (/^allow/.test(pol || f.outcome) && dropped > 0) return `policy allows, ${dropped} flows were dropped`;
  if (/^deny|^denied/.test(pol || f.outcome) && allowed > 0) return `policy denies, ${allowed} flows were allowed`;
  return '';
}
function countDisagree(m) {
  let n = 0;
  for (const row of m.cells) for (const c of row) for (const f of Object.values(c.families || {})) if (f && disagrees(f)) n++;
  return n;
}
// cellNote is the short reason a family has no plain verdict (no IPv6
// ClusterIP, no such port, an evaluation error).
function cellNote(f) {
  if (f.outcome === 'partial' && f.reason && /pairs? allowed/.test(f.reason)) return '';
  return f.policy_error || f.reason || f.error || f.unavailable || (Array.isArray(f.reasons) ? f.reasons.join('; ') : '') || '';
}
// outcomeLabel: "no_family" reads "no family"; partial adds k/n.
function outcomeLabel(f) {
  const o = String(f.outcome || 'unknown').replace(/_/g, ' ');
  return f.outcome === 'partial' ? o + ' ' + partialText(f) : o;
}
// epBreakable is an endpoint's label that a narrow column wraps after its
// ':' and '/' rather than inside a name.
const epBreakable = e => epLabel(e).split(/(?<=[:/])/).flatMap((part, i) => i ? [h('wbr'), part] : [part]);
function matrix(m, fam, req) {
  const table = h('table', { class: 'reach', 'data-family': fam });
  table.append(h('tr', {}, h('th', {}, 'from \\ to'), m.destinations.map(d => h('th', { title: epLabel(d) }, epBreakable(d)))));
  m.sources.forEach((s, i) => {
    const tr = h('tr', {}, h('th', { class: 'rowh', title: epLabel(s) }, epBreakable(s)));
    m.destinations.forEach((d, j) => {
      const c = m.cells[i][j], f = (c.families && c.families[fam]) || { outcome: 'unknown', observed: { flows: 0 } };
      const obs = f.observed || { flows: 0 };
      const sub = obs.flows ? obs.flows + ' flows' + (obs.verdicts && obs.verdicts.dropped ? ', ' + obs.verdicts.dropped + ' dropped' : '') : 'no flows';
      const note = cellNote(f), dis = disagrees(f);
      const outcomeClass = f.policy_error ? 'error' : f.outcome;
      const pairs = f.pairs_total > 1 && f.outcome !== 'partial' ? f.pairs_total + ' pairs' : '';
      const td = h('td', {
        class: 'cell ' + outcomeClass + (c.asymmetric ? ' asym' : '') + (dis ? ' disagree' : ''), tabindex: 0,
        title: [dis, note, (c.reasons || []).join('; ') || 'families agree'].filter(Boolean).join(' · '),
        'data-outcome': f.outcome, 'data-asym': c.asymmetric ? 'true' : 'false', 'data-si': i, 'data-di': j,
      },
      h('span', { class: 'verdict ' + f.outcome }, outcomeLabel(f)),
      pairs ? h('span', { class: 'sub' }, pairs) : null,
      dis ? h('span', { class: 'warn', title: dis }, '⚠') : null,
      note ? h('span', { class: 'sub note' }, note) : null,
      h('span', { class: 'sub' }, f.policy ? 'policy ' + f.policy.verdict : ''), h('span', { class: 'sub' }, sub));
      const go = () => cellDetails(s, d, req, c, i, j);
      td.addEventListener('click', go);
      td.addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); go(); } });
      tr.append(td);
    });
    table.append(tr);
  });
  return h('div', { class: 'matrix' }, h('h2', {}, famBadge(Number(fam)), 'IPv' + fam), table);
}
const knownFamilyKeys = ['outcome', 'reason', 'policy', 'policy_error', 'observed', 'trace', 'trace_id', 'trace_error', 'pairs', 'partial', 'pairs_allowed', 'pairs_total', 'pairs_truncated', 'mismatch'];
// pairList renders a cell's pod pairs: "allowed ns/a-0 → ns/b-1 (addr →
// addr:port) egress P ingress Q"; unknown fields are shown as they are.
// With trace, a pair leaving from a pod has a "trace this pair" button
// calling trace(pair).
function pairList(pairs, trace) {
  const name = x => typeof x === 'object' && x ? (x.namespace ? x.namespace + '/' : '') + (x.name || x.ip || '') : (x || '');
  return h('ul', { class: 'pairs' }, pairs.map(p => {
    if (typeof p !== 'object' || p === null) return h('li', {}, String(p));
    const out = p.verdict || p.outcome || '';
    const known = ['src', 'dst', 'source', 'destination', 'outcome', 'verdict', 'src_ip', 'dst_ip', 'port', 'service_port', 'egress', 'ingress', 'policy'];
    const rest = Object.entries(p).filter(([k]) => !known.includes(k));
    const addr = p.src_ip || p.dst_ip ? ' (' + (p.src_ip || '?') + ' → ' + (p.dst_ip || '?') + (p.port ? ' port ' + p.port : '') + (p.service_port ? ' from Service port ' + p.service_port : '') + ')' : (p.port ? ' port ' + p.port : '');
    const pols = [p.egress && 'egress ' + p.egress, p.ingress && 'ingress ' + p.ingress, p.policy && 'policy ' + p.policy].filter(Boolean).join(', ');
    const traceable = trace && typeof p.src === 'string' && p.src.includes('/');
    return h('li', { class: 'pair', 'data-verdict': out }, h('span', { class: 'verdict ' + out }, out || '?'), ' ', name(p.src || p.source), ' → ', name(p.dst || p.destination),
      h('span', { class: 'muted' }, addr), pols ? h('span', { class: 'pol' }, ' · ' + pols) : '',
      rest.length ? h('span', { class: 'muted' }, ' · ' + rest.map(([k, v]) => k + ' ' + (typeof v === 'object' ? JSON.stringify(v) : v)).join(', ')) : '',
      traceable ? [' ', h('button', { type: 'button', class: 'act tracepair', onclick: () => trace(p) }, 'trace this pair')] : '');
  }));
}
function familyDetails(fam, f, tracePair) {
  const extra = Object.fromEntries(Object.entries(f).filter(([k]) => !knownFamilyKeys.includes(k)));
  const v = (f.observed && f.observed.verdicts) || {};
  return h('div', { class: 'famdetail v' + fam, 'data-family': fam },
    h('h3', {}, famBadge(Number(fam)), ' ', h('span', { class: 'verdict ' + f.outcome }, outcomeLabel(f))),
    f.reason ? h('p', { class: f.outcome === 'error' ? 'err' : 'note' }, f.reason) : null,
    disagrees(f) ? h('p', { class: 'warnline' }, '⚠ ' + disagrees(f)) : null,
    f.policy_error ? h('p', { class: 'err' }, 'policy error: ' + f.policy_error) : null,
    kv({
      policy: f.policy ? f.policy.verdict + [f.policy.egress && ' egress ' + f.policy.egress, f.policy.ingress && ' ingress ' + f.policy.ingress].filter(Boolean).join(',') : '',
      addresses: f.policy && f.policy.src_ip ? f.policy.src_ip + ' → ' + f.policy.dst_ip : '',
      'pod pairs': f.pairs_total ? (f.pairs_allowed || 0) + ' of ' + f.pairs_total + ' allowed' : '',
      observed: f.observed ? (f.observed.flows || 0) + ' flows' + (Object.keys(v).length ? ' (' + Object.entries(v).map(([k, n]) => n + ' ' + k).join(', ') + ')' : '') : '',
      'last seen': f.observed && f.observed.last_seen_ms ? fmtTimeZ(f.observed.last_seen_ms) : '',
    }),
    Array.isArray(f.pairs) && f.pairs.length ? [h('h4', {}, (f.pairs_total || f.pairs.length) + ' pod pairs' + (f.pairs_total ? ', ' + (f.pairs_allowed || 0) + ' allowed' : '') + (f.pairs_truncated ? ' (first ' + f.pairs.length + ' listed)' : '')), pairList(f.pairs, tracePair && (p => tracePair(p, fam)))] : null,
    Object.keys(extra).length ? kv(Object.fromEntries(Object.entries(extra).map(([k, x]) => [k.replace(/_/g, ' '), Array.isArray(x) && x.length && typeof x[0] === 'object' ? pairList(x) : x]))) : null);
}
// endpointFilter turns a reachability endpoint into flow filters.
function endpointFilter(e, s) {
  const full = (e.namespace ? e.namespace + '/' : '') + e.name;
  switch (e.kind) {
    case 'pod': return { [s + '_pod']: full };
    case 'service': return s === 'dst' ? { service: full } : {};
    case 'ip': return { [s + '_ip']: e.name };
    default: return { [s + '_workload']: full };
  }
}
async function cellDetails(src, dst, req, cell, i, j) {
  const icmp = req.protocol === 'ICMP';
  const flowsQ = Object.assign({ since: req.since, protocol: req.protocol, dst_port: req.port || '' }, endpointFilter(src, 'src'), endpointFilter(dst, 'dst'));
  const traceQ = { source: epLabel(src), destination: epLabel(dst), protocol: req.protocol, port: req.port || '', family: 'dual', run: 1 };
  // The flows filter names one protocol: ICMP's cell has a link per family.
  const flowLinks = icmp
    ? [['4', 'ICMP'], ['6', 'ICMPv6']].map(([v, p]) => link(hashURL('flows', Object.assign({}, flowsQ, { protocol: p, ip_version: v, dst_port: '' })), p + ' flows (IPv' + v + ')'))
    : [link(hashURL('flows', flowsQ), 'Flows of this cell'), link(hashURL('flows', Object.assign({ verdict: 'dropped' }, flowsQ)), 'Dropped flows')];
  const info = h('div', { class: 'celldetail', 'data-si': i, 'data-di': j },
    h('p', { class: 'flowline' }, epLabel(src) + ' → ' + epLabel(dst) + ' · ' + (icmp ? 'ICMP (ICMPv6 over IPv6)' : req.protocol + (req.port ? ' ' + req.port : ' any port'))),
    (cell.reasons || []).length ? h('p', { class: 'verdict unavailable' }, cell.reasons.join('; ')) : null,
    h('div', { class: 'actions' }, flowLinks, link(hashURL('trace', traceQ), 'Open in Traceflow'),
      dst.kind === 'workload' && dst.namespace ? link(recommendHref({ namespace: dst.namespace, workload: dst.name, mode: 'least-privilege' }), 'Recommend a policy for ' + epLabel(dst)) : null),
    Object.entries(cell.families || {}).sort().map(([fam, f]) => familyDetails(fam, f || {}, tracePair)),
    h('h3', { id: 'cell-trace-title' }, 'Dual trace'),
    h('p', { class: 'muted', id: 'cell-trace-status' }, 'Running a dual trace…'));
  openDrawer('Reachability cell', info);
  const out = h('div', { class: 'traces' });
  info.append(out);
  // run traces one request into out; a later one (a pair's) wins over one
  // still running.
  let latest = 0;
  async function run(body, what) {
    const n = ++latest, status = $('#cell-trace-status');
    $('#cell-trace-title').textContent = what;
    status.textContent = 'Running the ' + what.toLowerCase() + '…'; status.className = 'muted';
    if (n > 1) out.replaceChildren();
    try {
      const r = await traceflow(body, secs => { if (n === latest) status.textContent = 'Running the ' + what.toLowerCase() + ' again in ' + secs + ' s (too many traces at once)…'; });
      if (n !== latest) return;
      status.textContent = what + ' done.';
      renderTraces(out, r);
    } catch (e) { if (n === latest) { status.textContent = errText(e); status.className = 'err'; } }
  }
  // tracePair traces one listed pair: from its pod to its pod (or
  // address) on the port it was evaluated at, over its family. The cell's
  // dual trace goes between pods the server picks.
  function tracePair(p, fam) {
    const pod = x => parseEndpoint('pod:' + x);
    const to = String(p.dst).includes('/') ? pod(p.dst) : { kind: 'ip', name: p.dst_ip || p.dst };
    let body;
    try { body = traceRequest(pod(p.src), to, req.protocol, p.port || req.port, 'ipv' + fam); } catch (e) { $('#cell-trace-status').textContent = errText(e); return; }
    run(body, 'Trace of ' + p.src + ' → ' + p.dst + ' over IPv' + fam);
  }
  let body;
  try { body = traceRequest(src, dst, req.protocol, req.port, 'dual'); } catch (e) { $('#cell-trace-status').textContent = errText(e); $('#cell-trace-status').className = 'err'; return; }
  await run(body, 'Dual trace');
}

// ---- Traceflow ----
// traceFamily reads a link's or the form's family: dual, ipv4 or ipv6, or
// the older 0 (both), 4 and 6 of bookmarked links.
const traceFamily = v => ({ 0: 'dual', 4: 'ipv4', 6: 'ipv6' })[v] || (['ipv4', 'ipv6'].includes(v) ? v : 'dual');
// traceRequest is the body of POST /traceflows from two endpoints
// ({kind, namespace, name}): a trace leaves from a pod or a workload (the
// server picks one of its pods) and goes to any endpoint.
function traceRequest(src, dst, protocol, port, family) {
  const ref = e => e.namespace ? e.namespace + '/' + e.name : e.name;
  if (!src || !['pod', 'workload'].includes(src.kind)) throw new APIError(400, { field: 'source', message: 'want pod:namespace/name or workload:namespace/name' });
  if (!dst) throw new APIError(400, { field: 'destination', message: 'want a pod, workload, service or ip' });
  const body = { family: traceFamily(family), protocol: (protocol || 'TCP').toUpperCase(), destination: {} };
  body[src.kind === 'pod' ? 'source' : 'source_workload'] = ref(src);
  body.destination[dst.kind] = dst.kind === 'ip' ? dst.name : ref(dst);
  if (!body.protocol.startsWith('ICMP')) body.destination.port = Number(port) || 0;
  return body;
}
// traceflow runs a trace and waits for its result. The server refuses a
// trace past the caller's rate (429) rather than queue it: it is asked
// again after the Retry-After given, a few times; onWait(seconds) says so.
async function traceflow(body, onWait) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await api('/traceflows?wait=true', { method: 'POST', body });
    } catch (e) {
      if (e.status !== 429 || attempt > 3) throw e;
      const secs = Math.min(Math.max(e.retryAfter, 1), 30);
      onWait(secs);
      await new Promise(ok => setTimeout(ok, secs * 1000));
    }
  }
}
async function runTrace(ev) {
  ev && ev.preventDefault();
  const f = $('#trace-form');
  history.replaceState(null, '', hashURL('trace', { source: f.source.value, destination: f.destination.value, protocol: f.protocol.value, port: f.port.value, family: f.family.value })); current.hash = location.hash;
  const out = $('#trace-out');
  const btn = f.querySelector('button[type=submit]'); btn.disabled = true;
  out.replaceChildren(h('p', { class: 'muted' }, 'Tracing… injecting a packet per family and collecting observations.'));
  const here = stillHere();
  try {
    const body = traceRequest(parseEndpoint(f.source.value), parseEndpoint(f.destination.value), f.protocol.value, f.port.value, f.family.value);
    const r = await traceflow(body, secs => out.replaceChildren(h('p', { class: 'muted' }, 'Too many traces at once: tracing again in ' + secs + ' s…')));
    if (here()) banner('');
    renderTraces(out, r);
  } catch (e) { if (here()) showError(e); out.replaceChildren(); }
  btn.disabled = false;
}
// hopText says what an observation adds to its node, component and action.
function hopText(o) {
  return [o.interface && 'via ' + o.interface, o.pod && 'pod ' + o.pod, o.service && 'service ' + o.service,
    o.translated_dst && 'DNAT to ' + o.translated_dst, o.translated_src && 'SNAT to ' + o.translated_src, o.detail,
    // The datapath's rule (an internal counter or chain name) is a detail:
    // the trace's reason is the one explanation of a drop.
    o.rule && !(o.detail || '').includes(o.rule) && 'rule ' + o.rule].filter(Boolean).join(', ');
}
// renderTraces draws a trace (POST /traceflows's Result): each family's
// path, or why it has none, once, in its own block (data-family 4 or 6).
function renderTraces(out, r) {
  out.replaceChildren();
  // The header names the pods traced (the server names the pods it picked
  // for workloads in request): a trace is between two pods, not two
  // workloads.
  const q = r.request || {}, d = q.destination || {};
  const ends = { src: q.source || q.source_workload || '', dst: d.pod || (d.service && 'service ' + d.service) || d.workload || '' };
  const end = (name, addr) => name && addr ? name + ' (' + addr + ')' : name || addr || '?';
  if (r.id) {
    // The pods the server picked for workloads.
    const picked = [q.source_workload && 'from pod ' + q.source + ' of workload ' + q.source_workload, d.workload && 'to pod ' + d.pod + ' of workload ' + d.workload].filter(Boolean);
    out.append(h('p', { class: 'muted traceinfo' }, 'Trace ', h('code', {}, r.id), ' · ' + r.phase,
      picked.length ? ' · traced ' + picked.join(' ') : '',
      (r.families || []).length ? '' : ': ' + (r.reason || ''), ' · ',
      link(hashURL('flows', { probe_trace_id: r.id, probes: 'include' }), 'its probe flows', 'the flow records of this trace\'s probes')));
  }
  for (const t of r.families || []) {
    const fam = t.family === 'ipv6' ? 6 : 4;
    const stopped = o => o.action === 'dropped' || o.action === 'rejected';
    const stop = (t.observations || []).find(stopped);
    const path = h('ol', { class: 'path' }, (t.observations || []).map(o => {
      const pol = o.policy;
      return h('li', { class: stopped(o) ? 'drop' : '' },
        h('span', { class: 'node' }, o.node), ' · ', o.component, ' · ',
        h('span', { class: 'verdict ' + o.action }, o.action),
        hopText(o) ? ' · ' + hopText(o) : '',
        pol ? h('span', { class: stopped(o) ? 'pol' : 'muted' }, ' · policy ' + pol) : '');
    }));
    const traced = ['delivered', 'dropped', 'rejected'].includes(t.outcome);
    out.append(h('div', { class: 'trace v' + fam, 'data-family': fam, 'data-outcome': t.outcome },
      h('h2', {}, famBadge(fam), ' ', end(ends.src, t.src), ' → ', end(ends.dst, t.dst)),
      h('p', {}, h('span', { class: 'verdict ' + t.outcome }, t.outcome),
        stop ? ' at ' + stop.node : '', stop && stop.policy ? ' by ' + stop.policy : '',
        t.dst_port ? h('span', { class: 'muted' }, ' · ' + t.protocol + ' port ' + t.dst_port) : ''),
      t.reason ? h('p', { class: traced ? 'note' : 'err' }, t.reason) : null,
      path));
  }
}

// ---- Audit ----
// refEndpoint turns an audit object into a reachability/trace endpoint.
function refEndpoint(o) {
  const kind = o.kind === 'Pod' ? 'pod' : o.kind === 'Service' ? 'service' : 'workload';
  return { kind, namespace: o.namespace, name: o.name };
}
// findingLinks asks about the traffic a finding is about: its objects of
// role source and destination (the other side, when it has none, is a few
// workloads of the live view), on its port. A verdict gap links its
// denied flows, any other finding the flows of its ends.
function findingLinks(f) {
  const objs = (f.objects || []).filter(o => o.kind !== 'NetworkPolicy');
  const pols = (f.objects || []).filter(o => o.kind === 'NetworkPolicy');
  let srcs = objs.filter(o => o.role === 'source').map(refEndpoint), dsts = objs.filter(o => o.role === 'destination').map(refEndpoint);
  if (!objs.some(o => o.role) && objs.length) {
    // A server without roles: the first two objects, as before.
    [srcs, dsts] = objs.length >= 2 ? [[refEndpoint(objs[0])], [refEndpoint(objs[1])]] : [[], [refEndpoint(objs[0])]];
  }
  const links = [];
  if (srcs.length || dsts.length) {
    // The other side is never one of the finding's objects (a Service's
    // backends included).
    const ends = [...srcs, ...dsts].map(epLabel), mine = [...ends, ...objs.map(o => epLabel(refEndpoint(o)))];
    const others = n => catalog.workloads.map(w => parseEndpoint('workload:' + w)).filter(e => !mine.includes(epLabel(e))).slice(0, n);
    const protocol = f.protocol === 'ICMPv6' ? 'ICMP' : f.protocol || 'TCP';
    const port = /^ICMP/.test(protocol) ? '' : f.port || '';
    const gap = /verdict-gap$/.test(f.kind);
    const flowsQ = Object.assign({ since: '24h', dst_port: port }, gap ? { verdict: 'dropped' } : {},
      srcs.length ? endpointFilter(srcs[0], 'src') : {}, dsts.length ? endpointFilter(dsts[0], 'dst') : {});
    links.push(link(hashURL('flows', flowsQ), gap ? 'Denied flows' : 'Flows', gap ? 'flows of this pair the policies dropped' : 'flows of ' + ends.slice(0, 2).join(' → ')));
    const rs = srcs.length ? srcs : others(3), rd = dsts.length ? dsts : others(3);
    const one = rs.length === 1 && rd.length === 1;
    links.push(link(hashURL('reach', { sources: rs.map(epLabel).join(','), destinations: rd.map(epLabel).join(','), protocol, port, run: 1, cell: one ? '0,0' : '' }),
      one ? 'Reachability cell' : srcs.length && !dsts.length ? 'Reachability from it' : !srcs.length ? 'Reachability to it' : 'Reachability'));
    const ts = rs.find(e => e.kind === 'pod' || e.kind === 'workload');
    // A trace needs a port for TCP, UDP and SCTP.
    if (ts && rd.length && (port || /^ICMP/.test(protocol))) {
      links.push(link(hashURL('trace', { source: epLabel(ts), destination: epLabel(rd[0]), protocol, port, family: 'dual', run: 1 }), 'Dual trace'));
    }
  }
  for (const p of pols) links.push(link(hashURL('flows', { since: '24h', policy: p.namespace + '/' + p.name }), 'Flows of ' + p.name));
  const rec = findingScope(f);
  if (rec) links.push(link(recommendHref(rec), 'Recommend a policy', 'NetworkPolicies for ' + scopeText(rec) + ' from its observed flows, with their replay and diff'));
  return h('div', { class: 'actions' }, links);
}
// findingItem is one finding as a list item: its severity, kind, port and
// count, message, fix, objects and links (the Audit page's list and a
// recommendation's static audit).
function findingItem(f) {
  // "3 pods", "1 pod pair": what the count counts, from the finding.
  const counted = f.count ? ' · ' + f.count + (f.unit ? ' ' + (f.count === 1 ? f.unit.replace(/s$/, '') : f.unit) : '') : '';
  return h('li', { class: f.kind.startsWith('dual-stack-') ? 'dual' : '', 'data-kind': f.kind, 'data-severity': f.severity || '' },
    h('div', { class: 'kind' }, f.severity ? h('span', { class: 'sev ' + f.severity }, f.severity) : '', f.kind, f.port ? ' · ' + (f.protocol || '') + ' ' + f.port : '', counted),
    h('div', {}, f.message),
    f.fix ? h('div', { class: 'fix' }, h('b', {}, 'Fix: '), f.fix) : null,
    h('div', { class: 'objs' }, (f.objects || []).map(o => o.kind + ' ' + (o.namespace ? o.namespace + '/' : '') + o.name + (o.direction ? ' (' + o.direction + (o.rule !== undefined ? ' rule ' + o.rule : '') + ')' : '')).join(' · ')),
    findingLinks(f));
}
async function loadAudit() {
  const list = $('#audit-list');
  const here = stillHere();
  await loadCatalog();
  try {
    const r = await api('/audit/findings');
    if (here()) banner('');
    const sev = ['high', 'medium', 'low'].map(s => [s, r.findings.filter(f => f.severity === s).length]).filter(([, n]) => n).map(([s, n]) => n + ' ' + s);
    $('#audit-summary').textContent = `${r.findings.length} findings` + (sev.length ? ' (' + sev.join(', ') + ')' : '') + `, ${r.dual_stack} dual-stack gaps (listed first).`;
    list.replaceChildren(...r.findings.map(findingItem));
  } catch (e) { $('#audit-summary').textContent = ''; list.replaceChildren(h('li', { class: 'err' }, errText(e))); }
}

// ---- Audit: what-if ----
// The what-if (POST /audit/whatif) replays the window's recorded flows
// against the live policies and against them plus the proposed ones, and
// lists the flows whose verdict changes: "if you apply this, these
// connections change", per family, nothing applied.
// whatifShown is how many pairs each family's change list shows.
const whatifShown = 10;
// whatifEnd is a what-if flow end as a reachability endpoint: its
// workload, else its pod, else its address.
function whatifEnd(e) {
  if (e.workload_name) return { kind: 'workload', namespace: e.namespace, name: e.workload_name };
  if (e.pod) return { kind: 'pod', namespace: e.namespace, name: e.pod };
  return { kind: 'ip', name: e.ip };
}
// whatifVerdict is a flow's deciding side, as the CLI prints it: the
// denying side, else ingress, with its policy and rule.
function whatifVerdict(v) {
  const [s, dir] = v.egress && v.egress.verdict === 'denied' ? [v.egress, 'egress'] : [v.ingress || {}, 'ingress'];
  const by = s.policy_name ? ' by ' + s.policy_namespace + '/' + s.policy_name + ' ' + dir + (s.rule >= 0 ? ' rule ' + s.rule : '') : '';
  return h('span', {}, h('span', { class: 'verdict ' + s.verdict }, s.verdict), by);
}
// whatifPairs groups a family's changes of one kind by pair (source and
// destination workload, pod or address, protocol and port), the most
// records first.
function whatifPairs(changes) {
  const by = new Map();
  for (const c of changes) {
    const src = whatifEnd(c.src), dst = whatifEnd(c.dst);
    const key = [epLabel(src), epLabel(dst), c.protocol, c.dst_port].join(' ');
    const p = by.get(key) || by.set(key, { src, dst, c, flows: 0, records: 0, last: 0 }).get(key);
    p.flows++; p.records += c.records; p.last = Math.max(p.last, Date.parse(c.last_seen));
  }
  return [...by.values()].sort((a, b) => b.records - a.records);
}
const endName = e => (e.namespace ? e.namespace + '/' : '') + e.name;
// whatifChangeList is one family's changes of one kind (newly-denied or
// newly-allowed): counts, then the top pairs, each linking to its flows;
// withWhat names what the verdict after is with (the proposal, the
// recommendation).
function whatifChangeList(fam, kind, changes, since, withWhat = 'the proposal') {
  const pairs = whatifPairs(changes);
  const records = changes.reduce((n, c) => n + c.records, 0);
  const [before, after] = kind === 'newly-denied' ? ['allowed', 'denied'] : ['denied', 'allowed'];
  const head = h('h3', {}, h('span', { class: 'verdict ' + before }, before), ' → ', h('span', { class: 'verdict ' + after }, after), ' ',
    h('span', { class: 'count' }, pairs.length + (pairs.length === 1 ? ' pair' : ' pairs') + ' · ' + changes.length + ' flows · ' + fmtCount(records) + ' records'));
  if (!changes.length) return h('div', { class: 'wichange', 'data-change': kind, 'data-pairs': 0 }, head, h('p', { class: 'muted' }, 'none'));
  const rows = pairs.slice(0, whatifShown).map(p => {
    const icmp = /^ICMP/i.test(p.c.protocol);
    const q = Object.assign({ since, ip_version: fam, protocol: p.c.protocol, dst_port: icmp ? '' : p.c.dst_port }, endpointFilter(p.src, 'src'), endpointFilter(p.dst, 'dst'));
    return h('tr', { 'data-src': endName(p.src), 'data-dst': endName(p.dst) },
      h('td', {}, endName(p.src)), h('td', {}, endName(p.dst)), h('td', {}, p.c.protocol + (icmp ? '' : ' ' + p.c.dst_port)),
      h('td', { class: 'num', title: p.flows + ' flows (addresses and port), ' + p.records + ' records' }, p.flows + ' · ' + fmtCount(p.records)),
      h('td', { class: 'wiverdicts' }, whatifVerdict(p.c.before), h('br'), '→ ', whatifVerdict(p.c.after)),
      h('td', {}, link(hashURL('flows', q), 'Flows', 'the recorded IPv' + fam + ' flows of this pair')));
  });
  return h('div', { class: 'wichange', 'data-change': kind, 'data-pairs': pairs.length }, head,
    h('div', { class: 'tablewrap' }, h('table', { class: 'data' }, h('thead', {}, h('tr', {}, ['Source', 'Destination', 'Port', 'Flows · records', 'Now → with ' + withWhat, ''].map(t => h('th', {}, t)))),
      h('tbody', {}, rows))),
    pairs.length > whatifShown ? h('p', { class: 'muted' }, 'the ' + whatifShown + ' pairs with the most records of ' + pairs.length) : null);
}
// whatifOutcome is one family of a what-if cell under one set of
// policies, as the Reachability matrix sums a cell up: its outcome and
// allowed pod pairs (the reason of a family without pairs as a tooltip).
function whatifOutcome(v) {
  return h('span', { class: 'verdict ' + v.outcome, title: v.reason || '' }, v.outcome + (v.pairs_total ? ' ' + v.pairs_allowed + '/' + v.pairs_total : ''));
}
const cellLabel = c => epLabel(c.src) + ' → ' + epLabel(c.dst) + ' ' + c.protocol;
// whatifCells is the cells section: one row per changed cell, with its
// IPv4 and IPv6 verdicts before → after (an unchanged family muted) and
// a link to the cell on the Reachability page (any port of its
// protocol, as the what-if evaluated it).
function whatifCells(r) {
  const per = fam => r.cells.filter(c => c.families[fam].changed).length;
  const head = h('h3', {}, 'Reachability cells ', h('span', { class: 'count' }, r.cells.length + (r.cells.length === 1 ? ' cell' : ' cells') + ' change · ' +
    [4, 6].map(fam => 'IPv' + fam + ' ' + per(fam)).join(' · ')));
  if (r.cells_skipped) return h('div', { class: 'wicells', 'data-cells': 0, 'data-skipped': 1 }, h('h3', {}, 'Reachability cells'), h('p', { class: 'warnline' }, 'Not evaluated: ' + r.cells_skipped + '.'));
  if (!r.cells.length) return h('div', { class: 'wicells', 'data-cells': 0 }, head, h('p', { class: 'muted' }, 'no cell of the Reachability matrix changes'));
  const fam = (c, v) => {
    const f = c.families[v];
    return h('td', { class: 'wiverdicts' + (f.changed ? '' : ' muted'), 'data-family': v, 'data-changed': f.changed ? 1 : 0 },
      whatifOutcome(f.before), f.changed ? [' → ', whatifOutcome(f.after)] : ' (no change)');
  };
  const rows = r.cells.slice(0, whatifShown * 5).map(c => h('tr', { 'data-src': epLabel(c.src), 'data-dst': epLabel(c.dst), 'data-protocol': c.protocol,
    'data-changed': [4, 6].filter(v => c.families[v].changed).join(',') },
    h('td', {}, epLabel(c.src)), h('td', {}, epLabel(c.dst)), h('td', {}, c.protocol + ' any port'), fam(c, 4), fam(c, 6),
    h('td', {}, link(hashURL('reach', { sources: epLabel(c.src), destinations: epLabel(c.dst), protocol: c.protocol, port: '', run: 1, cell: '0,0' }), 'Reachability', 'this cell on the Reachability page, with the policies in force'))));
  return h('div', { class: 'wicells', 'data-cells': r.cells.length }, head,
    h('div', { class: 'tablewrap' }, h('table', { class: 'data' }, h('thead', {}, h('tr', {}, ['Source', 'Destination', 'Protocol', h('span', {}, famBadge(4), ' now → with the proposal'), h('span', {}, famBadge(6), ' now → with the proposal'), ''].map(t => h('th', {}, t)))),
      h('tbody', {}, rows))),
    r.cells.length > rows.length ? h('p', { class: 'muted' }, 'the first ' + rows.length + ' cells of ' + r.cells.length) : null);
}
// whatifPodPairs is the pairs section: per family, the pod pairs behind
// the changed cells, newly denied first, each with its verdict before →
// after (the explanation of a new denial as a tooltip) and a link to its
// recorded flows.
function whatifPodPairs(r, since) {
  const fams = [4, 6].map(fam => {
    const mine = r.pairs.filter(p => p.ip_version === fam).sort((a, b) => (a.change === b.change ? 0 : a.change === 'newly-denied' ? -1 : 1));
    const rows = mine.slice(0, whatifShown * 2).map(p => {
      const c = r.cells[p.cell], b = p.before, a = p.after;
      const q = { since, ip_version: fam, protocol: p.protocol, dst_port: b.port || '', src_pod: b.src, dst_pod: b.dst };
      return h('tr', { 'data-src': b.src, 'data-dst': b.dst, 'data-change': p.change, 'data-cell': c ? cellLabel(c) : '' },
        h('td', {}, b.src), h('td', {}, b.dst), h('td', {}, p.protocol + (b.port ? ' ' + b.port : '')),
        h('td', { class: 'wiverdicts', title: a.explanation || '' }, h('span', { class: 'verdict ' + b.verdict }, b.verdict), ' → ', h('span', { class: 'verdict ' + a.verdict }, a.verdict),
          a.ingress || a.egress ? h('span', { class: 'muted' }, ' ' + [a.egress && 'egress ' + a.egress, a.ingress && 'ingress ' + a.ingress].filter(Boolean).join(', ')) : ''),
        h('td', {}, link(hashURL('flows', q), 'Flows', 'the recorded IPv' + fam + ' flows of this pod pair')));
    });
    return h('div', { class: 'wipairfam famdetail v' + fam, 'data-family': fam, 'data-pairs': mine.length },
      h('h4', {}, famBadge(fam), ' IPv' + fam + ': ' + (mine.length ? mine.length + (mine.length === 1 ? ' pod pair' : ' pod pairs') + ' change' : 'no change')),
      mine.length ? h('div', { class: 'tablewrap' }, h('table', { class: 'data' }, h('thead', {}, h('tr', {}, ['Source pod', 'Destination pod', 'Port', 'Now → with the proposal', ''].map(t => h('th', {}, t)))),
        h('tbody', {}, rows))) : null,
      mine.length > rows.length ? h('p', { class: 'muted' }, 'the first ' + rows.length + ' of ' + mine.length) : null);
  });
  return h('div', { class: 'wipairs' }, h('h3', {}, 'Pod pairs ', h('span', { class: 'count' }, r.pairs.length + ' behind the changed cells')),
    r.pairs_truncated ? h('p', { class: 'warnline' }, 'Some cells have more pairs than are listed: their counts above are complete.') : null,
    h('div', { class: 'wifams' }, fams));
}
// renderWhatIf draws a WhatIfReport in three sections: the reachability
// cells whose verdict changes, their pod pairs, and the recorded flows: a
// sentence, then IPv4 and IPv6 side by side, each with its newly denied
// and newly allowed pairs.
// A connection is a pair of whatifPairs; a flow one of the API's flow
// groups (addresses, protocol, port).
const connections = n => n + (n === 1 ? ' connection' : ' connections');
function renderWhatIf(r, since) {
  // A server without the cells answers the flows only.
  r.cells = r.cells || []; r.pairs = r.pairs || [];
  const n = r.changes.length, conns = [4, 6].reduce((k, fam) => k + whatifPairs(r.changes.filter(c => c.ip_version === fam)).length, 0);
  const fams = [4, 6].map(fam => {
    const mine = r.changes.filter(c => c.ip_version === fam), k = whatifPairs(mine).length;
    return h('div', { class: 'wifam famdetail v' + fam, 'data-family': fam, 'data-changes': mine.length },
      h('h2', {}, famBadge(fam), ' IPv' + fam + ': ' + (k ? connections(k) + ' (' + mine.length + ' flows) would change' : 'no change')),
      ['newly-denied', 'newly-allowed'].map(k => whatifChangeList(fam, k, mine.filter(c => c.change === k), since)));
  });
  $('#whatif-out').replaceChildren(
    h('p', { class: 'wisummary' + (n ? '' : ' muted'), 'data-flows': r.flows }, n
      ? 'If you apply this, ' + connections(conns) + ' would change verdict: ' + n + ' of the ' + r.flows + ' recorded flows replayed'
      : 'If you apply this, no connection would change verdict: none of the ' + r.flows + ' recorded flows replayed',
    ' (' + fmtTimeZ(Date.parse(r.since)) + ' to ' + fmtTimeZ(Date.parse(r.until)) + ').',
    r.truncated ? h('span', { class: 'warnline' }, ' Only the most frequent flows were replayed: narrow the window.') : null,
    r.cells_skipped ? ' The Reachability matrix cells were not evaluated (below).'
      : ' ' + r.cells.length + (r.cells.length === 1 ? ' cell' : ' cells') + ' of the Reachability matrix and ' + r.pairs.length + (r.pairs.length === 1 ? ' pod pair' : ' pod pairs') + ' would change too.'),
    whatifCells(r), r.cells_skipped ? null : whatifPodPairs(r, since),
    h('h3', {}, 'Recorded flows'),
    h('div', { class: 'wifams' }, fams));
}
async function runWhatIf(ev) {
  ev && ev.preventDefault();
  const f = $('#whatif-form'), st = $('#whatif-status'), since = f.since.value;
  st.textContent = 'Replaying the recorded flows…'; st.className = 'muted';
  f.policy.removeAttribute('aria-invalid');
  try {
    const r = await api('/audit/whatif?' + new URLSearchParams({ since }), { method: 'POST', text: f.policy.value, type: 'application/yaml' });
    st.textContent = '';
    renderWhatIf(r, since);
  } catch (e) {
    // The API names the field: body (the YAML, with the document and
    // field at fault in its message), since or limit (too much work).
    st.textContent = errText(e); st.className = 'err';
    if (e.field === 'body') f.policy.setAttribute('aria-invalid', 'true');
    $('#whatif-out').replaceChildren();
  }
}
// whatifUpload puts an uploaded file's text in the editor.
async function whatifUpload(ev) {
  const file = ev.target.files[0];
  if (file) $('#whatif-form').policy.value = await file.text();
}

// ---- Recommend a policy ----
// GET /policy/recommend answers NetworkPolicies for a scope (a namespace,
// a workload of it, or the cluster) from the flows observed in a window,
// with their proof: the replay of those flows per family, the static
// audit with them, and the diff against the policies in force. The
// window is sent as fixed instants and kept in the URL: the link
// reproduces the same YAML.
const rec = { gen: 0, blob: '' };
// recommendHref links the page for a scope ({namespace, workload
// KIND/NAME or NAME, mode}) over the last window (default 6h), run.
const recommendHref = sc => hashURL('recommend', { namespace: sc.namespace, workload: sc.workload, mode: sc.mode, window: sc.window || '6h', run: 1 });
const scopeText = sc => sc.workload ? 'workload ' + sc.namespace + '/' + sc.workload.split('/').pop() : sc.namespace ? 'namespace ' + sc.namespace : 'the cluster';
// workloadScope is a workload's scope: KIND/NAME when the kind is known.
const workloadScope = (ns, kind, name) => ({ namespace: ns, workload: kind ? kind + '/' + name : name });
// findingScope is what to recommend for a finding: for an unprotected
// workload, least privilege for it; for a dual-stack gap, close-gaps of
// its policy's namespace, or least privilege for the workload at its
// destination (selectors cover both families); null for the others (a
// single-stack Service is fixed in the Service, not in a policy).
function findingScope(f) {
  const objs = f.objects || [];
  const wl = o => o && o.namespace && !['NetworkPolicy', 'Service'].includes(o.kind) ? Object.assign(workloadScope(o.namespace, o.kind, o.name), { mode: 'least-privilege' }) : null;
  if (/^unprotected-/.test(f.kind)) return wl(objs.find(o => o.kind !== 'NetworkPolicy'));
  if (!f.kind.startsWith('dual-stack-') || f.kind === 'dual-stack-service-single-stack') return null;
  const pol = objs.find(o => o.kind === 'NetworkPolicy');
  if (pol) return { namespace: pol.namespace, mode: 'close-gaps' };
  return wl(objs.find(o => o.role === 'destination'));
}
const protoNames = { 1: 'ICMP', 6: 'TCP', 17: 'UDP', 58: 'ICMPv6', 132: 'SCTP' };
// recChanges are a family's replayed flows of one kind as the what-if's
// changes: observed (allowed, or only denied) → with the recommendation.
function recChanges(flows, kind, until) {
  const before = { ingress: { verdict: kind === 'newly-denied' ? 'allowed' : 'denied' } };
  return flows.map(f => ({ src: f.src, dst: f.dst, protocol: protoNames[f.protocol] || String(f.protocol), dst_port: f.dst_port, ip_version: f.ip_version,
    records: f.allowed + f.denied, last_seen: until, change: kind, before, after: f.after }));
}
// recReplay is one family's replay: how many observed allowed flow
// groups stay allowed, then the newly denied and newly allowed ones.
function recReplay(f, r, win) {
  const fam = f.family, all = f.newly_denied.length === 0;
  return h('div', { class: 'wifam famdetail v' + fam, 'data-family': fam, 'data-allowed': f.allowed, 'data-kept': f.kept,
    'data-newly-denied': f.newly_denied.length, 'data-newly-allowed': f.newly_allowed.length },
  h('h2', {}, famBadge(fam), ' IPv' + fam + ': ', h('span', { class: 'verdict ' + (all ? 'allowed' : 'denied') }, f.kept + ' of ' + f.allowed), ' observed allowed flow groups stay allowed'),
  f.probes ? h('p', { class: 'muted' }, f.probes + ' flow groups of traceflow probes only: not replayed') : null,
  ['newly-denied', 'newly-allowed'].map(k => whatifChangeList(fam, k, recChanges(k === 'newly-denied' ? f.newly_denied : f.newly_allowed, k, r.until), win, 'the recommendation')));
}
// recDiffLine colours a unified diff's line: added, removed, a hunk.
function recDiffLine(l) {
  const cls = /^\+(?!\+\+ )/.test(l) ? 'add' : /^-(?!-- )/.test(l) ? 'del' : l.startsWith('@@') ? 'hunk' : null;
  return h('span', { class: cls }, l + '\n');
}
// recDiff is the diff against the policies in force: per policy, added
// or changed, in words, then the unified diff (changed) or the new
// policy folded (added). A server that does not answer it shows nothing.
function recDiff(d) {
  if (!Array.isArray(d)) return null;
  if (!d.length) return [h('h3', {}, 'Against the current policies'), h('p', { class: 'muted recdiffnone' }, 'No policy in force changes, and none is added.')];
  const n = c => d.filter(x => x.change === c).length;
  return [h('h3', {}, 'Against the current policies ', h('span', { class: 'count' }, n('added') + ' added · ' + n('changed') + ' changed')),
    d.map(x => h('div', { class: 'recdiff', 'data-change': x.change, 'data-policy': x.namespace + '/' + x.name },
      h('h4', {}, h('span', { class: 'chg ' + x.change }, x.change), ' NetworkPolicy ' + x.namespace + '/' + x.name),
      (x.summary || []).length ? h('ul', { class: 'recsummary' }, x.summary.map(t => h('li', {}, t))) : null,
      x.unified ? h('pre', { class: 'codebox diff', 'aria-label': 'unified diff of ' + x.name }, x.unified.replace(/\n$/, '').split('\n').map(recDiffLine))
        : h('details', {}, h('summary', {}, x.change === 'added' ? 'The new policy' : 'The proposed policy'), h('pre', { class: 'codebox diff' }, x.proposed || ''))))];
}
// recFile names the download after the scope.
const recFile = r => (r.namespace ? r.namespace + (r.workload ? '-' + r.workload : '') : 'cluster') + '-networkpolicies.yaml';
function renderRecommend(r, win) {
  const sc = { namespace: r.namespace, workload: r.workload };
  if (rec.blob) URL.revokeObjectURL(rec.blob);
  rec.blob = URL.createObjectURL(new Blob([r.yaml], { type: 'application/yaml' }));
  const pre = h('pre', { class: 'codebox recyaml', tabindex: 0, 'aria-label': 'Recommended NetworkPolicies (YAML)' }, r.yaml);
  const copied = h('span', { class: 'muted', role: 'status' });
  const copy = async () => {
    try { await navigator.clipboard.writeText(r.yaml); copied.textContent = 'copied'; } catch (e) {
      // No clipboard (an insecure origin, a refusal): select it to copy.
      getSelection().selectAllChildren(pre); copied.textContent = 'selected: Ctrl+C copies it';
    }
  };
  const whatif = e => { e.preventDefault(); $('#whatif-form').policy.value = r.yaml; location.hash = '#/audit'; };
  const pols = r.policies.length;
  // The parts a recommendation lacks (notes, a diff) are null.
  $('#rec-out').replaceChildren(...[
    h('p', { class: 'wisummary', 'data-flows': r.flows }, (pols ? pols + (pols === 1 ? ' NetworkPolicy' : ' NetworkPolicies') : 'No NetworkPolicy') + ' (' + r.mode + ') for ' + scopeText(sc) +
      ' from the ' + r.flows + ' flow groups observed ' + fmtTimeZ(Date.parse(r.since)) + ' to ' + fmtTimeZ(Date.parse(r.until)) + '. Nothing is applied.'),
    h('div', { class: 'actions' },
      pols ? h('a', { class: 'act primary', id: 'rec-download', href: rec.blob, download: recFile(r) }, 'Download ' + recFile(r)) : null,
      h('button', { type: 'button', class: 'act', onclick: copy }, 'Copy'),
      pols ? h('a', { class: 'act', href: '#/audit', onclick: whatif, title: 'put the YAML in the Audit page\'s what-if: the reachability cells and pod pairs it changes' }, 'Open in the what-if') : null, copied),
    pols ? h('p', { class: 'muted' }, r.policies.join(' · ')) : null,
    pre,
    r.notes.length ? [h('h3', {}, 'Notes'), h('ul', { class: 'recnotes' }, r.notes.map(t => h('li', {}, t)))] : null,
    h('h3', {}, 'Replay: the window\'s flows with the policies in force plus these'),
    h('div', { class: 'wifams' }, r.replay.length ? r.replay.map(f => recReplay(f, r, win)) : h('p', { class: 'muted' }, 'No flow of the scope in the window.')),
    recDiff(r.diff),
    h('h3', {}, 'Static audit with the recommendation ', h('span', { class: 'count' }, r.findings.length + (r.findings.length === 1 ? ' finding' : ' findings'))),
    r.findings.length ? h('ul', { class: 'findings recfindings' }, r.findings.map(findingItem)) : h('p', { class: 'muted' }, 'No workload of the scope left unprotected, no dual-stack gap.'),
  ].flat(2).filter(x => x !== null && x !== undefined && x !== false));
}
// recWorkloads suggests the workloads of the chosen namespace.
function recWorkloads() {
  const ns = $('#rec-form').namespace.value.trim();
  $('#dl-rec-workloads').replaceChildren(...catalog.workloads.filter(w => w.startsWith(ns + '/')).map(w => h('option', { value: w.slice(ns.length + 1) })));
}
// runRecommend asks for the form's scope and mode over win ({since,
// until}, instants), by default the Window ending now, and keeps it in
// the URL.
async function runRecommend(ev, win) {
  ev && ev.preventDefault();
  const f = $('#rec-form'), st = $('#rec-status'), btn = f.querySelector('button[type=submit]');
  for (const el of f.elements) el.removeAttribute('aria-invalid');
  if (!win) {
    const until = Math.floor(Date.now() / 1000) * 1000;
    win = { since: new Date(until - parseDur(f.window.value) * 1000).toISOString(), until: new Date(until).toISOString() };
  }
  const q = { namespace: f.namespace.value.trim(), workload: f.workload.value.trim(), mode: f.mode.value, since: win.since, until: win.until };
  history.replaceState(null, '', hashURL('recommend', Object.assign({}, q, { window: f.window.value, run: 1 }))); current.hash = location.hash;
  const gen = ++rec.gen;
  st.replaceChildren(h('span', { class: 'spinner', 'aria-hidden': 'true' }), 'Recommending: reading the window\'s flows, replaying them with the recommendation…');
  st.className = 'muted busy';
  btn.disabled = true;
  $('#rec-out').replaceChildren();
  try {
    const r = await api('/policy/recommend?' + new URLSearchParams(Object.entries(q).filter(([, v]) => v)));
    if (gen !== rec.gen) return;
    st.textContent = ''; st.className = 'muted';
    renderRecommend(r, f.window.value);
  } catch (e) {
    if (gen !== rec.gen) return;
    // The API names the field: namespace or workload (not in the
    // cluster), mode, since/until (the window), limit (too much work).
    st.textContent = errText(e); st.className = 'err';
    const el = f.elements[['since', 'until', 'limit'].includes(e.field) ? 'window' : e.field];
    if (el) el.setAttribute('aria-invalid', 'true');
  } finally { if (gen === rec.gen) btn.disabled = false; }
}
// enterRecommend fills the form from the URL (a scope, a mode, a window
// length, or the fixed since and until of an earlier answer) and runs it
// when asked.
async function enterRecommend(params) {
  const f = $('#rec-form');
  await loadCatalog();
  if ([...params].length) {
    f.namespace.value = params.get('namespace') || '';
    f.workload.value = params.get('workload') || '';
    f.mode.value = params.get('mode') === 'close-gaps' ? 'close-gaps' : 'least-privilege';
    const w = params.get('window');
    if ([...f.window.options].some(o => o.value === w)) f.window.value = w;
  } else if (!f.namespace.value) f.namespace.value = catalog.namespaces[0] || '';
  recWorkloads();
  const since = params.get('since'), until = params.get('until');
  if (params.get('run')) await runRecommend(null, since && until ? { since, until } : null);
}

// ---- SQL ----
const sqlShown = 2000;
async function runSQL(ev) {
  ev && ev.preventDefault();
  const q = $('#sql-text').value;
  const st = $('#sql-status'); st.textContent = 'Running…'; st.className = 'muted';
  const here = stillHere();
  try {
    const r = await api('/sql', { method: 'POST', body: { query: q } });
    if (here()) banner('');
    $('#sql-table thead').replaceChildren(h('tr', {}, r.columns.map(c => h('th', { title: c.type }, c.name))));
    // The table draws at most sqlShown rows (a browser slows down past
    // that); CSV download has them all.
    const shown = r.rows.slice(0, sqlShown);
    $('#sql-table tbody').replaceChildren(...shown.map(row => h('tr', {}, row.map(v => h('td', {}, typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v))))));
    const lim = r.limits || {};
    st.textContent = `${r.rows.length} rows in ${((r.elapsed_seconds || 0) * 1000).toFixed(0)} ms` + (lim.max_rows ? ` (limits: ${lim.max_rows} rows, ${lim.max_execution_seconds} s)` : '');
    if (shown.length < r.rows.length) st.textContent += ` · the first ${shown.length} drawn (Download CSV has all ${r.rows.length})`;
    if (r.truncated) { st.textContent += ' · truncated: the query has more rows than the ' + (lim.max_rows || r.rows.length) + '-row limit'; st.className = 'warnline'; }
  } catch (e) { st.textContent = errText(e); st.className = 'err'; }
}
async function downloadCSV() {
  try {
    const r = await api('/sql', { method: 'POST', body: { query: $('#sql-text').value, format: 'csv' }, raw: true });
    const blob = await r.blob();
    const a = h('a', { href: URL.createObjectURL(blob), download: 'dualflow-query.csv' });
    document.body.append(a); a.click(); a.remove();
  } catch (e) { $('#sql-status').textContent = errText(e); $('#sql-status').className = 'err'; }
}

// ---- SQL page: the schema sidebar ----
// The sidebar is docs/schema.md as the server embeds it (GET /schema): the
// tables and their columns, the REST names of the columns and the example
// queries, which a click puts in the editor.
// parseSchemaDoc reads the Markdown: per "## " section its tables (with
// the "### " subsection they are in) and its ```sql blocks, each titled by
// the sentence before it.
function parseSchemaDoc(md) {
  const sections = [];
  let sec = null, sub = '', table = null, sql = null, para = [], paraDone = false;
  for (const raw of md.split('\n')) {
    const line = raw.trim();
    if (sql) {
      if (line.startsWith('```')) { sec.examples.push({ title: para.join(' ').replace(/:$/, '') || sec.title, sql: sql.join('\n').trim().replace(/;$/, '') }); sql = null; para = []; } else sql.push(raw.replace(/^ {2}/, ''));
      continue;
    }
    if (line.startsWith('## ')) { sec = { title: line.slice(3), tables: [], examples: [] }; sections.push(sec); sub = ''; table = null; para = []; continue; }
    if (!sec) continue;
    if (line === '```sql') { sql = []; continue; }
    if (line.startsWith('### ')) { sub = line.slice(4); table = null; para = []; continue; }
    if (line.startsWith('|')) {
      const cells = line.replace(/^\||\|$/g, '').split('|').map(c => c.trim());
      if (!table) { table = { sub, head: cells, rows: [] }; sec.tables.push(table); } else if (!cells.every(c => /^:?-+:?$/.test(c))) table.rows.push(cells);
      continue;
    }
    table = null;
    if (!line) { paraDone = true; continue; }
    if (paraDone) { para = []; paraDone = false; }
    para.push(line);
  }
  return sections;
}
// mdInline renders `code` spans (and drops ** emphasis).
function mdInline(text) {
  return text.split('`').map((part, i) => i % 2 ? h('code', {}, part) : part.replace(/\*\*/g, ''));
}
const codeNames = text => (text.match(/`[^`]+`/g) || []).map(x => x.slice(1, -1));
// insertSQL puts text at the editor's cursor.
function insertSQL(text) {
  const ta = $('#sql-text');
  ta.setRangeText(text, ta.selectionStart, ta.selectionEnd, 'end'); ta.focus();
}
let schemaLoaded = false;
async function loadSchema() {
  if (schemaLoaded) return;
  const box = $('#sql-schema');
  let md;
  try { md = await (await api('/schema', { raw: true })).text(); } catch (e) { box.replaceChildren(h('p', { class: 'err' }, errText(e))); return; }
  schemaLoaded = true;
  const secs = parseSchemaDoc(md);
  const out = [h('h2', {}, 'Tables'), h('p', { class: 'muted' }, 'In database ', h('code', {}, 'dualflow'), '; click a name to insert it.')];
  for (const s of secs) {
    const name = codeNames(s.title)[0];
    const cols = s.tables.filter(t => t.head[0] === 'column');
    if (name && cols.length) {
      out.push(h('details', { class: 'tbl', 'data-table': name, open: name === 'flows' },
        h('summary', {}, h('a', { class: 'ins', onclick: e => { e.preventDefault(); insertSQL('dualflow.' + name); } }, name)),
        cols.flatMap(t => [t.sub ? h('h4', {}, t.sub) : null, h('ul', { class: 'cols' }, t.rows.map(r => h('li', { title: r[2] ? r[2].replace(/`/g, '') : '' },
          codeNames(r[0]).flatMap((c, i) => [i ? ', ' : '', h('a', { class: 'ins col', onclick: () => insertSQL(c) }, c)]), r[1] ? h('span', { class: 'muted' }, ' ' + r[1]) : '')))])));
    }
    for (const t of s.tables.filter(t => t.head[0] === 'table' && t.head[1] === 'key columns')) {
      out.push(h('details', { class: 'tbl' }, h('summary', {}, s.title),
        h('ul', { class: 'cols' }, t.rows.map(r => h('li', { title: 'key: ' + r[1].replace(/`/g, '') + '; sums: ' + r[2] },
          codeNames(r[0]).map(c => h('a', { class: 'ins', 'data-table': c, onclick: () => insertSQL('dualflow.' + c) }, c)))))));
    }
  }
  const rest = secs.find(s => /^REST names/.test(s.title));
  if (rest && rest.tables[0]) {
    out.push(h('h2', {}, 'REST names ↔ SQL columns'),
      h('table', { class: 'data restmap' }, h('thead', {}, h('tr', {}, h('th', {}, 'REST'), h('th', {}, 'SQL'))),
        h('tbody', {}, rest.tables[0].rows.map(r => h('tr', {}, h('td', {}, mdInline(r[0])), h('td', {}, mdInline(r[1])))))));
  }
  const examples = secs.flatMap(s => s.examples.filter(x => /\bFROM dualflow\./.test(x.sql)));
  out.push(h('h2', {}, 'Example queries'),
    h('ul', { class: 'examples' }, examples.map(x => h('li', {}, h('a', { class: 'ins example', href: '#/sql', title: x.sql, onclick: e => { e.preventDefault(); $('#sql-text').value = x.sql; $('#sql-text').focus(); } }, mdInline(x.title))))));
  box.replaceChildren(...out);
}

// ---- routing ----
// A page's state is in its hash: #/page?params. Links from one page to
// another (map → flows, audit → reachability) are plain hrefs.
// current.nav counts navigations: a load keeps stillHere() from its
// start, and an answer that arrives after the user moved on neither
// clears nor sets the banner of the page now shown.
const current = { hash: null, nav: 0 };
function stillHere() { const n = current.nav; return () => n === current.nav; }
function applyFormParams(form, params, exprName) {
  const expr = [];
  for (const [k, v] of params) {
    if (form.elements[k] && k !== exprName) form.elements[k].value = v;
    else expr.push(k + '=' + v);
  }
  if (exprName) form.elements[exprName].value = expr.join(' ');
}
async function enterReach(params) {
  const f = $('#reach-form');
  if (params.has('sources') || params.has('destinations')) {
    f.sources.value = (params.get('sources') || '').split(',').join('\n');
    f.destinations.value = (params.get('destinations') || '').split(',').join('\n');
    // ICMP and ICMPv6 are one question.
    f.protocol.value = (params.get('protocol') || 'TCP').toUpperCase().replace(/^ICMPV6$/, 'ICMP');
    if (!f.protocol.value) f.protocol.value = 'TCP';
    f.port.value = params.get('port') || '';
    if (params.get('since')) f.since.value = params.get('since');
    reachProtocol();
  } else if (!f.sources.value.trim()) {
    await loadCatalog();
    const ws = catalog.workloads.map(w => 'workload:' + w);
    f.sources.value = ws.slice(0, 3).join('\n');
    f.destinations.value = [...ws.slice(0, 3), ...catalog.services.slice(0, 2).map(s => 'service:' + s)].join('\n');
  }
  if (params.get('run')) {
    await runReach();
    const cell = (params.get('cell') || '').split(',');
    const fam = params.get('family') || '6';
    // URL values go into a selector: only indexes and a family.
    if (cell.length === 2 && /^\d+$/.test(cell[0]) && /^\d+$/.test(cell[1]) && /^[46]$/.test(fam)) {
      const td = $(`.matrix table[data-family="${fam}"] td.cell[data-si="${cell[0]}"][data-di="${cell[1]}"]`);
      if (td) { td.classList.add('focus'); td.click(); }
    }
  }
}
async function enterTrace(params) {
  const f = $('#trace-form');
  if (params.has('source') || params.has('destination')) {
    f.source.value = params.get('source') || '';
    f.destination.value = params.get('destination') || '';
    const proto = (params.get('protocol') || 'TCP').toUpperCase();
    f.protocol.value = proto;
    f.port.value = params.get('port') || '';
    f.family.value = traceFamily(params.get('family'));
    if (f.protocol.value !== proto) {
      // Not traced as another protocol: say so, and leave the choice.
      banner(proto + ' cannot be traced: a trace sends TCP, UDP or ICMP.');
      f.protocol.value = 'TCP';
      $('#trace-out').replaceChildren();
      return;
    }
  } else if (!f.source.value.trim()) {
    await loadCatalog();
    const s = catalog.sample;
    if (s) {
      f.source.value = 'pod:' + s.src_namespace + '/' + s.src_pod;
      f.destination.value = s.service_name ? 'service:' + s.service_namespace + '/' + s.service_name : 'pod:' + s.dst_namespace + '/' + s.dst_pod;
      f.protocol.value = s.protocol_name; f.port.value = s.service_port || s.dst_port;
    } else if (catalog.pods.length) f.source.value = 'pod:' + catalog.pods[0];
  }
  if (params.get('run')) runTrace();
}
const pages = {
  flows: params => {
    if ([...params].length || !current.flowsLoaded) { applyFlowParams(params); current.flowsLoaded = true; loadFlows(false); return; }
    try { keepFlowURL(flowQuery()); } catch (e) { /* the form shows its own error on submit */ }
  },
  charts: params => { $('#charts-form').reset(); applyFormParams($('#charts-form'), params, 'expr'); loadCharts(); },
  map: params => { const f = $('#map-form'); mapScopes(params.get('namespace') || ''); f.group.value = params.get('group') || 'workload'; applyFormParams(f, params, 'expr'); loadMap(); },
  reach: enterReach,
  trace: enterTrace,
  audit: () => loadAudit(),
  recommend: enterRecommend,
  sql: () => { loadSchema(); },
};
function route() {
  if (location.hash === current.hash) return; // our own replaceState
  current.hash = location.hash; current.nav++;
  const m = location.hash.match(/^#\/(\w+)\??(.*)$/) || [];
  const name = pages[m[1]] ? m[1] : 'flows';
  const params = new URLSearchParams(m[2] || '');
  document.querySelectorAll('.page').forEach(s => { s.hidden = s.id !== 'page-' + name; });
  document.querySelectorAll('#nav a').forEach(a => a.classList.toggle('active', a.dataset.page === name));
  if (name !== 'flows') stopFollow();
  closeDrawer(); banner('');
  document.title = 'dualflow · ' + $('#nav a[data-page=' + name + ']').textContent;
  pages[name](params);
}

// me is who the pages are for (GET /whoami); a Kubernetes user whose RBAC
// lists pods in some namespaces, not all, has me.namespaces, and the
// pages say what that leaves them (docs/security.md).
let me = null;
async function whoami() {
  try {
    me = await api('/whoami');
  } catch (e) { me = null; }
  const scoped = !!(me && Array.isArray(me.namespaces));
  const kube = !!(me && me.role === 'kubernetes');
  $('#whoami').textContent = !me ? '' : !me.auth ? 'no auth (loopback)' :
    me.name + (kube ? ' (Kubernetes' + (scoped ? ': ' + me.namespaces.join(', ') : '') + ')' : ' (' + me.role + ')');
  const ns = scoped ? (me.namespaces.length > 1 ? 'namespaces ' : 'namespace ') + me.namespaces.join(', ') : '';
  const note = $('#scope-note');
  note.hidden = !scoped;
  note.textContent = scoped ? 'Kubernetes RBAC lets you list pods in the ' + ns + ' only. You see their flows, map and audit reports; ' +
    'a flow whose other end is a pod of another namespace shows that end\'s namespace and address family, nothing more. ' +
    'Reachability and traces are between the pods and Services of your namespaces. ' +
    'SQL, the what-if, Recommend and the cluster status need list on pods in all namespaces.' : '';
  const sql = $('#sql-denied');
  sql.hidden = !scoped;
  sql.textContent = scoped ? 'SQL reads every namespace\'s rows: it needs list on pods in all namespaces and create on sql.dualflow.io ' +
    '(ClusterRole dualflow-sql). Kubernetes RBAC lets you list pods in the ' + ns + ' only.' : '';
  $('#sql-form button[type=submit]').disabled = scoped;
}

// kubeStatus shows, in the header, when the collector's view of the
// cluster is stale (the API server unreachable): names in the pages may
// be out of date, and the rows written meanwhile say so (k8s_view_stale).
// The note under the header says the same on every page, in words: what
// the page shows may be out of date (stale) or incomplete (syncing: the
// view is empty until the initial lists are indexed).
async function kubeStatus() {
  const el = $('#k8s-status'), note = $('#view-note');
  const clear = () => { el.hidden = true; el.textContent = ''; note.hidden = true; note.textContent = ''; };
  // The status spans every namespace: a user limited to some may not
  // read it (a 403 every 10 s, and an access review each).
  if (me && me.namespaces) { clear(); return; }
  try {
    // A quiet fetch: a background poll neither flashes the progress bar
    // nor reopens the token dialog every 10 s.
    const r = await fetch(API + '/status', { headers: headers({}) });
    if (!r.ok) throw new Error('HTTP ' + r.status);
    const k = (await r.json()).kubernetes;
    const down = (k.kinds || []).filter(x => !x.watching);
    if (k.source === 'off' || k.source === 'inventory' || (!k.stale && k.synced)) { clear(); return; }
    const secs = Math.round(Math.max(0, ...down.map(x => x.stale_seconds)));
    el.textContent = k.synced ? 'Kubernetes view stale ' + secs + ' s' : 'Kubernetes view syncing';
    el.title = (k.synced ? 'The collector has not reached the Kubernetes API for ' + secs + ' s: names may be out of date (rows written meanwhile have k8s_view_stale = true).' : 'The initial lists are not indexed yet.') +
      (down.length ? ' Not watched: ' + down.map(x => x.kind).join(', ') + '.' : '');
    el.hidden = false;
    note.textContent = k.synced
      ? 'The Kubernetes view is stale: the collector has not reached the Kubernetes API for ' + secs + ' s' + (down.length ? ' (' + down.map(x => x.kind).join(', ') + ' not watched)' : '') +
        '. Pods, workloads, Services and policies on this page may be out of date; flows recorded meanwhile are marked k8s_view_stale.'
      : 'The Kubernetes view is still syncing: until the initial lists are indexed it is empty or partial, so names, reachability and audit answers on this page are incomplete.';
    note.hidden = false;
  } catch (e) { clear(); }
}

function init() {
  // The rows of traceflow probes are hidden unless this toggle asks for
  // them (probes=include): a trace is not traffic.
  $('#f-follow').parentElement.before(h('label', { class: 'toggle', title: 'Show the flows of traceflow probes (each trace, and each reachability cell traced, sends one per family); hidden by default: a trace is not traffic' },
    h('input', { type: 'checkbox', id: 'f-probes' }), ' Trace probes'));
  $('#f-probes').addEventListener('change', () => loadFlows(false));
  drawFlowColumns();
  $('#flow-filter').addEventListener('submit', e => { e.preventDefault(); loadFlows(false); });
  for (const id of ['#f-family', '#f-verdict', '#f-since']) $(id).addEventListener('change', () => loadFlows(false));
  $('#f-follow').addEventListener('change', e => { if (e.target.checked) startFollow(); else { stopFollow(); banner(''); } });
  $('#flow-more').addEventListener('click', () => loadFlows(true));
  $('#map-form').addEventListener('submit', e => { e.preventDefault(); loadMap(); });
  $('#charts-form').addEventListener('submit', e => { e.preventDefault(); loadCharts(); });
  for (const sel of ['#charts-form select', '#map-form select']) document.querySelectorAll(sel).forEach(s => s.addEventListener('change', () => s.form.requestSubmit()));
  $('#reach-form').addEventListener('submit', runReach);
  $('#reach-form').protocol.addEventListener('change', reachProtocol);
  // The adders put a suggested endpoint on its own line of the list.
  document.querySelectorAll('#reach-form .adder').forEach(inp => {
    const add = () => {
      const v = inp.value.trim(); if (!v) return;
      const ta = $('#reach-form').elements[inp.dataset.target];
      ta.value = (ta.value.trim() ? ta.value.trim() + '\n' : '') + v; inp.value = '';
    };
    inp.addEventListener('change', add);
    inp.addEventListener('keydown', e => { if (e.key === 'Enter') { e.preventDefault(); add(); } });
  });
  $('#trace-form').addEventListener('submit', runTrace);
  $('#whatif-form').addEventListener('submit', runWhatIf);
  $('#whatif-form').file.addEventListener('change', whatifUpload);
  $('#rec-form').addEventListener('submit', runRecommend);
  $('#rec-form').namespace.addEventListener('change', recWorkloads);
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
    if (v) { whoami(); current.hash = null; current.flowsLoaded = false; route(); }
  });
  window.addEventListener('hashchange', route);
  whoami().then(kubeStatus); setInterval(kubeStatus, 10000);
  loadCatalog();
  route();
}
document.addEventListener('DOMContentLoaded', init);
