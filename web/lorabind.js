/*
 * lorabind frontend extension (plain ES module, no build step), loaded by ComfyUI from /extensions/lorabind/.
 *
 * What it shows
 *   - On FuseDistillLoRA, WanMoELoRAPair, MiniMaxTurboSchedule and LoadPEFTAdapter: a badge with the sampling
 *     contract each artifact declares (steps / shift / cfg / tasks) and, after a run, the key accounting
 *     (tensors applied / expected-unmatched / unmatched).
 *   - On LoraBindSampler: the schedule that actually ran, and a warning while its `steps` / `shift` widgets
 *     disagree with a contract connected upstream (the sampler refuses such a run unless enforce_contract is off).
 *
 * Where the data comes from: the `executed` WebSocket message, whose `output` is the node's ui dict; ComfyUI
 * hands it to `node.onExecuted(output)`. Every value in a ui dict is a list. The keys this file reads:
 *
 *   output.lorabind_contract   : [Contract]            (adapter / fuse / schedule nodes)
 *       Contract = { source: str, kind: str, steps: int|null, shift: number|null, cfg: number|null,
 *                    tasks: [str]|null, declared_by: "file name"|"metadata"|"checkpoint"|"", note: str }
 *                    (loaders.contracts.contract_to_dict; MiniMax-H3's contract_dict names the shift
 *                    `flow_shift`, read as an alias; other keys are ignored)
 *   output.lorabind_accounting : [Accounting]
 *       Accounting = { lora: str, component: str,
 *                      counts: { applied: int, expected_unmatched: int, unmatched: int } }
 *   output.lorabind_schedule   : [Schedule]            (LoraBindSampler)
 *       Schedule = { steps: int, shift: number, cfg: number|[number], task: str|null,
 *                    contracts: [Contract], overrides: [str] }
 *
 * Contracts are known only after the declaring node ran once (they come from the file's metadata, which the
 * browser cannot read); until then the badge says so.
 */
import { app } from "../../scripts/app.js";

const CONTRACT_NODES = ["FuseDistillLoRA", "WanMoELoRAPair", "MiniMaxTurboSchedule", "LoadPEFTAdapter"];
const SAMPLER_NODE = "LoraBindSampler";
const BADGE_WIDGET = "lorabind_badge";

const STYLE_URL = new URL("./lorabind.css", import.meta.url);

function loadStyle() {
    if (document.querySelector(`link[href="${STYLE_URL.href}"]`)) return;
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = STYLE_URL.href;
    document.head.appendChild(link);
}

function fmt(value) {
    return typeof value === "number" ? String(Number(value.toFixed(4))) : String(value);
}

function contractShift(contract) {
    return contract.shift ?? contract.flow_shift ?? null;
}

/** "4 steps · shift 5 · cfg 1 · tasks t2v,i2v" — only the fields a contract constrains. */
export function describeContract(contract) {
    const parts = [];
    const shift = contractShift(contract);
    if (contract.steps != null) parts.push(`${contract.steps} steps`);
    if (shift != null) parts.push(`shift ${fmt(shift)}`);
    if (contract.cfg != null) parts.push(`cfg ${fmt(contract.cfg)}`);
    if (contract.tasks && contract.tasks.length) parts.push(`tasks ${contract.tasks.join(",")}`);
    const what = parts.length ? parts.join(" · ") : "no constraint";
    const origin = contract.declared_by ? ` — from its ${contract.declared_by}` : "";
    const note = contract.note ? ` (${contract.note})` : "";
    return `${contract.source} (${contract.kind}): ${what}${origin}${note}`;
}

export function describeAccounting(entry) {
    const counts = entry.counts || {};
    return `${entry.lora} → ${entry.component}: ${counts.applied ?? 0} applied, ` +
        `${counts.expected_unmatched ?? 0} expected-unmatched, ${counts.unmatched ?? 0} unmatched`;
}

/** Mismatches between the sampler's widgets and one contract, as user-facing lines. */
export function contractMismatches(steps, shift, contract) {
    const problems = [];
    if (contract.steps != null && steps != null && Number(steps) !== Number(contract.steps)) {
        problems.push(`steps ${steps} ≠ ${contract.steps} required by ${contract.source}`);
    }
    const required = contractShift(contract);
    if (required != null && shift != null && Math.abs(Number(shift) - Number(required)) > 1e-6) {
        problems.push(`shift ${fmt(Number(shift))} ≠ ${fmt(required)} required by ${contract.source}`);
    }
    return problems;
}

function widgetValue(node, name) {
    const widget = (node.widgets || []).find((w) => w.name === name);
    return widget ? widget.value : null;
}

/** Contracts reported by nodes upstream of `node` (any depth), from their last execution. */
function upstreamContracts(node, graph, seen = new Set()) {
    const found = [];
    for (const input of node.inputs || []) {
        if (input.link == null) continue;
        const link = graph.links[input.link];
        const source = link && graph.getNodeById(link.origin_id);
        if (!source || seen.has(source.id)) continue;
        seen.add(source.id);
        found.push(...(source.lorabind?.contracts || []));
        found.push(...upstreamContracts(source, graph, seen));
    }
    return found;
}

