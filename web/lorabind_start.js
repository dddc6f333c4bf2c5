/*
 * What the editor opens on when `lorabind serve` hosts it (issue 30).
 *
 * The frontend (comfyui-frontend-package 1.58.1) starts a visit in one of two ways:
 *   - a new user (setting Comfy.TutorialCompleted false): a blank canvas under the Templates dialog;
 *   - anyone else with nothing to restore: `app.loadGraphData()` with no workflow, which loads ComfyUI's own
 *     default graph (window.comfyAPI.defaultGraph.defaultGraph: checkpoint loader, KSampler, ...).
 * This server has none of ComfyUI's core nodes, so that graph opens as red "missing" nodes and a "Missing Node
 * Packs" dialog telling the user to install ComfyUI and its manager. Instead, every visit with nothing to
 * restore opens our main example, through the frontend's own hooks (nothing in the frontend is patched):
 *   - setup(): on a first visit, mark the tutorial completed (so the frontend takes the second path), and turn
 *     off the one setting that fetches release news from outside hosts (Comfy.Notification.ShowVersionUpdates);
 *   - beforeConfigureGraph(graphData): when the graph about to load is the frontend's default one, replace its
 *     contents with our main example before the frontend looks for missing nodes.
 * Both happen only when this server cannot run the default graph (some of its node types are not registered):
 * inside ComfyUI, where it can, the frontend behaves as ComfyUI's users expect.
 *
 * And the view a template opens at (issue 45): the frontend fits every template it opens to the window and
 * ignores the view the workflow saved (extra.ds). Ours are wide, so in a 1600x1000 window they opened at 53-57 %,
 * below the zoom (60 %) where LiteGraph stops drawing titles and widget values: blank boxes. afterConfigureGraph:
 * once the frontend has placed the camera, one of our templates (extra.lorabind_template) opens at its extra.ds
 * instead (80 %, its top-left corner in view), unless the user turned off Comfy.EnableWorkflowViewRestore.
 */
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const MAIN_EXAMPLE = "wan22_lightx2v_4step";
const EXAMPLE_URL = `/workflow_templates/lorabind/${MAIN_EXAMPLE}.json`;
const FIRST_VISIT_SETTINGS = {
    "Comfy.TutorialCompleted": true,
    "Comfy.Notification.ShowVersionUpdates": false,
};

function comfyDefaultGraph() {
    return window.comfyAPI?.defaultGraph?.defaultGraph;
}

/** True when the frontend's default graph names node types this server does not have. */
function defaultGraphCannotRun() {
    const graph = comfyDefaultGraph();
    const registered = window.LiteGraph?.registered_node_types || {};
    return !!graph && graph.nodes.some((node) => !(node.type in registered));
}

/** The graph about to load is the frontend's default one (a deep copy of it: compare what identifies it). */
function isComfyDefaultGraph(graphData) {
    const graph = comfyDefaultGraph();
    if (!graph || !graphData || !Array.isArray(graphData.nodes)) return false;
    const shape = (g) => JSON.stringify(g.nodes.map((node) => [node.id, node.type]));
    return shape(graphData) === shape(graph);
}

async function applyFirstVisitSettings() {
    const settings = app.extensionManager?.setting;
    if (!settings || settings.get("Comfy.TutorialCompleted")) return;
    for (const [id, value] of Object.entries(FIRST_VISIT_SETTINGS)) await settings.set(id, value);
}

async function mainExample() {
    const reply = await api.fetchApi(EXAMPLE_URL, { cache: "no-store" });
    if (!reply.ok) throw new Error(`${EXAMPLE_URL}: HTTP ${reply.status}`);
    return reply.json();
}

const CAMERA_WAIT_FRAMES = 120;

/** After the frontend's own camera for this load has run (app.pendingCamera is cleared then), apply `view`. */
async function openAtSavedView(extra, view) {
    const nextFrame = () => new Promise((resolve) => requestAnimationFrame(resolve));
    await nextFrame();
    for (let frame = 0; frame < CAMERA_WAIT_FRAMES && app.pendingCamera; frame++) await nextFrame();
    if (app.rootGraph?.extra !== extra) return; // another workflow was opened meanwhile
    app.canvas.ds.scale = view.scale;
    app.canvas.ds.offset = [view.offset[0], view.offset[1]];
    app.canvas.setDirty(true, true);
}

app.registerExtension({
    name: "lorabind.start",

    async afterConfigureGraph() {
        const extra = app.rootGraph?.extra || {};
        const view = extra.ds;
        if (!extra.lorabind_template || !view || !(view.scale > 0) || !Array.isArray(view.offset)) return;
        if (app.extensionManager.setting.get("Comfy.EnableWorkflowViewRestore") === false) return;
        openAtSavedView(extra, view); // not awaited: the camera runs after this load returns
    },

    async setup() {
        if (defaultGraphCannotRun()) await applyFirstVisitSettings();
    },

    async beforeConfigureGraph(graphData) {
        if (!isComfyDefaultGraph(graphData) || !defaultGraphCannotRun()) return;
        let example;
        try {
            example = await mainExample();
        } catch (error) {
            console.warn(`lorabind: could not open the main example instead of ComfyUI's default graph: ${error}`);
            return;
        }
        for (const key of Object.keys(graphData)) delete graphData[key];
        Object.assign(graphData, example);
    },
});
