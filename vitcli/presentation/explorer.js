'use strict';
const meta = JSON.parse(document.getElementById('explorer-header').textContent);
const tokens = meta.grid.tokens, rows = meta.grid.rows, cols = meta.grid.cols, prefix = meta.prefix.length;
const heads = meta.heads, blocks = meta.blocks;

function halfTable() {
  const table = new Float32Array(65536);
  for (let bits = 0; bits < 65536; bits++) {
    const exponent = (bits >> 10) & 31, fraction = bits & 1023;
    const value = exponent === 0 ? fraction * 2 ** -24
      : exponent === 31 ? (fraction ? NaN : Infinity) : (1 + fraction / 1024) * 2 ** (exponent - 15);
    table[bits] = bits >> 15 ? -value : value;
  }
  return table;
}
const HALF = halfTable();
function decode(id) {
  const text = atob(document.getElementById(id).textContent.trim());
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  const halves = new DataView(bytes.buffer), values = new Float32Array(bytes.length / 2);
  for (let i = 0; i < values.length; i++) values[i] = HALF[halves.getUint16(2 * i, true)];
  return values;
}
const attention = decode('explorer-attention'), rollout = decode('explorer-rollout');
const colours = [];
for (let i = 0; i < 256; i++) {
  const hex = meta.colormap.slice(6 * i, 6 * i + 6);
  colours.push([0, 2, 4].map((at) => parseInt(hex.slice(at, at + 2), 16)));
}

const state = { block: 0, head: 'mean', query: 0, rollout: false, fromZero: false, hovered: null };

function tokenName(token) { return token < prefix ? meta.prefix[token] : 'P' + (token - prefix + 1); }
function place(token) {
  if (token < prefix) return { token: token, name: tokenName(token), row: null, col: null };
  const patch = token - prefix;
  return { token: token, name: tokenName(token), row: Math.floor(patch / cols), col: patch % cols };
}
function describe(token) {
  const where = place(token);
  return where.row === null ? where.name + ' (token ' + token + ')'
    : where.name + ' (token ' + token + ', row ' + where.row + ', col ' + where.col + ')';
}
function headRow(block, head, query) {
  const start = ((block * heads + head) * tokens + query) * tokens;
  return Array.from(attention.subarray(start, start + tokens));
}
function meanRow(block, query) {
  const sum = new Array(tokens).fill(0);
  for (let head = 0; head < heads; head++) headRow(block, head, query).forEach((value, at) => { sum[at] += value; });
  return sum.map((value) => value / heads);
}
function rolloutRow(query) { return Array.from(rollout.subarray(query * tokens, (query + 1) * tokens)); }
function mapRow(index) {
  return new Array(prefix).fill(NaN).concat(meta.maps[index].values.map((value) => (value === null ? NaN : value)));
}
function patchRange(rowsShown) {
  // The colour scale over the patch sources of the rows shown (CLS is listed, not drawn): their own smallest to
  // largest value, or from min(0, smallest) with the "colours from 0" box (as `vitcli attend --scale own|zero`).
  let low = Infinity, high = -Infinity;
  rowsShown.forEach((row) => {
    for (let t = prefix; t < tokens; t++) {
      if (Number.isNaN(row[t])) continue;
      low = Math.min(low, row[t]);
      high = Math.max(high, row[t]);
    }
  });
  if (high < low) return [0, 0];  // nothing defined to draw
  return [state.fromZero ? Math.min(0, low) : low, high];
}
function percent(value) { return (100 * value).toFixed(4) + '%'; }
function formatted(value, unit) {
  if (value === null || Number.isNaN(value)) return '-';  // null: NaN read back from a panel's JSON data-row
  return unit === 'attention' ? percent(value) : value.toPrecision(4) + ' ' + unit;
}

function element(tag, className, parent) {
  const made = document.createElement(tag);
  if (className) made.className = className;
  if (parent) parent.appendChild(made);
  return made;
}
function makePanel(parent, size, label) {
  const panel = element('div', 'panel');
  const stage = element('div', 'stage', panel);
  stage.style.width = size + 'px';
  stage.style.height = size * rows / cols + 'px';
  const photo = element('img', '', stage);
  photo.alt = 'the crop the model saw';
  photo.src = document.getElementById('explorer-crop').getAttribute('src');
  const heat = element('canvas', 'heat', stage);
  heat.width = cols; heat.height = rows;
  const marks = element('canvas', 'marks', stage);
  marks.width = size; marks.height = size * rows / cols;
  const caption = element('div', 'caption', panel);
  element('div', 'title', caption);
  element('div', 'chips', caption);
  panel.dataset.label = label;
  stage.addEventListener('mousemove', (event) => hover(panel, tokenAt(stage, event)));
  stage.addEventListener('mouseleave', () => hover(null, null));
  stage.addEventListener('click', (event) => { state.query = tokenAt(stage, event); render(); });
  parent.appendChild(panel);
  return panel;
}
function tokenAt(stage, event) {
  const box = stage.getBoundingClientRect();
  const col = Math.min(cols - 1, Math.max(0, Math.floor((event.clientX - box.left) / box.width * cols)));
  const row = Math.min(rows - 1, Math.max(0, Math.floor((event.clientY - box.top) / box.height * rows)));
  return prefix + row * cols + col;
}

