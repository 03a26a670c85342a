// The toolmux console: draws what /ui/api/* answers. Every figure comes from the server; this
// script only lays it out (text is always set as text, never parsed as HTML).
'use strict';

const TOKEN_KEY = 'toolmux-token';
const views = ['overview', 'playground', 'tools', 'traffic'];
let current = 'overview';
let viewer = null;

function el(tag, attrs, ...children) {
  const node = tag === 'svg' || ['polyline', 'line', 'text', 'g', 'circle'].includes(tag)
    ? document.createElementNS('http://www.w3.org/2000/svg', tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.setAttribute('class', v);
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function problem(text) {
  const p = document.getElementById('problem');
  p.hidden = !text;
  p.textContent = text || '';
}

async function api(path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  const init = { headers, cache: 'no-store' };
  if (body !== undefined) {
    init.method = 'POST';
    headers['Content-Type'] = 'application/json';
    headers['X-Toolmux-Console'] = '1';
    init.body = JSON.stringify(body);
  }
  const res = await fetch('/ui/api/' + path, init);
  if (res.status === 401) {
    document.getElementById('login').hidden = false;
    throw new Error('credentials needed');
  }
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(data.error || res.status + ' ' + res.statusText);
  document.getElementById('login').hidden = true;
  if (data.viewer) showViewer(data.viewer);
  return data;
}

function showViewer(v) {
  viewer = v;
  document.getElementById('viewer').textContent = v.principal + (v.admin ? ' (admin)' : '');
  document.body.classList.toggle('admin', v.admin);
  for (const n of document.querySelectorAll('.admin-only')) n.hidden = !v.admin;
}

function ago(secs) {
  if (secs === null || secs === undefined) return '-';
  if (secs < 120) return secs + ' s';
  if (secs < 7200) return Math.round(secs / 60) + ' min';
  return Math.round(secs / 3600) + ' h';
}

function badge(text, cls) {
  return el('span', { class: 'badge ' + (cls || text) }, text);
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// Overview.

async function overview() {
  const data = await api('overview');
  const s = data.status;
  const state = s.stopping ? 'stopping' : s.ready ? 'ready' : 'starting';
  const facts = [
    ['state', state], ['mode', s.mode], ['catalog generation', s.catalog.generation],
    ['tools', s.catalog.tools], ['search', s.catalog.search], ['live sessions', s.sessions.live],
    ['embedder', s.embedder.model ? s.embedder.model.split('@')[0].split('/').pop() + ' (' + s.embedder.state + ')' : 'none'],
    ['tasks', s.tasks.relayed], ['held tool versions', Array.isArray(s.integrity.held) ? s.integrity.held.length : s.integrity.held],
  ];
  if (s.learning) {
    const a = s.learning.adapter, fit = a.last_fit;
    facts.push(['labels learned', s.learning.labels]);
    facts.push(['query adapter', a.served ? 'v' + a.version + ' (+' + fit.margin + ' recall@8)'
      : fit ? 'not served (' + (fit.margin >= 0 ? '+' : '') + fit.margin + ' of +' + a.required_margin + ')' : 'not fitted']);
  }
  document.getElementById('summary').replaceChildren(...facts.map(([k, v]) =>
    el('div', { 'data-fact': k }, el('b', {}, v), k)));
  fill(document.querySelector('#backends tbody'), s.backends.map(b => el('tr', { 'data-backend': b.name, 'data-health': b.health },
    el('td', {}, b.name), el('td', {}, b.transport), el('td', {}, b.session),
    el('td', {}, badge(b.health)), el('td', {}, ago(b.health_since_secs)),
    el('td', {}, b.breaker === 'none' ? '-' : badge(b.breaker), b.breaker_retry_in_secs ? ' retry in ' + ago(b.breaker_retry_in_secs) : ''),
    el('td', {}, b.tools), el('td', {}, b.client_sessions),
    el('td', { class: b.last_error ? 'error' : null }, b.last_error ? ago(b.last_error_secs_ago) + ' ago: ' + b.last_error : '-'))));
  const principals = data.principals.length ? data.principals.map(p => el('tr', { 'data-principal': p.principal },
    el('td', {}, p.principal), el('td', {}, p.sessions), el('td', {}, p.tasks_running),
    el('td', {}, p.tasks_finished), el('td', {}, p.sessionless ? 'yes' : 'no')))
    : [el('tr', {}, el('td', { colspan: 5, class: 'empty' }, 'no sessions or tasks'))];
  fill(document.querySelector('#principals tbody'), principals);
  const sessions = data.sessions.length ? data.sessions.map(x => el('tr', { 'data-session': x.session || 'stdio', 'data-surface': x.surface },
    el('td', {}, x.session || '(stdio)'), el('td', {}, x.principal), el('td', {}, x.client || '(no name)'),
    el('td', {}, x.surface), el('td', {}, x.why)))
    : [el('tr', {}, el('td', { colspan: 5, class: 'empty' }, 'no live sessions'))];
  fill(document.querySelector('#sessions tbody'), sessions);
  const limits = data.limits.length ? data.limits.map(u => el('tr', { 'data-limit': u.rule + ' ' + u.limit, 'data-principal': u.principal },
    el('td', {}, u.principal === '*' ? '(everyone, shared)' : u.principal), el('td', {}, u.rule), el('td', {}, u.limit),
    el('td', { class: u.used >= u.allowed ? 'error' : null }, u.used), el('td', {}, u.allowed)))
    : [el('tr', {}, el('td', { colspan: 5, class: 'empty' }, 'no [[limits]] rule has counted a request yet'))];
  fill(document.querySelector('#limits tbody'), limits);
  const r = s.reload;
  const reload = r.last_error ? 'Last reload refused: ' + r.last_error
    : r.last ? 'Last reload: ' + r.last : r.applied ? '(details for admins)' : 'None since start.';
  document.getElementById('reload').textContent = (r.applied ? r.applied + ' applied. ' : '') + reload;
}

// Search playground.

function bars(hit, scale) {
  const row = (name, v) => {
    const bar = el('div', { class: 'bar ' + name + (v < 0 ? ' negative' : '') });
    bar.style.width = Math.max(1, Math.round(Math.abs(v) / scale * 140)) + 'px';
    return [el('span', {}, name), el('div', {}, bar), el('span', { 'data-part': name }, v.toFixed(3))];
  };
  const parts = [row('dense', hit.dense), row('keyword', hit.keyword)];
  // Learning's part is shown to admins only (absent otherwise).
  if (typeof hit.learned === 'number' && hit.learned !== 0) parts.push(row('learned', hit.learned));
  return el('div', { class: 'bars' }, parts);
}

function renderResult(box, data) {
  const scale = Math.max(0.001, ...data.ranked.flatMap(h => [Math.abs(h.dense), Math.abs(h.keyword), Math.abs(h.learned || 0)]));
  const t = data.timings_ms;
  const scope = data.scope.principal + (data.scope.groups.length ? ' [' + data.scope.groups.join(', ') + ']' : '');
  const ranked = el('ol', { class: 'ranked' }, data.ranked.map(h => el('li', { 'data-name': h.name },
    el('span', { class: 'name' }, h.name), ' ',
    h.similarity !== null && h.similarity !== undefined ? el('span', { class: 'sim' }, 'similarity ' + h.similarity.toFixed(3)) : '',
    h.clause !== null && h.clause !== undefined ? el('span', { class: 'sim' }, ' (clause ' + (h.clause + 1) + ')') : '',
    el('div', { class: 'desc' }, h.description), bars(h, scale))));
  const answers = el('div', { class: 'answers' },
    ['compact', 'full'].map(form => el('div', { 'data-answer': form },
      el('div', {}, form + ' answer: ', el('b', { 'data-tokens': form }, data.answers[form].tokens), ' tokens'),
      el('pre', {}, JSON.stringify(data.answers[form].answer, null, 2)))));
  const parts = [
    el('div', { class: 'meta' }, 'verdict ', badge(data.verdict), ' · ', data.mode, ' · scope of ', scope, ' (',
      data.scope.tools, ' tools) · embed ', t.embed, ' ms, search ', t.search, ' ms, fuse ', t.fuse, ' ms'),
    data.ranked.length ? ranked : el('p', { class: 'empty' }, 'nothing in this scope matches'),
  ];
  if (Array.isArray(data.excluded)) {
    parts.push(el('h2', {}, 'Outside this scope, would have ranked'));
    parts.push(data.excluded.length
      ? el('ul', { class: 'excluded' }, data.excluded.map(x => el('li', { 'data-excluded': x.name },
        el('span', { class: 'name' }, x.name), ' #' + x.rank_if_allowed + (x.would_be_returned ? ' (would be returned)' : '') + ': ' + x.reason)))
      : el('p', { class: 'empty' }, 'nothing: every tool that ranks is in this scope'));
  }
  parts.push(el('h2', {}, 'The answers, side by side'), answers);
  box.replaceChildren(...parts);
}

function setupPane(pane) {
  pane.append(document.getElementById('pane-template').content.cloneNode(true));
  const form = pane.querySelector('form');
  const box = pane.querySelector('.result');
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const keywords = String(f.get('keywords') || '').trim();
    const body = { request: String(f.get('request') || ''), keywords: keywords ? [keywords] : [] };
    const principal = String(f.get('principal') || '').trim();
    if (principal) {
      body.principal = principal;
      body.groups = String(f.get('groups') || '').split(',').map(g => g.trim()).filter(Boolean);
    }
    box.replaceChildren(el('p', { class: 'empty' }, 'searching…'));
    try {
      renderResult(box, await api('search', body));
      box.dataset.done = '1';
    } catch (err) {
      box.replaceChildren(el('p', { class: 'error', 'data-error': '1' }, err.message));
    }
  });
  for (const n of pane.querySelectorAll('.admin-only')) n.hidden = !(viewer && viewer.admin);
}

// Tools.

// What a definition was flagged for (text aimed at the model), with the words that matched.
function flagList(flags) {
  if (!flags || !flags.length) return '';
  return el('ul', { class: 'flags', 'data-flags': flags.map(f => f.reason).join(' ') },
    flags.map(f => el('li', {}, badge('flagged'), ' ' + f.reason + ': \u201c' + f.matched + '\u201d')));
}

async function tools() {
  const data = await api('tools');
  const held = document.getElementById('held');
  if (!Array.isArray(data.held)) {
    held.replaceChildren(el('p', { class: 'empty' }, data.held + ' held (details for admins)'));
  } else if (!data.held.length) {
    held.replaceChildren(el('p', { class: 'empty' }, data.frozen ? 'nothing held' : 'nothing held (tools are not frozen: changes are served as they come)'));
  } else {
    held.replaceChildren(...data.held.map(h => el('div', { class: 'held-item', 'data-held': h.backend + '/' + h.tool },
      el('div', {}, badge(h.kind, 'held'), ' ', el('b', {}, h.backend + ' / ' + h.tool), ' seen ', new Date(h.seen_ms).toLocaleString(), ' ',
        el('button', { type: 'button', class: 'accept', 'data-accept': h.backend + '/' + h.tool, onclick: () => accept(h.backend, h.tool) }, 'Accept')),
      flagList(h.flags),
      el('pre', { class: 'diff' }, h.diff.map(([op, line]) =>
        el('span', { class: op === '+' ? 'add' : op === '-' ? 'del' : '' }, op + ' ' + line))))));
  }
  const open = new Set([...document.querySelectorAll('details.backend[open]')].map(d => d.dataset.backend));
  document.getElementById('catalog').replaceChildren(...data.backends.map(b => el('details',
    { class: 'backend', 'data-backend': b.name, open: open.has(b.name) },
    el('summary', {}, b.name + ' · ' + b.tools.length + ' tools · ', badge(b.health)),
    b.tools.length ? el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'Tool'), el('th', {}, 'State'), el('th', {}, 'Tokens'), el('th', {}, 'Searched by'))),
      el('tbody', {}, b.tools.map(t => el('tr', { 'data-tool': t.name },
        el('td', {}, el('b', {}, t.name), el('div', { class: 'search-text' }, t.description), flagList(t.flags)),
        el('td', {}, badge(t.state), t.in_scope ? '' : ' (not served now)'), el('td', {}, t.tokens),
        el('td', { class: 'search-text' }, t.search_text)))))
      : el('p', { class: 'empty' }, 'no tools listed'))));
}