/** The badge element, added once per node as a DOM widget (or kept on the node for canvas drawing). */
function badgeOf(node) {
    if (node.lorabindBadge) return node.lorabindBadge;
    const element = document.createElement("div");
    element.className = "lorabind-badge";
    node.lorabindBadge = element;
    if (typeof node.addDOMWidget === "function") {
        const widget = node.addDOMWidget(BADGE_WIDGET, "lorabind", element, { serialize: false, hideOnZoom: false });
        // Display only: keep it out of widgets_values, whose positions map to the node's inputs on load.
        if (widget) widget.serialize = false;
    }
    return element;
}

function renderLines(node, lines, warnings) {
    const rows = [...lines.map((text) => ["lorabind-line", text]),
        ...warnings.map((text) => ["lorabind-warning", `⚠ ${text}`])];
    badgeOf(node).replaceChildren(...rows.map(([className, text]) => {
        const line = document.createElement("div");
        line.className = className;
        line.textContent = text;
        return line;
    }));
    node.lorabindLines = rows.map(([, text]) => text);
    node.lorabindWarning = warnings.length > 0;
    node.setDirtyCanvas?.(true, true);
}

function renderContractNode(node) {
    const state = node.lorabind;
    if (!state) {
        renderLines(node, ["contract: known after the first run"], []);
        return;
    }
    const lines = state.contracts.length ? state.contracts.map(describeContract) : ["no sampling contract"];
    renderLines(node, [...lines, ...state.accounting.map(describeAccounting)], []);
}

function renderSampler(node, graph) {
    const steps = widgetValue(node, "steps");
    const shift = widgetValue(node, "shift");
    const contracts = graph ? upstreamContracts(node, graph) : [];
    const warnings = contracts.flatMap((c) => contractMismatches(steps, shift, c));
    const lines = contracts.map((c) => `contract ${describeContract(c)}`);
    const ran = node.lorabind?.schedule;
    if (ran) {
        lines.push(`ran: ${ran.steps} steps · shift ${fmt(ran.shift)} · cfg ${[].concat(ran.cfg).map(fmt).join("/")}`);
        lines.push(...(ran.overrides || []).map((o) => `override: ${o}`));
    }
    if (!lines.length) lines.push("no contract connected");
    renderLines(node, lines, warnings);
}

function refreshSamplers(graph) {
    for (const node of graph?._nodes || []) {
        if (node.comfyClass === SAMPLER_NODE || node.type === SAMPLER_NODE) renderSampler(node, graph);
    }
}

/** Draw the badge lines under the title when the frontend has no DOM widgets (older litegraph canvases). */
function drawOnCanvas(node, ctx) {
    if (typeof node.addDOMWidget === "function" || !node.lorabindLines?.length) return;
    ctx.save();
    ctx.font = "11px sans-serif";
    node.lorabindLines.forEach((text, i) => {
        ctx.fillStyle = text.startsWith("⚠") ? "#ff6b6b" : "#9ad0ff";
        ctx.fillText(text, 6, node.size[1] + 14 + 13 * i);
    });
    ctx.restore();
}

/** Wrap `nodeType.prototype[method]`: the original (if any) runs first, then `after(node, ...args)`. */
function chain(nodeType, method, after) {
    const original = nodeType.prototype[method];
    nodeType.prototype[method] = function (...args) {
        const result = original?.apply(this, args);
        after(this, ...args);
        return result;
    };
}

function hookNodeType(nodeType, render) {
    chain(nodeType, "onNodeCreated", render);
    chain(nodeType, "onDrawForeground", drawOnCanvas);
}

app.registerExtension({
    name: "lorabind.contracts",

    async setup() {
        loadStyle();
    },

    async beforeRegisterNodeDef(nodeType, nodeData) {
        if (CONTRACT_NODES.includes(nodeData.name)) {
            hookNodeType(nodeType, renderContractNode);
            chain(nodeType, "onExecuted", (node, output) => {
                node.lorabind = {
                    contracts: (output?.lorabind_contract || []).filter((c) => c && c.source),
                    accounting: output?.lorabind_accounting || [],
                };
                renderContractNode(node);
                refreshSamplers(node.graph || app.graph);
            });
        } else if (nodeData.name === SAMPLER_NODE) {
            const render = (node) => renderSampler(node, node.graph || app.graph);
            hookNodeType(nodeType, render);
            chain(nodeType, "onExecuted", (node, output) => {
                node.lorabind = { contracts: [], schedule: output?.lorabind_schedule?.[0] };
                render(node);
            });
            chain(nodeType, "onWidgetChanged", render);
            chain(nodeType, "onConnectionsChange", render);
        }
    },
});