function draw(panel, row, top, caption, low = 0, unit = 'attention') {
  panel.dataset.row = JSON.stringify(row);
  panel.dataset.scaleMax = String(top);
  panel.dataset.scaleMin = String(low);
  panel.dataset.unit = unit;
  panel.dataset.query = String(state.query);
  const heat = panel.querySelector('canvas.heat').getContext('2d');
  const image = heat.createImageData(cols, rows);
  for (let t = prefix; t < tokens; t++) {
    const index = top > low ? Math.max(0, Math.min(255, Math.round((row[t] - low) / (top - low) * 255))) : 0;
    const [red, green, blue] = Number.isNaN(row[t]) ? [128, 128, 128] : colours[index];
    const at = 4 * (t - prefix);
    image.data[at] = red; image.data[at + 1] = green; image.data[at + 2] = blue; image.data[at + 3] = 255;
  }
  heat.putImageData(image, 0, 0);
  const marksCanvas = panel.querySelector('canvas.marks'), marks = marksCanvas.getContext('2d');
  const cell = marksCanvas.width / cols;
  marks.clearRect(0, 0, marksCanvas.width, marksCanvas.height);
  marks.strokeStyle = 'rgba(255,255,255,0.25)';
  marks.lineWidth = 1;
  marks.beginPath();
  for (let c = 1; c < cols; c++) { marks.moveTo(c * cell + 0.5, 0); marks.lineTo(c * cell + 0.5, rows * cell); }
  for (let r = 1; r < rows; r++) { marks.moveTo(0, r * cell + 0.5); marks.lineTo(cols * cell, r * cell + 0.5); }
  marks.stroke();
  const query = place(state.query);
  if (query.row !== null) {
    marks.strokeStyle = 'cyan'; marks.lineWidth = 2;
    marks.strokeRect(query.col * cell + 1, query.row * cell + 1, cell - 2, cell - 2);
  }
  // The caption and the chips are text nodes only: a label or a file name is never parsed as markup.
  panel.querySelector('.caption .title').textContent = caption;
  panel.querySelector('.caption .chips').replaceChildren(...meta.prefix.map((name, token) => {
    const chip = element('span', 'cls');
    chip.dataset.token = String(token);
    chip.textContent = name + ' ' + formatted(row[token], unit);
    chip.addEventListener('mouseenter', () => hover(panel, token));
    chip.addEventListener('mouseleave', () => hover(null, null));
    chip.addEventListener('click', () => { state.query = token; render(); });
    return chip;
  }));
}

function drawScale(id, top, low, unit, whose) {
  const canvas = document.querySelector('#' + id + ' canvas'), context = canvas.getContext('2d');
  canvas.width = 256; canvas.height = 1;
  colours.forEach(([red, green, blue], at) => {
    context.fillStyle = 'rgb(' + red + ',' + green + ',' + blue + ')';
    context.fillRect(at, 0, 1, 1);
  });
  document.querySelector('#' + id + ' .top').textContent = formatted(top, unit);
  document.querySelector('#' + id + ' .bottom').textContent = low === 0 ? '0' : formatted(low, unit);
  document.querySelector('#' + id + ' .range').textContent = low >= 0 && state.fromZero
    ? 'colours from 0 to ' + whose + ' largest patch value, ' + formatted(top, unit)
    : 'colours span ' + whose + (state.fromZero ? ' range from min(0, smallest), ' : ' own range, ') +
      formatted(low, unit) + ' to ' + formatted(top, unit);
  document.getElementById(id).dataset.max = String(top);
  document.getElementById(id).dataset.min = String(low);
}

function hover(panel, token) {
  const readout = document.getElementById('readout');
  state.hovered = panel === null || token === null ? null : [panel, token];
  if (state.hovered === null) return;
  const row = JSON.parse(panel.dataset.row), where = place(token);
  readout.dataset.token = String(token);
  readout.dataset.row = where.row === null ? '' : String(where.row);
  readout.dataset.col = where.col === null ? '' : String(where.col);
  readout.dataset.weight = String(row[token]);
  readout.dataset.panel = panel.dataset.label;
  readout.textContent = 'source ' + where.name + ': token ' + token + ', row ' + (where.row ?? '-') + ', col ' +
    (where.col ?? '-') + ', ' + (panel.dataset.unit === 'attention' ? 'weight ' : 'value ') +
    formatted(row[token], panel.dataset.unit) + ' (' + row[token] + ') in ' + panel.dataset.label +
    ', query ' + describe(state.query);
}

const headsBox = document.getElementById('heads');
const mainPanel = makePanel(document.getElementById('main'), 384, 'main');
const headPanels = [];
for (let head = 0; head < heads; head++) headPanels.push(makePanel(headsBox, 200, 'head ' + (head + 1)));
headPanels.forEach((panel, head) => { panel.dataset.head = String(head + 1); });