async function accept(backend, tool) {
  try {
    await api('tools/accept', { backend, tool });
    problem('');
    await tools();
  } catch (err) {
    problem('not accepted: ' + err.message);
  }
}

// Traffic.

function chart(svg, series, format) {
  const W = 600, H = 140, L = 40, B = 18, T = 8;
  const values = series.flatMap(s => s.values.filter(v => v !== null));
  const max = Math.max(1e-9, ...values) * 1.1;
  const n = Math.max(2, series[0].values.length);
  const x = i => L + (W - L - 4) * i / (n - 1);
  const y = v => H - B - (H - B - T) * v / max;
  const parts = [
    el('line', { class: 'grid', x1: L, x2: W - 4, y1: y(0), y2: y(0) }),
    el('line', { class: 'grid', x1: L, x2: W - 4, y1: y(max / 1.1), y2: y(max / 1.1) }),
    el('text', { x: 2, y: y(max / 1.1) + 4 }, format(max / 1.1)),
    el('text', { x: 2, y: y(0) }, '0'),
    el('text', { x: L, y: H - 4 }, '10 min ago'),
    el('text', { x: W - 30, y: H - 4 }, 'now'),
  ];
  for (const s of series) {
    const points = [];
    s.values.forEach((v, i) => { if (v !== null) points.push(x(i).toFixed(1) + ',' + y(v).toFixed(1)); });
    parts.push(el('polyline', { class: s.cls, points: points.join(' '), 'data-series': s.name }));
    // Each measured slice as a dot too: a lone slice draws no line.
    s.values.forEach((v, i) => { if (v !== null && v > 0) parts.push(el('circle', { class: s.cls, cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5 })); });
  }
  svg.replaceChildren(...parts);
}

