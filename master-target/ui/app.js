// SPDX-License-Identifier: Apache-2.0
// The provider dashboard (master-target/dashboard.h). Everything it shows
// comes from the control API with the tab's token (Authorization: Bearer);
// it is redrawn every few seconds. No inline script or style (CSP): the DOM
// and the SVG are built here.
'use strict';

const REFRESH_MS = 5000;
const SVG = 'http://www.w3.org/2000/svg';
const token = sessionStorage.getItem('cdp_token');
let busy = false;
let timer = null;
// Per volume: the point chosen for a new export ("tenant/volume" -> point id).
const chosen = new Map();

class Unauthorized extends Error {}

async function api(method, path, body) {
  const opts = {method, headers: {'Authorization': 'Bearer ' + token}, cache: 'no-store'};
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 401) throw new Unauthorized('the control token is not valid here');
  let j = null;
  try { j = await r.json(); } catch (e) { j = null; }
  if (!r.ok) throw new Error((j && j.error) || ('HTTP ' + r.status));
  return j;
}

// --- small DOM helpers ---
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}
function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.setAttribute('class', v);
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids.flat()) if (k) e.append(k);
  return e;
}
function bytes(n) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  n = Number(n) || 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; ++i; }
  return (i === 0 || Number.isInteger(n) ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + u[i];
}
function secs(s) {
  if (s === null || s === undefined || s < 0) return '–';
  if (s < 1) return (s * 1000).toFixed(0) + ' ms';
  if (s < 120) return s.toFixed(s < 10 ? 1 : 0) + ' s';
  if (s < 7200) return (s / 60).toFixed(0) + ' min';
  if (s < 172800) return (s / 3600).toFixed(1) + ' h';
  return (s / 86400).toFixed(1) + ' d';
}
function clock(us) {
  return new Date(us / 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit', second: '2-digit'});
}
function stamp(us) {
  return new Date(us / 1000).toLocaleString([], {dateStyle: 'medium', timeStyle: 'medium'});
}

// --- tooltip ---
const tip = () => document.getElementById('tooltip');
function showTip(ev, lines) {
  const t = tip();
  t.replaceChildren(...lines.map((l, i) => el('div', {class: i === 0 ? 'tt-title' : 'tt-line', text: l})));
  t.classList.remove('hidden');
  const x = Math.min(ev.clientX + 14, window.innerWidth - t.offsetWidth - 8);
  const y = Math.max(ev.clientY - t.offsetHeight - 12, 8);
  t.style.left = x + 'px';
  t.style.top = y + 'px';
}
function hideTip() { tip().classList.add('hidden'); }
function hover(node, lines) {
  node.addEventListener('mousemove', (ev) => showTip(ev, lines));
  node.addEventListener('mouseleave', hideTip);
}

// --- state badges ---
function stateBadge(state) {
  let kind = 'ok';
  if (state.startsWith('stalled') || state.startsWith('LOCKED')) kind = 'bad';
  else if (state === 'failed-over' || state === 'rolling-back') kind = 'warn';
  else if (state !== 'protecting') kind = 'neutral';
  return el('span', {class: 'badge ' + kind, 'data-state': state, text: state});
}

// --- RPO lag over the last hour: one bar per bucket (its largest lag) ---
function sparkline(lag) {
  const W = 300, H = 118, L = 4, R = 4, T = 18, B = 16;
  const g = svg('svg', {class: 'spark', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'RPO lag, last hour'});
  const end = lag.now_us, start = end - lag.window_seconds * 1e6;
  const xs = (t) => L + (W - L - R) * (t - start) / (end - start);
  const samples = (lag.samples || []).filter((s) => s.batches > 0);
  const peak = samples.reduce((m, s) => Math.max(m, s.max_lag_seconds), 0);
  const top = Math.max(peak, 0.001);
  const ys = (v) => H - B - (H - B - T) * v / top;
  for (const f of [0.5, 1]) g.append(svg('line', {x1: L, x2: W - R, y1: ys(top * f), y2: ys(top * f), class: 'grid'}));
  g.append(svg('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis'}));
  g.append(svg('text', {x: L, y: H - 3, class: 'spark-max', text: '−60 min'}));
  g.append(svg('text', {x: (W - L - R) / 2 + L, y: H - 3, class: 'spark-max', 'text-anchor': 'middle', text: '−30 min'}));
  g.append(svg('text', {x: W - R, y: H - 3, class: 'spark-max', 'text-anchor': 'end', text: 'now'}));
  if (samples.length === 0) {
    g.append(svg('text', {x: W / 2, y: H / 2, class: 'spark-empty', 'text-anchor': 'middle', text: 'nothing applied in the last hour'}));
    return g;
  }
  g.append(svg('text', {x: W - R, y: 11, class: 'spark-max', 'text-anchor': 'end', text: 'peak ' + secs(peak)}));
  const step = lag.bucket_seconds * 1e6;
  const bw = Math.max((W - L - R) * step / (end - start) - 0.6, 1.2);
  for (const s of samples) {
    const y = Math.min(ys(s.max_lag_seconds), H - B - 1.5);
    const bar = svg('rect', {x: xs(s.time_us), y, width: bw, height: H - B - y, class: 'spark-bar'});
    hover(bar, [secs(s.max_lag_seconds) + ' largest lag', clock(s.time_us) + ' · ' + s.batches + ' batch(es) applied']);
    g.append(bar);
  }
  return g;
}