function render() {
  const block = state.block, blockNumber = blocks[block];
  const rowsOfHeads = headPanels.map((_, head) => headRow(block, head, state.query));
  const [commonLow, common] = patchRange(rowsOfHeads);
  rowsOfHeads.forEach((row, head) => {
    headPanels[head].dataset.block = String(blockNumber);
    headPanels[head].dataset.label = 'block ' + blockNumber + ', head ' + (head + 1);
    draw(headPanels[head], row, common, 'block ' + blockNumber + ', head ' + (head + 1), commonLow);
  });
  drawScale('heads-scale', common, commonLow, 'attention', "the heads'");
  let row, label, unit = 'attention';
  const isMap = typeof state.head === 'string' && state.head.startsWith('map:');
  const chosenMap = isMap ? Number(state.head.slice(4)) : null;
  if (state.rollout) {
    row = rolloutRow(state.query);
    label = 'rollout through all ' + meta.depth + ' blocks';
  } else if (chosenMap !== null) {
    const chosen = meta.maps[chosenMap];
    row = mapRow(chosenMap);
    label = 'explain ' + chosen.method + ' for class ' + chosen.target;
    unit = chosen.unit;
  } else if (state.head === 'mean') {
    row = meanRow(block, state.query);
    label = 'block ' + blockNumber + ', mean over ' + heads + ' heads';
  } else {
    row = headRow(block, state.head, state.query);
    label = 'block ' + blockNumber + ', head ' + (state.head + 1);
  }
  mainPanel.dataset.block = state.rollout ? '' : String(blockNumber);
  mainPanel.dataset.head = state.rollout ? 'rollout'
    : chosenMap !== null ? 'map:' + meta.maps[chosenMap].method
      : state.head === 'mean' ? 'mean' : String(state.head + 1);
  mainPanel.dataset.label = label;
  const [low, top] = patchRange([row]);
  draw(mainPanel, row, top, label, low, unit);
  drawScale('main-scale', top, low, unit, "this map's");
  document.getElementById('block-number').textContent = String(blockNumber);
  document.getElementById('query').textContent = 'query ' + describe(state.query);
  document.body.dataset.query = String(state.query);
  document.body.dataset.scale = state.fromZero ? 'zero' : 'own';
  const ranked = row.map((value, token) => [value, token]).filter(([value]) => !Number.isNaN(value))
    .sort((a, b) => b[0] - a[0]).slice(0, 5);
  document.getElementById('top').textContent = 'top sources in ' + label + ': ' +
    ranked.map(([value, token]) => tokenName(token) + ' ' + formatted(value, unit)).join(', ');
  if (state.hovered !== null) hover(...state.hovered);
}

const slider = document.getElementById('block');
slider.max = String(blocks.length - 1);
slider.addEventListener('input', () => { state.block = Number(slider.value); render(); });
const headChoice = document.getElementById('head');
for (let head = 0; head < heads; head++) headChoice.add(new Option('head ' + (head + 1), String(head)));
meta.maps.forEach((map, index) => headChoice.add(new Option('explain: ' + map.method, 'map:' + index)));
headChoice.addEventListener('change', () => {
  const value = headChoice.value;
  state.head = value === 'mean' || value.startsWith('map:') ? value : Number(value);
  render();
});
const fromZeroBox = document.getElementById('from-zero');
fromZeroBox.addEventListener('change', () => { state.fromZero = fromZeroBox.checked; render(); });
const rolloutBox = document.getElementById('rollout');
rolloutBox.addEventListener('change', () => { state.rollout = rolloutBox.checked; render(); });
document.getElementById('cls').addEventListener('click', () => { state.query = 0; render(); });
document.addEventListener('keydown', (event) => {
  if (['INPUT', 'SELECT', 'TEXTAREA'].includes(event.target.tagName)) return;
  const moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
  if (!(event.key in moves)) return;
  event.preventDefault();
  if (state.query < prefix) { state.query = prefix; render(); return; }
  const where = place(state.query), [down, right] = moves[event.key];
  const row = Math.min(rows - 1, Math.max(0, where.row + down));
  const col = Math.min(cols - 1, Math.max(0, where.col + right));
  state.query = prefix + row * cols + col;
  render();
});

document.getElementById('about').textContent = meta.image + ' · ' + meta.model + ' · ' + meta.weights + ' · blocks ' +
  blocks.join(', ') + ' of ' + meta.depth + ' · ' + heads + ' heads · ' + tokens + ' tokens';
document.getElementById('precision').textContent = 'Stored as ' + meta.precision + '; largest |stored - exact| ' +
  'measured: attention ' + meta.stored_error.attention.toExponential(2) + ', rollout ' +
  meta.stored_error.rollout.toExponential(2) + '. Self-check (explicit vs fused attention output) max |difference| ' +
  meta.self_check_max.toExponential(2) + '. Rows are never renormalized; the colours cover patch sources only ' +
  '(CLS is listed under each panel), over the range written beside each colour bar.';
if (meta.random) document.getElementById('random').textContent =
  'RANDOM WEIGHTS: an untrained model, the attention means nothing.';
render();
document.body.dataset.ready = '1';
