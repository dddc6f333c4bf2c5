/*
 * The badge a lorabind node shows its contract lines in (lorabind.js decides the lines): a DOM widget under the
 * node's inputs, or, on frontends without DOM widgets, text drawn on the canvas below the node.
 * No registerExtension here: the frontend loads this file as an extension too, and it only exports helpers.
 */
import { badgeHeight } from "./lorabind_badge_size.js";

const BADGE_WIDGET = "lorabind_badge";

/** The badge element, added once per node as a DOM widget (or kept on the node for canvas drawing). Its
 * minimum height is the height of its text at the node's width: litegraph grows a node whose DOM widgets need
 * more than its saved size (LGraphNode._arrangeWidgets in frontend 1.58.1), so a long badge wraps and stays
 * whole instead of being cut off mid-line (issue 30). */
function badgeOf(node) {
    if (node.lorabindBadge) return node.lorabindBadge;
    const element = document.createElement("div");
    element.className = "lorabind-badge";
    node.lorabindBadge = element;
    if (typeof node.addDOMWidget === "function") {
        let widget = null; // read by getMinHeight only once the frontend lays the node out
        widget = node.addDOMWidget(BADGE_WIDGET, "lorabind", element, {
            serialize: false, hideOnZoom: false, getMinHeight: () => badgeHeight(node, node.lorabindBadge, widget),
        });
        // Display only: keep it out of widgets_values, whose positions map to the node's inputs on load.
        if (widget) widget.serialize = false;
    }
    return element;
}

/** Warnings first, then what is declared; the node grows to show every line (badgeOf). */
export function renderLines(node, lines, warnings) {
    const rows = [...warnings.map((text) => ["lorabind-warning", `⚠ ${text}`]),
        ...lines.map((text) => ["lorabind-line", text])];
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

/** Draw the badge lines under the title when the frontend has no DOM widgets (older litegraph canvases). */
export function drawOnCanvas(node, ctx) {
    if (typeof node.addDOMWidget === "function" || !node.lorabindLines?.length) return;
    ctx.save();
    ctx.font = "11px sans-serif";
    node.lorabindLines.forEach((text, i) => {
        ctx.fillStyle = text.startsWith("⚠") ? "#ff6b6b" : "#9ad0ff";
        ctx.fillText(text, 6, node.size[1] + 14 + 13 * i);
    });
    ctx.restore();
}
