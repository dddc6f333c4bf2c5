/*
 * lorabind frontend extension (plain ES module, no build step), loaded by ComfyUI from /extensions/lorabind/.
 *
 * What it shows
 *   - On the nodes that name a file carrying a sampling contract (FuseDistillLoRA, WanMoELoRAPair,
 *     LoadPEFTAdapter, MiniMaxTurboSchedule, LoraBindModelLoader, and the ComfyUI-native LoraBindLoRA and
 *     LoraBindLoRAPair): a badge with the contract each file declares
 *     (steps / shift / cfg / tasks, and where it is declared) and, after a run, the key accounting.
 *   - On LoraBindSampler: the combined contract of everything connected upstream, and a warning, naming the
 *     artifact, on each widget (steps / shift / cfg / cfg_low_noise / audio_flow_shift) that disagrees with it;
 *     after a run, the schedule that actually ran.
 *
 * Where the data comes from
 *   - Before any run: GET /lorabind/contract?name=&folder= (nodes/editor_routes.py, served by `lorabind serve`
 *     and by ComfyUI's server), asked when a node is created, when a workflow is loaded and when a file or
 *     strength widget changes. Answer = { file, family, contract, contracts: [Contract], reason } (reason says
 *     why `contracts` is empty; HTTP 404 = no such file, 400 = a name outside the folder, 422 = a refused file).
 *   - After a run: the `executed` WebSocket message, whose `output` is the node's ui dict; ComfyUI hands it to
 *     `node.onExecuted(output)`. It has the last word until a file or strength widget of the node changes.
 *     Every value in a ui dict is a list. The keys this file reads:
 *
 *   output.lorabind_contract   : [Contract]            (adapter / fuse / schedule nodes)
 *   output.lorabind_accounting : [Accounting]          (Contract and Accounting: see lorabind_contracts.js)
 *   output.lorabind_schedule   : [Schedule]            (LoraBindSampler)
 *       Schedule = { steps: int, shift: number, cfg: number|[number], task: str|null,
 *                    contracts: [Contract], overrides: [str], warnings: [str] }
 *                    (warnings: the run went ahead but is likely not what was meant, e.g. one Wan2.2 expert alone)
 *
 * Beside it: lorabind_contracts.js (a contract in words, and the sampler widgets that disagree with it),
 * lorabind_badge.js (the badge the lines are drawn in) and lorabind_badge_size.js (its height).
 */
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { drawOnCanvas, renderLines } from "./lorabind_badge.js";
import { combineContracts, constraintWords, contractMismatches, describeAccounting, describeContract, fmt }
    from "./lorabind_contracts.js";

// node class -> its file widgets: [widget, model folder (the endpoint's `folder`), the strength/scale widget at
// whose 0 the artifact and its contract are off (loaders.dispatch.contract_discovery.collect_contracts), or null]. Kept as one
// JSON line: tests/nodes/test_web_contract_widgets.py checks it against the nodes' INPUT_TYPES.
const CONTRACT_WIDGETS = {"FuseDistillLoRA": [["lora_name", "loras", "strength"]], "WanMoELoRAPair": [["high_noise_lora", "loras", "high_noise_strength"], ["low_noise_lora", "loras", "low_noise_strength"]], "LoadPEFTAdapter": [["lora_name", "loras", "scale"]], "MiniMaxTurboSchedule": [["lora_name", "loras", "scale"]], "LoraBindModelLoader": [["model_name", "diffusers", null]], "LoraBindLoRA": [["lora_name", "loras", "strength"]], "LoraBindLoRAPair": [["lora_high", "loras", "strength_high"], ["lora_low", "loras", "strength_low"]]};
const NO_FILE = "None";
const SAMPLER_NODE = "LoraBindSampler";
const CONTRACT_PATH = "/lorabind/contract";

const STYLE_URL = new URL("./lorabind.css", import.meta.url);

function loadStyle() {
    if (document.querySelector(`link[href="${STYLE_URL.href}"]`)) return;
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = STYLE_URL.href;
    document.head.appendChild(link);
}

function widgetOf(node, name) {
    return (node.widgets || []).find((w) => w.name === name) || null;
}

function widgetValue(node, name) {
    return widgetOf(node, name)?.value ?? null;
}

function nodeClass(node) {
    return node.comfyClass || node.type;
}

// ---------------------------------------------------------------------------------------------------------
// asking the server what a file declares

const answers = new Map(); // "folder\nname" -> Promise of the answer (only answers that found the file stay)
const inFlight = new Set();