async function traffic() {
  const data = await api('traffic');
  document.getElementById('slice').textContent = data.slice_secs;
  const p = data.points;
  chart(document.getElementById('chart-requests'), [{ name: 'requests', cls: 's0', values: p.map(q => q.requests_per_sec) }], v => v.toFixed(1) + '/s');
  chart(document.getElementById('chart-latency'), [
    { name: 'p50', cls: 's0', values: p.map(q => q.find_p50_ms) },
    { name: 'p95', cls: 's1', values: p.map(q => q.find_p95_ms) }], v => v.toFixed(1) + ' ms');
  const share = k => p.map(q => q.searches ? q[k] : null);
  chart(document.getElementById('chart-verdicts'), [
    { name: 'good', cls: 'good', values: share('good') },
    { name: 'weak', cls: 'weak', values: share('weak') },
    { name: 'none', cls: 'none', values: share('none') }], v => Math.round(v * 100) + '%');
  const tokens = data.tokens.length ? data.tokens.map(t => el('tr', { 'data-principal': t.principal, 'data-backend': t.backend },
    el('td', {}, t.principal), el('td', {}, t.backend), el('td', {}, t.definitions), el('td', {}, t.results), el('td', {}, t.saved)))
    : [el('tr', {}, el('td', { colspan: 5, class: 'empty' }, 'nothing served yet'))];
  fill(document.querySelector('#tokens tbody'), tokens);
  const redactions = data.redactions.length ? data.redactions.map(r => el('tr', { 'data-backend': r.backend, 'data-rule': r.rule },
    el('td', {}, r.backend), el('td', {}, r.rule), el('td', {}, r.count)))
    : [el('tr', {}, el('td', { colspan: 3, class: 'empty' }, data.viewer.admin ? 'none scrubbed yet' : 'shown to admins'))];
  fill(document.querySelector('#redactions tbody'), redactions);
}

