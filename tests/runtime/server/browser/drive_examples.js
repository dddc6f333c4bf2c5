// Loads every example workflow the server offers as a template into the stub app, one after the other, with the
// real server answering /lorabind/contract, and records what the badges say before anything runs. An example
// that runs as it is must show no warning; wan22_mismatched_contract must show its steps conflict.
import { app, loadExtension, loadGraph, StubGraph } from "./stub_app.js";

const result = { errors: [], examples: {} };
const badge = (node) => [...node.lorabindBadge.children].map((e) => `${e.className}: ${e.textContent}`);
try {
    const lorabind = await loadExtension(app, result);
    const objectInfo = await (await fetch("/api/object_info")).json();
    const index = await (await fetch("/templates/index.json")).json();
    for (const name of index.flatMap((category) => category.templates.map((card) => card.name))) {
        const workflow = await (await fetch(`/api/workflow_templates/lorabind/${name}.json`)).json();
        app.graph = new StubGraph();
        document.getElementById("canvas").replaceChildren();
        await loadGraph(app, workflow, objectInfo);
        await lorabind.lookupsSettled();
        result.examples[name] = Object.fromEntries(app.graph._nodes.filter((n) => n.lorabindBadge)
            .map((n) => [`${n.id} ${n.type}`, badge(n)]));
    }
} catch (error) {
    result.errors.push(String(error && error.stack || error));
}
document.getElementById("lorabind-result").textContent = JSON.stringify(result, null, 1);
document.body.dataset.done = "1";