function askContract(folder, name) {
    const key = `${folder}\n${name}`;
    if (!answers.has(key)) {
        const query = new URLSearchParams({ name, folder });
        const answer = api.fetchApi(`${CONTRACT_PATH}?${query}`)
            .then(async (response) => {
                const body = await response.json().catch(() => null);
                if (response.status !== 200) answers.delete(key); // the file may appear later: ask again then
                return { contracts: [], ...(body && typeof body === "object" ? body : {}),
                         status: response.status, reason: body?.reason ?? `HTTP ${response.status}` };
            })
            .catch((error) => {
                answers.delete(key);
                return { status: 0, contracts: [], reason: `the server did not answer (${error})` };
            });
        answers.set(key, answer);
    }
    return answers.get(key);
}

function track(promise) {
    inFlight.add(promise);
    promise.finally(() => inFlight.delete(promise));
    return promise;
}

/** Resolves once every contract look-up asked so far (and any they started) has been answered and drawn. */
export async function lookupsSettled() {
    while (inFlight.size) await Promise.allSettled([...inFlight]);
}

/** Ask for the contracts of the files `node` names now; draws the node and the samplers when answered. An
 * answer that arrives after the user picked another file is dropped. */
function lookUpDeclared(node) {
    const asked = (CONTRACT_WIDGETS[nodeClass(node)] || []).map(([widget, folder]) =>
        [widget, folder, widgetValue(node, widget)]);
    const key = JSON.stringify(asked);
    if (node.lorabindAsked === key) return;
    node.lorabindAsked = key;
    track(Promise.all(asked.map(async ([widget, folder, name]) =>
        [widget, name && name !== NO_FILE ? await askContract(folder, String(name)) : null],
    )).then((found) => {
        if (node.lorabindAsked !== key) return;
        node.lorabindDeclared = Object.fromEntries(found);
        renderContractNode(node);
        refreshSamplers(node.graph || app.graph);
    }));
}

function isOff(node, strengthWidget) {
    return strengthWidget != null && Number(widgetValue(node, strengthWidget)) === 0;
}

/** The contracts a node puts in force now: its last run's payload, else what its files declare (an artifact
 * at strength/scale 0 declares nothing, as the sampler sees it). */
function contractsInForce(node) {
    if (node.lorabind) return node.lorabind.contracts;
    return (CONTRACT_WIDGETS[nodeClass(node)] || []).flatMap(([widget, , strength]) =>
        isOff(node, strength) ? [] : (node.lorabindDeclared?.[widget]?.contracts || []));
}

// ---------------------------------------------------------------------------------------------------------
// drawing

function linkById(graph, id) {
    return typeof graph.links?.get === "function" ? graph.links.get(id) : graph.links?.[id];
}

/** Contracts in force on nodes upstream of `node` (any depth). */
function upstreamContracts(node, graph, seen = new Set()) {
    const found = [];
    for (const input of node.inputs || []) {
        if (input.link == null) continue;
        const link = linkById(graph, input.link);
        const source = link && graph.getNodeById(link.origin_id);
        if (!source || seen.has(source.id)) continue;
        seen.add(source.id);
        found.push(...contractsInForce(source));
        found.push(...upstreamContracts(source, graph, seen));
    }
    return found;
}

/** Lines for what the node's files declare, before any run. */
function declaredLines(node) {
    const lines = [], warnings = [];
    for (const [widget, , strength] of CONTRACT_WIDGETS[nodeClass(node)] || []) {
        const name = widgetValue(node, widget);
        if (!name || name === NO_FILE) continue;
        const answer = node.lorabindDeclared?.[widget];
        if (!answer) {
            lines.push(`${name}: reading its contract…`);
        } else if (answer.contracts.length) {
            const off = isOff(node, strength) ? ` — off: ${strength} is 0` : "";
            lines.push(...answer.contracts.map((c) => `${describeContract(c)}${off}`));
        } else if (answer.status === 200) {
            lines.push(`${name}: no sampling contract (${answer.reason})`);
        } else {
            warnings.push(`${name}: ${answer.reason}`);
        }
    }
    if (!lines.length && !warnings.length) lines.push("no file chosen");
    return [lines, warnings];
}

function renderContractNode(node) {
    const state = node.lorabind;
    if (!state) {
        renderLines(node, ...declaredLines(node));
        return;
    }
    const lines = state.contracts.length ? state.contracts.map(describeContract) : ["no sampling contract"];
    renderLines(node, [...lines, ...state.accounting.map(describeAccounting)], []);
}

