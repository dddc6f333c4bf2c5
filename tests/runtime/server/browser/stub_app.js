// A minimal stand-in for ComfyUI's `app` (scripts/app.js) and litegraph nodes: just what an extension touches
// (registerExtension, beforeRegisterNodeDef, onNodeCreated/onExecuted/onWidgetChanged, addDOMWidget, graph.links),
// rendering each node as a DOM box so the test can read and screenshot the badges.
export class StubGraph {
    constructor() { this._nodes = []; this.links = {}; this.nextLink = 1; }
    add(node) { node.id = this._nodes.length + 1; node.graph = this; this._nodes.push(node); }
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
            this.onWidgetChanged?.(name, value, old, widget);
        }
    };
}
