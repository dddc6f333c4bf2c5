/*
 * How tall a lorabind badge (lorabind_badge.js) must be to show all its lines at its node's width.
 *
 * Why: a node keeps the size its workflow saved, and the frontend (1.58.1) gives a DOM widget only the room left
 * unless the widget asks for more (its getMinHeight); litegraph then grows the node (LGraphNode._arrangeWidgets).
 * Without this the contract badges were cut off mid-line and the low-noise file name never showed (issue 30).
 * No registerExtension here: the frontend loads this file as an extension too, and it only exports a helper.
 */

// The badge's box around its lines (lorabind.css: padding 3px, border 1px, above and below) and the frontend's
// margin around a DOM widget (BaseDOMWidgetImpl.DEFAULT_MARGIN), in canvas units; a line of 11px text at 1.35.
const BADGE_CHROME = 2 * (3 + 1);
const DOM_WIDGET_MARGIN = 10;
const LINE_HEIGHT = 11 * 1.35;
const BADGE_FONT = "11px sans-serif";
const WARNING_EXTRA = 2 + 2; // a warning row's padding and margin (lorabind.css)

/** The height the badge's lines take: measured from the page once laid out (the frontend scales the element
 * with a transform, which offsetHeight ignores), estimated from the text's width before that. */
export function badgeHeight(node, element, widget) {
    const margin = widget?.margin ?? DOM_WIDGET_MARGIN;
    const rows = [...(element?.children || [])];
    const measured = rows.reduce((sum, row) =>
        sum + row.offsetHeight + (parseFloat(getComputedStyle(row).marginTop) || 0), 0);
    const textWidth = node.size[0] - 2 * margin - 2 * (6 + 1); // the badge's side padding and border
    const text = measured > 0 ? measured : estimatedTextHeight(node.lorabindLines || [], textWidth);
    return Math.ceil(text + BADGE_CHROME + 2 * margin);
}

let measureContext = null;

/** Lines wrapped at `width` pixels, counted from their drawn width: the page has not laid the badge out yet. */
function estimatedTextHeight(lines, width) {
    measureContext = measureContext || document.createElement("canvas").getContext("2d");
    measureContext.font = BADGE_FONT;
    const rows = lines.reduce((sum, text) =>
        sum + Math.max(1, Math.ceil(measureContext.measureText(text).width / Math.max(width, 40))), 0);
    return rows * LINE_HEIGHT + WARNING_EXTRA * lines.filter((text) => text.startsWith("⚠")).length;
}