const CHECKED_WIDGETS = ["steps", "shift", "cfg", "cfg_low_noise", "audio_flow_shift"];

/** Mark each disagreeing widget in its label ("⚠ steps"); the badge names the artifact. */
function markWidgets(node, problems) {
    for (const name of CHECKED_WIDGETS) {
        const widget = widgetOf(node, name);
        if (!widget) continue;
        if (!("lorabindLabel" in widget)) widget.lorabindLabel = widget.label;
        widget.label = problems[name] ? `⚠ ${widget.lorabindLabel ?? name}` : widget.lorabindLabel;
        widget.lorabindConflict = problems[name] ? problems[name].join("; ") : undefined;
    }
}

function renderSampler(node, graph) {
    const values = Object.fromEntries(CHECKED_WIDGETS.map((name) => [name, widgetValue(node, name)]));
    const contracts = graph ? upstreamContracts(node, graph) : [];
    const problems = {};
    for (const contract of contracts) {
        for (const [widget, lines] of Object.entries(contractMismatches(values, contract))) {
            (problems[widget] = problems[widget] || []).push(...lines);
        }
    }
    const combined = combineContracts(contracts);
    const enforced = widgetValue(node, "enforce_contract") !== false;
    const suffix = enforced ? "" : " (enforce_contract is off: the run overrides it)";
    const warnings = [...combined.conflicts, ...Object.values(problems).flat()].map((line) => line + suffix);
    const ran = node.lorabind?.schedule;
    warnings.push(...(ran?.warnings || []));
    const lines = [];
    if (contracts.length) { // each artifact's own line, with where it is declared, is on its node
        lines.push(`contract: ${constraintWords(combined)} — from ${contracts.map((c) => c.source).join(", ")}`);
    }
    if (ran) {
        lines.push(`ran: ${ran.steps} steps · shift ${fmt(ran.shift)} · cfg ${[].concat(ran.cfg).map(fmt).join("/")}`);
        lines.push(...(ran.overrides || []).map((o) => `override: ${o}`));
    }
    if (!lines.length) lines.push("no contract connected");
    markWidgets(node, problems);
    renderLines(node, lines, warnings);
}

function refreshSamplers(graph) {
    for (const node of graph?._nodes || graph?.nodes || []) {
        if (nodeClass(node) === SAMPLER_NODE) renderSampler(node, graph);
    }
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

/** A file or strength widget changed: the last run's payload describes other files now, so what the files
 * declare takes over again until the next run. */
function contractInputChanged(node, name) {
    const watched = (CONTRACT_WIDGETS[nodeClass(node)] || []).flat().filter(Boolean);
    if (!watched.includes(name)) return;
    node.lorabind = undefined;
    lookUpDeclared(node);
    renderContractNode(node);
    refreshSamplers(node.graph || app.graph);
}

app.registerExtension({
    name: "lorabind.contracts",

    async setup() {
        loadStyle();
    },

    async beforeRegisterNodeDef(nodeType, nodeData) {
        if (nodeData.name in CONTRACT_WIDGETS) {
            hookNodeType(nodeType, renderContractNode);
            chain(nodeType, "onExecuted", (node, output) => {
                node.lorabind = {
                    contracts: (output?.lorabind_contract || []).filter((c) => c && c.source),
                    accounting: output?.lorabind_accounting || [],
                };
                renderContractNode(node);
                refreshSamplers(node.graph || app.graph);
            });
            chain(nodeType, "onWidgetChanged", (node, name) => contractInputChanged(node, name));
            chain(nodeType, "onConnectionsChange", (node) => refreshSamplers(node.graph || app.graph));
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

    /** A node added to the canvas: ask what its files declare (its widgets hold their defaults now). */
    nodeCreated(node) {
        if (!(nodeClass(node) in CONTRACT_WIDGETS)) return;
        // Frontends that change a combo without onWidgetChanged still call the widget's callback.
        for (const name of CONTRACT_WIDGETS[nodeClass(node)].flat().filter(Boolean)) {
            const widget = widgetOf(node, name);
            if (!widget) continue;
            const callback = widget.callback;
            widget.callback = function (...args) {
                const result = callback?.apply(this, args);
                contractInputChanged(node, name);
                return result;
            };
        }
        lookUpDeclared(node);
    },

    /** A workflow was loaded: its widget values are in place, so ask again for the files it names. */
    loadedGraphNode(node) {
        if (nodeClass(node) in CONTRACT_WIDGETS) lookUpDeclared(node);
        else if (nodeClass(node) === SAMPLER_NODE) renderSampler(node, node.graph || app.graph);
    },
});