// --- the volume's use of the WAN link over the last hour: one bar per bucket ---
// (its wire bytes as a rate; as a share of the link when the MT knows the
// link's capacity, link_mbit in its config).
function linkChart(lag) {
  const W = 300, H = 118, L = 4, R = 4, T = 18, B = 16;
  const samples = (lag.samples || []).filter((s) => s.wire_bytes > 0);
  const total = samples.reduce((a, s) => a + s.wire_bytes, 0);
  const g = svg('svg', {class: 'spark link-use', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'Link use, last hour',
                        'data-wire-bytes': String(total), 'data-link-mbit': String(lag.link_mbit || 0)});
  const end = lag.now_us, start = end - lag.window_seconds * 1e6;
  const xs = (t) => L + (W - L - R) * (t - start) / (end - start);
  const mbit = (s) => s.wire_bytes * 8 / lag.bucket_seconds / 1e6;
  const link = lag.link_mbit || 0;
  const peak = samples.reduce((m, s) => Math.max(m, mbit(s)), 0);
  const top = Math.max(peak, link, 0.001);
  const ys = (v) => H - B - (H - B - T) * v / top;
  for (const f of [0.5, 1]) g.append(svg('line', {x1: L, x2: W - R, y1: ys(top * f), y2: ys(top * f), class: 'grid'}));
  g.append(svg('line', {x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis'}));
  g.append(svg('text', {x: L, y: H - 3, class: 'spark-max', text: '−60 min'}));
  g.append(svg('text', {x: W - R, y: H - 3, class: 'spark-max', 'text-anchor': 'end', text: 'now'}));
  const share = (v) => link > 0 ? ' · ' + (100 * v / link).toFixed(1) + '% of ' + link + ' Mbit/s' : '';
  if (samples.length === 0) {
    g.append(svg('text', {x: W / 2, y: H / 2, class: 'spark-empty', 'text-anchor': 'middle', text: 'nothing received in the last hour'}));
    return g;
  }
  g.append(svg('text', {x: W - R, y: 11, class: 'spark-max link-peak', 'text-anchor': 'end',
                        text: 'peak ' + peak.toFixed(2) + ' Mbit/s' + share(peak)}));
  const step = lag.bucket_seconds * 1e6;
  const bw = Math.max((W - L - R) * step / (end - start) - 0.6, 1.2);
  for (const s of samples) {
    const y = Math.min(ys(mbit(s)), H - B - 1.5);
    const bar = svg('rect', {x: xs(s.time_us), y, width: bw, height: H - B - y, class: 'spark-bar'});
    hover(bar, [mbit(s).toFixed(2) + ' Mbit/s on the wire' + share(mbit(s)), clock(s.time_us) + ' · ' + bytes(s.wire_bytes) + ' received']);
    g.append(bar);
  }
  return g;
}

// --- recovery points on a timeline ---
// Time runs left to right from the oldest point to now. Tags sit above the
// axis, crash-consistent points on it; a marker too close to the previous one
// of its kind moves to the next lane (out from the axis), so that every point
// stays visible and clickable.
function timeline(key, pts, nowUs, failover, onPick) {
  const W = 640, H = 124, L = 12, R = 12, Y = 78, GAP = 15, LANE = 15, LANES = 3;
  const g = svg('svg', {class: 'timeline', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'recovery points'});
  const points = pts.points || [];
  if (points.length === 0) {
    g.append(svg('text', {x: W / 2, y: Y, class: 'spark-empty', 'text-anchor': 'middle', text: 'no recovery point yet'}));
    return g;
  }
  const t0 = Math.min(...points.map((p) => p.time_us));
  const t1 = Math.max(nowUs, ...points.map((p) => p.time_us));
  const span = Math.max(t1 - t0, 1e6);
  const x = (t) => L + (W - L - R) * (t - t0) / span;
  g.append(svg('line', {x1: L, x2: W - R, y1: Y, y2: Y, class: 'tl-axis'}));
  for (let i = 1; i < 4; ++i) {
    const tx = L + (W - L - R) * i / 4;
    g.append(svg('line', {x1: tx, x2: tx, y1: Y - 3, y2: Y + 3, class: 'tl-tick'}));
    g.append(svg('text', {x: tx, y: H - 4, class: 'tl-label', 'text-anchor': 'middle', text: clock(t0 + span * i / 4)}));
  }
  g.append(svg('text', {x: L, y: H - 4, class: 'tl-label', text: clock(t0)}));
  g.append(svg('text', {x: W - R, y: H - 4, class: 'tl-label', 'text-anchor': 'end', text: 'now'}));
  const sel = chosen.get(key);
  const lastX = {tag: [], crash: []};  // per kind, per lane: x of the last marker
  let lastLabel = -1e9;
  const layers = {crash: [], tag: [], labels: []};
  for (const p of points) {
    const cx = x(p.time_us);
    const isTag = p.kind === 'tag';
    const kind = isTag ? 'tag' : 'crash';
    let lane = 0;
    while (lane < LANES - 1 && lastX[kind][lane] !== undefined && cx - lastX[kind][lane] < GAP) ++lane;
    lastX[kind][lane] = cx;
    const cy = isTag ? Y - 16 - lane * LANE : Y + lane * LANE;
    const isFail = failover && failover.point === p.id;
    const cls = 'point ' + kind + (sel === p.id ? ' selected' : '') + (isFail ? ' failover' : '');
    const shape = isTag
      ? svg('path', {d: `M${cx},${cy - 7}L${cx + 6},${cy}L${cx},${cy + 7}L${cx - 6},${cy}Z`, class: cls})
      : svg('circle', {cx, cy, r: 5, class: cls});
    shape.setAttribute('data-id', p.id);
    shape.setAttribute('data-seq', p.seq);
    shape.setAttribute('data-kind', p.kind);
    hover(shape, [isTag ? 'tag “' + p.name + '”' : 'crash-consistent point',
                  'point ' + p.id + ' · seq ' + p.seq, stamp(p.time_us), 'click to choose it for an export']);
    shape.addEventListener('click', () => onPick(p.id));
    if (isTag) {
      if (cx - lastLabel > 70 && lane === 0) {
        layers.labels.push(svg('line', {x1: cx, x2: cx, y1: 16, y2: cy - 7, class: 'tl-stem'}));
        const anchor = cx < 60 ? 'start' : cx > W - 60 ? 'end' : 'middle';
        layers.labels.push(svg('text', {x: anchor === 'start' ? cx - 6 : anchor === 'end' ? cx + 6 : cx, y: 12, class: 'tl-tag',
                                        'text-anchor': anchor, text: p.name}));
        lastLabel = cx;
      }
    }
    layers[kind].push(shape);
  }
  g.append(...layers.labels, ...layers.crash, ...layers.tag);
  return g;
}

// --- journal against the retention budget ---
function journalBar(v) {
  const budget = v.retention_max_bytes || 0;
  const used = v.journal_bytes || 0;
  if (!budget) {
    return el('div', {class: 'meter'},
      el('div', {class: 'meter-track'}, el('div', {class: 'meter-fill none'})),
      el('div', {class: 'meter-text', text: bytes(used) + ' · no size limit' +
        (v.retention_max_age_seconds ? ' · kept ' + secs(v.retention_max_age_seconds) : '')}));
  }
  const frac = Math.min(used / budget, 1);
  const fill = el('div', {class: 'meter-fill ' + (frac > 0.9 ? 'bad' : frac > 0.7 ? 'warn' : 'ok')});
  fill.style.width = (frac * 100).toFixed(1) + '%';
  return el('div', {class: 'meter'}, el('div', {class: 'meter-track'}, fill),
    el('div', {class: 'meter-text', text: bytes(used) + ' of ' + bytes(budget) + ' (' + (100 * used / budget).toFixed(0) + '%)' +
      (v.retention_max_age_seconds ? ' · kept ' + secs(v.retention_max_age_seconds) : '')}));
}

function stat(label, value, extra) {
  return el('div', {class: 'stat'}, el('div', {class: 'stat-label', text: label}), el('div', {class: 'stat-value'}, value), extra || null);
}

function failoverBox(v) {
  const f = v.failover;
  if (!f) return null;
  return el('div', {class: 'failover-box'},
    el('strong', {text: 'Failed over'}),
    ` to point ${f.point} (sequence ${f.history_seq}) at ${stamp(f.time_us)} · `,
    f.committed ? 'committed' : 'not committed (undo possible)',
    ' · export ', el('code', {text: f.export}), f.served ? '' : ' NOT SERVED',
    ' · ' + f.provider_written_blocks + ' block(s) written at the provider');
}

// Possible ransomware (GET /v1/anomalies; cdpctl anomalies): a badge in the
// volume's title while an event holds its suspect-clean point.
function anomalyBadge(v) {
  if (!v.anomalies_open) return null;
  return el('span', {class: 'badge bad anomaly', 'data-anomalies': String(v.anomalies_open),
                     title: v.last_anomaly, text: 'possible ransomware'});
}

function stallBox(v) {
  const s = v.stall;
  if (!s) return null;
  return el('div', {class: 'stall-box'}, el('strong', {text: 'Apply stalled: ' + s.cause}),
    ` since ${stamp(s.since_us)} · ${s.failures} failed attempt(s) · `, el('code', {text: s.message}));
}

function exportControls(v, pts, key) {
  const points = pts.points || [];
  if (!chosen.has(key) && points.length) chosen.set(key, points[points.length - 1].id);
  const select = el('select', {class: 'point-select', 'data-volume': key, 'aria-label': 'recovery point'});
  for (const p of points.slice().reverse()) {
    const o = el('option', {value: p.id, text: `#${p.id} ${p.kind === 'tag' ? '“' + p.name + '”' : 'crash'} · ${clock(p.time_us)}`});
    if (chosen.get(key) === p.id) o.selected = true;
    select.append(o);
  }
  select.addEventListener('change', () => chosen.set(key, Number(select.value)));
  const writable = el('input', {type: 'checkbox', class: 'writable'});
  const btn = el('button', {class: 'btn primary small export-btn', type: 'button', 'data-volume': key, text: 'Export point'});
  btn.disabled = points.length === 0;
  btn.addEventListener('click', async () => {
    btn.disabled = true;
    try {
      const r = await api('POST', '/v1/export', {tenant: v.tenant, volume: v.volume, point: Number(select.value), writable: writable.checked});
      flash('Export ' + r.export + ' is served on NBD port ' + r.port + (r.tls ? ' (TLS)' : ''), 'ok');
      await refresh();
    } catch (e) {
      handle(e, 'export');
    } finally {
      btn.disabled = false;
    }
  });
  return el('div', {class: 'export-controls'}, select, el('label', {class: 'check'}, writable, 'writable (copy-on-write)'), btn);
}

function exportsTable(list, port, tls) {
  if (!list.length) return el('div', {class: 'muted small-text', text: 'No open export.'});
  const rows = list.map((x) => {
    const failover = x.export.endsWith('@failover');
    const rm = el('button', {class: 'btn danger small unexport-btn', type: 'button', 'data-export': x.export, text: 'Remove'});
    if (failover) {
      rm.disabled = true;
      rm.title = 'a failover export: cdpctl failover --undo removes it';
    }
    rm.addEventListener('click', async () => {
      rm.disabled = true;
      try {
        await api('POST', '/v1/unexport', {export: x.export});
        flash('Export ' + x.export + ' removed', 'ok');
        await refresh();
      } catch (e) {
        handle(e, 'unexport');
        rm.disabled = false;
      }
    });
    return el('tr', {'data-export': x.export},
      el('td', {}, el('code', {text: x.export}),
        el('div', {class: 'uri', text: (tls ? 'nbds://' : 'nbd://') + location.hostname + ':' + port + '/' + x.export})),
      el('td', {text: 'seq ' + x.seq}),
      el('td', {}, el('span', {class: 'badge ' + (x.writable ? 'warn' : 'neutral'), text: x.writable ? 'read-write' : 'read-only'})),
      el('td', {text: x.writable ? x.overlay_blocks + ' block(s) written' : ''}),
      el('td', {class: 'right'}, rm));
  });
  return el('table', {class: 'exports'},
    el('thead', {}, el('tr', {}, el('th', {text: 'Export (NBD port ' + port + ')'}), el('th', {text: 'Point'}), el('th', {text: 'Mode'}), el('th', {text: ''}), el('th', {text: ''}))),
    el('tbody', {}, rows));
}

// A tenant's consistency groups (docs/groups.md) as this master target holds
// them (/v1/groups): the recoverable group points (every member volume
// holds the marker), the last one's cut, and partial ones (a member lacks it);
// for a group coordinated here (members behind several process servers,
// `coordinated`), its rounds made and abandoned, and the last abandon's reason.
function groupsCard(groups, coordinated) {
  const names = [...new Set([...groups.map((g) => g.name), ...coordinated.map((g) => g.name)])].sort();
  const rows = names.map((name) => {
    const g = groups.find((x) => x.name === name) || {name, points: [], partial: []};
    const co = coordinated.find((x) => x.name === name);
    const rounds = co ? `${co.points_made} made, ${co.rounds_abandoned} abandoned` : 'at a process server';
    const abandoned = co && co.last_abandoned ? co.last_abandoned.why : '';
    const pts = g.points || [];
    const last = pts.length ? pts[pts.length - 1] : null;
    const partial = (g.partial || []).length;
    const cut = last ? Object.entries(last.seqs).map(([v, s]) => `${v}@seq:${s}`).join('  ') : '';
    return el('tr', {class: 'group', 'data-group': g.name, 'data-points': String(pts.length),
                     'data-partial': String(partial), 'data-last': last ? last.marker : '',
                     'data-coordinated': co ? 'mt' : 'ps'},
      el('td', {text: g.name}),
      el('td', {text: String(pts.length)}),
      el('td', {text: last ? stamp(last.time_us) : '-'}),
      el('td', {class: 'mono', text: cut || '-'}),
      el('td', {}, partial ? el('span', {class: 'badge warn', text: `${partial} partial`}) : el('span', {class: 'muted', text: 'none'})),
      el('td', {}, el('span', {class: 'muted', text: rounds}),
        ...(abandoned ? [el('span', {class: 'badge warn', title: abandoned, text: 'last round abandoned'})] : [])));
  });
  return el('div', {class: 'card groups'},
    el('h3', {text: 'Consistency groups'}),
    el('table', {class: 'exports'},
      el('thead', {}, el('tr', {}, ...['group', 'recoverable points', 'last point', 'its cut', 'partial', 'rounds here'].map((h) => el('th', {text: h})))),
      el('tbody', {}, ...rows)));
}

function volumeCard(v, pts, lag, exports, port, tls, nowUs) {
  const key = v.tenant + '/' + v.volume;
  const last = (lag.samples || []).filter((s) => s.batches > 0).slice(-1)[0];
  const lastLag = last ? secs(last.max_lag_seconds) : '–';
  let tl;
  const pick = (id) => {
    chosen.set(key, id);
    const s = card.querySelector('select.point-select');
    if (s) s.value = String(id);
    for (const m of tl.querySelectorAll('.point')) m.classList.toggle('selected', Number(m.getAttribute('data-id')) === id);
  };
  tl = timeline(key, pts, nowUs, v.failover, pick);
  const card = el('article', {class: 'volume', 'data-volume': key, 'data-tenant': v.tenant},
    el('header', {class: 'volume-head'},
      el('div', {class: 'volume-title'}, el('h3', {text: v.volume}), stateBadge(v.state), anomalyBadge(v)),
      el('div', {class: 'volume-meta'}, `${bytes(v.size)} · block ${bytes(v.block_size)} · generation ${v.generation} · `,
        el('span', {class: 'failover-state', 'data-failover': v.failover ? (v.failover.committed ? 'committed' : 'promoted') : 'none',
                    text: v.failover ? (v.failover.committed ? 'failover committed' : 'failed over (undo possible)') : 'no failover'}))),
    stallBox(v), failoverBox(v),
    el('div', {class: 'stats'},
      stat('Applied sequence', String(v.applied_seq), el('div', {class: 'stat-sub', text: 'history ' + v.history_seq})),
      stat('RPO lag (last batch)', lastLag, el('div', {class: 'stat-sub', text: 'at apply, capture to replica'})),
      stat('Recovery points', String((pts.points || []).length), el('div', {class: 'stat-sub', text: 'horizon seq ' + v.horizon_seq})),
      stat('Undo journal', journalBar(v))),
    el('div', {class: 'charts'},
      el('div', {class: 'chart'}, el('div', {class: 'chart-title', text: 'RPO lag · last hour'}), sparkline(lag)),
      el('div', {class: 'chart'}, el('div', {class: 'chart-title', text: 'Link use · last hour'}), linkChart(lag)),
      el('div', {class: 'chart wide'}, el('div', {class: 'chart-title', text: 'Recovery points'}), tl,
        el('div', {class: 'legend'}, el('span', {class: 'lg crash'}), 'crash-consistent', el('span', {class: 'lg tag'}), 'tag',
          el('span', {class: 'lg sel'}), 'chosen for export'))),
    el('div', {class: 'exports-block'}, el('div', {class: 'chart-title', text: 'Point-in-time exports'}),
      exportControls(v, pts, key), exportsTable(exports, port, tls)));
  return card;
}

// --- banner ---
let flashTimer = null;
function flash(msg, kind) {
  const b = document.getElementById('banner');
  b.className = 'banner ' + (kind || 'ok');
  b.textContent = msg;
  clearTimeout(flashTimer);
  if (kind !== 'bad') flashTimer = setTimeout(() => b.classList.add('hidden'), 6000);
}
function handle(e, what) {
  if (e instanceof Unauthorized) return unauthorized();
  flash((what ? what + ': ' : '') + e.message, 'bad');
}
function unauthorized() {
  clearInterval(timer);
  document.body.dataset.state = 'unauthorized';
  sessionStorage.removeItem('cdp_token');
  document.getElementById('tenants').replaceChildren(
    el('div', {class: 'card unauth'}, el('h2', {text: 'Unauthorized'}),
      el('p', {text: 'The control token was refused by the master target (missing, revoked or for another site).'}),
      el('a', {class: 'btn primary', href: '/ui/login', text: 'Sign in'})));
  document.getElementById('summary').replaceChildren();
  document.getElementById('who').replaceChildren();
}

// --- the whole page ---
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const [who, vols, exps, grps] = await Promise.all([api('GET', '/v1/whoami'), api('GET', '/v1/volumes'),
      api('GET', '/v1/exports'), api('GET', '/v1/groups')]);
    const volumes = vols.volumes || [];
    const details = await Promise.all(volumes.map(async (v) => {
      const q = 'tenant=' + encodeURIComponent(v.tenant) + '&volume=' + encodeURIComponent(v.volume);
      const [pts, lag] = await Promise.all([api('GET', '/v1/points?' + q), api('GET', '/v1/lag?' + q)]);
      return {v, pts, lag};
    }));
    const nowUs = details.length ? details[0].lag.now_us : Date.now() * 1000;
    document.getElementById('who').replaceChildren(
      el('span', {class: 'badge ' + (who.admin ? 'admin' : 'neutral'), text: who.admin ? 'admin' : 'tenant ' + who.tenant}));
    const tenants = new Map();
    for (const t of who.tenants || []) tenants.set(t, []);
    for (const d of details) {
      if (!tenants.has(d.v.tenant)) tenants.set(d.v.tenant, []);
      tenants.get(d.v.tenant).push(d);
    }
    const all = details.map((d) => d.v.state);
    const stalled = all.filter((s) => s.startsWith('stalled')).length;
    const failed = all.filter((s) => s === 'failed-over' || s === 'rolling-back').length;
    document.getElementById('summary').replaceChildren(
      el('div', {class: 'tile'}, el('div', {class: 'tile-n', text: String(tenants.size)}), el('div', {class: 'tile-l', text: 'tenants'})),
      el('div', {class: 'tile'}, el('div', {class: 'tile-n', text: String(details.length)}), el('div', {class: 'tile-l', text: 'volumes'})),
      el('div', {class: 'tile ok'}, el('div', {class: 'tile-n', text: String(all.filter((s) => s === 'protecting').length)}), el('div', {class: 'tile-l', text: 'protecting'})),
      el('div', {class: 'tile ' + (stalled ? 'bad' : '')}, el('div', {class: 'tile-n', text: String(stalled)}), el('div', {class: 'tile-l', text: 'stalled'})),
      el('div', {class: 'tile ' + (failed ? 'warn' : '')}, el('div', {class: 'tile-n', text: String(failed)}), el('div', {class: 'tile-l', text: 'failed over'})),
      el('div', {class: 'tile'}, el('div', {class: 'tile-n', text: String((exps.exports || []).length)}), el('div', {class: 'tile-l', text: 'open exports'})));
    const sections = [];
    for (const [t, ds] of [...tenants.entries()].sort((a, b) => a[0].localeCompare(b[0]))) {
      const cards = ds.sort((a, b) => a.v.volume.localeCompare(b.v.volume)).map((d) =>
        volumeCard(d.v, d.pts, d.lag, (exps.exports || []).filter((x) => x.tenant === d.v.tenant && x.volume === d.v.volume), exps.port, who.nbd_tls, nowUs));
      const jbytes = ds.reduce((a, d) => a + (d.v.journal_bytes || 0), 0);
      const groups = (grps.groups || []).filter((g) => g.tenant === t);
      const coordinated = (grps.coordinated || []).filter((g) => g.tenant === t);
      sections.push(el('section', {class: 'tenant', 'data-tenant': t},
        el('div', {class: 'tenant-head'}, el('h2', {}, el('span', {class: 'muted', text: 'tenant '}), t),
          el('div', {class: 'tenant-meta', text: `${ds.length} volume(s) · journals ${bytes(jbytes)}`})),
        ...(groups.length || coordinated.length ? [groupsCard(groups, coordinated)] : []),
        cards.length ? cards : el('div', {class: 'card muted', text: 'No volume yet.'})));
    }
    hideTip();  // its target is being replaced
    document.getElementById('tenants').replaceChildren(...sections);
    document.getElementById('updated').textContent = 'updated ' + clock(Date.now() * 1000);
    document.body.dataset.state = 'ready';
  } catch (e) {
    handle(e, 'refresh');
  } finally {
    busy = false;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  if (!token) {
    unauthorized();
    return;
  }
  document.getElementById('refresh').addEventListener('click', refresh);
  document.getElementById('signout').addEventListener('click', async () => {
    sessionStorage.removeItem('cdp_token');
    try { await fetch('/ui/logout', {method: 'POST', cache: 'no-store'}); } catch (e) { /* signed out in this tab anyway */ }
    location.replace('/ui/login');
  });
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
});
