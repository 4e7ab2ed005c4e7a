// The fleet overview: one GET /v1/nodes, one table row per node (no per-node requests).
import {
  api,
  badge,
  curvesUrl,
  dash,
  done,
  h,
  labelChips,
  message,
  regressionsUrl,
  replace,
  showError,
  timeElement,
} from "./common.js";

const HEALTH_ORDER = [
  "regressed",
  "failing",
  "off accelerator",
  "missed schedule",
  "stale",
  "no runs",
  "ok",
];

const table = document.getElementById("nodes");
const tbody = table.querySelector("tbody");
const statusBox = document.getElementById("status");
const filterInput = document.getElementById("filter");
const summary = document.getElementById("summary");
const shown = document.getElementById("shown");

let rows = []; // [{node, row, text}]
let healthFilter = null;
let sortKey = "health";
let sortDirection = 1;

function healthOf(node) {
  if (node.health) return node.health;
  return node.runs === 0 ? "no runs" : null;
}

function healthRank(node) {
  const rank = HEALTH_ORDER.indexOf(healthOf(node));
  return rank === -1 ? HEALTH_ORDER.length : rank;
}

/** "below its class" with its figure, where the node's MBU at B = 1 is far below its
 * hardware class's median on a model. */
function belowClass(below) {
  if (!below) return null;
  const pct = (x) => `${Math.round(100 * x)}%`;
  const text =
    `below its class: ${pct(below.mbu)} of its memory bandwidth at B = 1 on ` +
    `${below.model}, against ${pct(below.class_median)} for the ` +
    `${below.class_nodes} nodes of ${below.hardware_class}`;
  return [" ", badge("below its class", "past knee"), h("div", { class: "muted" }, text)];
}

function renderRow(node) {
  const health = healthOf(node);
  const regressions = node.open_regressions;
  return h(
    "tr",
    { dataset: { node: node.name } },
    h("td", {}, h("a", { href: curvesUrl(node.name) }, node.name)),
    h("td", {}, health ? badge(health) : dash()),
    h("td", {}, node.hardware ?? dash(), belowClass(node.below_class)),
    h("td", {}, node.engine ?? dash()),
    h(
      "td",
      {},
      timeElement(node.last_run_at),
      node.last_status && node.last_status !== "ok" ? [" ", badge(node.last_status)] : null,
    ),
    h("td", { class: "num" }, String(node.runs)),
    h(
      "td",
      { class: "num" },
      regressions === undefined || regressions === null
        ? dash()
        : regressions > 0
          ? h("a", { href: regressionsUrl({ node: node.name }) }, String(regressions))
          : "0",
    ),
    h("td", {}, planChips(node.plans)),
    h(
      "td",
      {},
      node.next_run_at ? timeElement(node.next_run_at) : dash(),
      node.missed_schedule ? [" ", badge("missed", "failing")] : null,
      node.sweep_requested_at ? [" ", badge("sweep asked", "partial")] : null,
    ),
    h("td", {}, labelChips(node.labels)),
  );
}

/** Each plan the node reported: its name and version, marked when the node skips it. */
function planChips(plans) {
  if (!plans || plans.length === 0) return dash();
  return plans.map((plan) =>
    h(
      "span",
      { class: plan.skipped ? "chip skipped" : "chip", title: plan.skipped ?? "" },
      `${plan.name} v${plan.version}${plan.skipped ? " skipped" : ""}`,
    ),
  );
}

function compare(a, b) {
  const key = sortKey;
  let x;
  let y;
  if (key === "health") {
    x = healthRank(a.node);
    y = healthRank(b.node);
  } else if (key === "runs" || key === "open_regressions") {
    x = a.node[key] ?? -1;
    y = b.node[key] ?? -1;
  } else {
    x = a.node[key] ?? "";
    y = b.node[key] ?? "";
  }
  if (x < y) return -sortDirection;
  if (x > y) return sortDirection;
  return a.node.name < b.node.name ? -1 : a.node.name > b.node.name ? 1 : 0;
}

function sortRows() {
  rows.sort(compare);
  const fragment = document.createDocumentFragment();
  for (const entry of rows) fragment.appendChild(entry.row);
  tbody.appendChild(fragment);
  for (const th of table.querySelectorAll("th.sortable")) {
    if (th.dataset.key === sortKey) {
      th.setAttribute("aria-sort", sortDirection === 1 ? "ascending" : "descending");
    } else th.removeAttribute("aria-sort");
  }
}

function applyFilter() {
  const words = filterInput.value.toLowerCase().split(/\s+/).filter(Boolean);
  let visible = 0;
  for (const entry of rows) {
    const match =
      (healthFilter === null || healthOf(entry.node) === healthFilter) &&
      words.every((word) => entry.text.includes(word));
    entry.row.hidden = !match;
    if (match) visible += 1;
  }
  shown.textContent = `${visible} of ${rows.length} shown`;
  for (const button of summary.querySelectorAll("button")) {
    const value = button.dataset.health || null;
    button.setAttribute("aria-pressed", String(value === healthFilter));
  }
}

function renderSummary(nodes) {
  const counts = new Map();
  for (const node of nodes) {
    const health = healthOf(node);
    if (health) counts.set(health, (counts.get(health) ?? 0) + 1);
  }
  const button = (label, value, count) =>
    h(
      "button",
      {
        type: "button",
        dataset: value ? { health: value } : {},
        "aria-pressed": "false",
        onclick: () => {
          healthFilter = value;
          applyFilter();
        },
      },
      h("span", { class: "count" }, String(count)),
      label,
    );
  const buttons = [button("all nodes", null, nodes.length)];
  for (const health of HEALTH_ORDER) {
    if (counts.has(health)) buttons.push(button(health, health, counts.get(health)));
  }
  replace(summary, buttons);
}

async function main() {
  let answer;
  try {
    answer = await api("/v1/nodes");
  } catch (error) {
    document.getElementById("subtitle").textContent = "";
    showError(statusBox, error);
    done("error");
    return;
  }
  const nodes = answer.data ?? [];
  document.getElementById("subtitle").textContent =
    `${nodes.length} node${nodes.length === 1 ? "" : "s"}`;
  if (nodes.length === 0) {
    message(
      statusBox,
      "empty",
      "No nodes yet. Create a token with `fleetbench-registry token create --node NAME` " +
        "and report a run.",
    );
    done("empty");
    return;
  }
  rows = nodes.map((node) => ({
    node,
    row: renderRow(node),
    text: [
      node.name,
      node.hardware,
      node.engine,
      healthOf(node),
      ...(node.plans ?? []).map((plan) => plan.name),
      ...Object.entries(node.labels ?? {}).map(([k, v]) => `${k}=${v}`),
    ]
      .filter(Boolean)
      .join(" ")
      .toLowerCase(),
  }));
  renderSummary(nodes);
  sortRows();
  table.hidden = false;
  applyFilter();
  for (const th of table.querySelectorAll("th.sortable")) {
    th.addEventListener("click", () => {
      sortDirection = th.dataset.key === sortKey ? -sortDirection : 1;
      sortKey = th.dataset.key;
      sortRows();
    });
  }
  filterInput.addEventListener("input", applyFilter);
  document.body.dataset.renderMs = String(Math.round(performance.now()));
  done();
}

main();