// Navigation and refresh.

const refreshers = { overview, tools, traffic, playground: null };
const every = { overview: 2000, tools: 5000, traffic: 5000 };

async function refresh() {
  const f = refreshers[current];
  if (!f) return;
  try {
    await f();
    problem('');
  } catch (err) {
    if (err.message !== 'credentials needed') problem(err.message);
  }
}

function show(view) {
  current = view;
  for (const v of views) document.getElementById('view-' + v).hidden = v !== view;
  for (const b of document.querySelectorAll('nav button')) b.classList.toggle('active', b.dataset.view === view);
  if (location.hash !== '#' + view) history.replaceState(null, '', '#' + view);
  refresh();
}

let timer = null;
function schedule() {
  clearTimeout(timer);
  timer = setTimeout(async () => {
    if (!document.hidden) await refresh();
    schedule();
  }, every[current] || 2000);
}

document.addEventListener('DOMContentLoaded', () => {
  for (const b of document.querySelectorAll('nav button')) b.addEventListener('click', () => show(b.dataset.view));
  document.getElementById('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById('token').value.trim());
    document.getElementById('token').value = '';
    refresh();
  });
  setupPane(document.getElementById('pane-a'));
  setupPane(document.getElementById('pane-b'));
  const start = location.hash.slice(1);
  show(views.includes(start) ? start : 'overview');
  schedule();
});
