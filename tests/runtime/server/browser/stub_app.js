// A minimal stand-in for ComfyUI's `app` (scripts/app.js) and litegraph nodes: just what an extension touches
// (registerExtension, beforeRegisterNodeDef, nodeCreated/loadedGraphNode, onNodeCreated/onExecuted/onWidgetChanged,
// widget callbacks, addDOMWidget, graph.links), rendering each node as a DOM box so the test can read and
// screenshot the badges. `loadGraph` loads a saved UI workflow the way the frontend does.
export class StubGraph {
    constructor() { this._nodes = []; this.links = {}; this.nextLink = 1; }
    add(node, id) { node.id = id ?? this._nodes.length + 1; node.graph = this; this._nodes.push(node); }
    getNodeById(id) { return this._nodes.find((n) => n.id === id) || null; }
    connect(origin, target, inputName) {
        const input = target.inputs.find((i) => i.name === inputName);
        input.link = this.nextLink++;
        this.links[input.link] = { id: input.link, origin_id: origin.id, origin_slot: 0, target_id: target.id };
        target.onConnectionsChange?.(1, 0, true, this.links[input.link], input);
    }
}

export const app = {
    extensions: [],
    graph: new StubGraph(),
    registerExtension(extension) { this.extensions.push(extension); },
};

/** Build a node type the way ComfyUI does before calling beforeRegisterNodeDef. */
export function makeNodeType(name) {
    return class {
        constructor(title, widgets, inputs) {
            this.type = name; this.comfyClass = name; this.title = title; this.size = [360, 80];
            this.widgets = Object.entries(widgets).map(([wname, value]) => ({ name: wname, value }));
            this.inputs = inputs.map((iname) => ({ name: iname, link: null }));
            this.element = document.createElement("div");
            this.element.className = "node";
            this.element.dataset.type = name;
            this.element.innerHTML = `<div class="node-title"></div><div class="node-widgets"></div>`;
            this.element.querySelector(".node-title").textContent = title;
            document.getElementById("canvas").appendChild(this.element);
        }
        addDOMWidget(name, type, element) {
            this.element.querySelector(".node-widgets").appendChild(element);
            const widget = { name, type, element };
            this.widgets.push(widget);
            return widget;
        }
        setWidget(name, value) {
            const widget = this.widgets.find((w) => w.name === name);
            const old = widget.value;
            widget.value = value;
            widget.callback?.(value);
            this.onWidgetChanged?.(name, value, old, widget);
        }
    };
}

// Input types the frontend draws as widgets; any other type is a socket.
const WIDGET_TYPES = ["INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"];

/** The widgets (name -> default) and socket inputs of a node class, in the frontend's order: required, then
 * optional; an INT with control_after_generate gets its "control_after_generate" widget right after it. */
function nodeShape(definition) {
    const widgets = {}, inputs = [];
    for (const group of ["required", "optional"]) {
        for (const [name, [type, options = {}]] of Object.entries(definition.input?.[group] || {})) {
            if (Array.isArray(type) || WIDGET_TYPES.includes(type)) {
                widgets[name] = options.default ?? (Array.isArray(type) ? type[0] : null);
                if (options.control_after_generate) widgets.control_after_generate = "fixed";
            } else {
                inputs.push(name);
            }
        }
    }
    return { widgets, inputs };
}

/** Load a saved UI workflow as the frontend does: register each node class with the extensions, create the
 * nodes (nodeCreated sees the defaults), set their saved widget values and links, then loadedGraphNode. Nodes
 * the server does not define (Note) are left out. */
export async function loadGraph(app, workflow, objectInfo) {
    const types = {};
    const created = [];
    for (const saved of workflow.nodes) {
        const definition = objectInfo[saved.type];
        if (!definition) continue;
        if (!types[saved.type]) {
            types[saved.type] = makeNodeType(saved.type);
            for (const extension of app.extensions) {
                await extension.beforeRegisterNodeDef?.(types[saved.type], definition, app);
            }
        }
        const { widgets, inputs } = nodeShape(definition);
        const node = new types[saved.type](saved.title || definition.display_name || saved.type, widgets, inputs);
        app.graph.add(node, saved.id);
        node.onNodeCreated?.();
        for (const extension of app.extensions) extension.nodeCreated?.(node, app);
        const values = saved.widgets_values || [];
        node.widgets.filter((w) => w.name in widgets).forEach((widget, i) => {
            if (i < values.length) widget.value = values[i];
        });
        for (const input of saved.inputs || []) {
            const target = node.inputs.find((i) => i.name === input.name);
            if (target) target.link = input.link ?? null;
        }
        created.push(node);
    }
    for (const [id, origin, originSlot, target] of workflow.links) {
        app.graph.links[id] = { id, origin_id: origin, origin_slot: originSlot, target_id: target };
    }
    for (const node of created) {
        for (const extension of app.extensions) extension.loadedGraphNode?.(node, app);
    }
    return created;
}

/** Load the lorabind extensions as ComfyUI does (their URLs from GET /extensions) and run their setup; record
 * page errors into `result.errors`. Returns the module of lorabind.js (the contracts extension). */
export async function loadExtension(app, result) {
    addEventListener("error", (event) => result.errors.push(String(event.message)));
    addEventListener("unhandledrejection", (event) => result.errors.push(String(event.reason)));
    let module = null;
    const urls = await (await fetch("/extensions")).json();
    for (const url of urls.filter((u) => u.startsWith("/extensions/lorabind/"))) {
        const imported = await import(url);
        if (url.endsWith("/lorabind.js")) module = imported;
    }
    for (const extension of app.extensions) await extension.setup?.(app);
    return module;
}
