// Drives web/lorabind.js through editing, with the real server answering /lorabind/contract: load the saved
// workflow wan22_mismatched_contract.json (20 steps against the 4-step lightx2v pair), read the badges before
// anything ran, change widgets the way a user does, then let a run's payload arrive. Results go to
// #lorabind-result for the test.
import { app, loadExtension, loadGraph } from "./stub_app.js";

const result = { errors: [] };
const lines = (node) => [...node.lorabindBadge.children].map((e) => `${e.className}: ${e.textContent}`);
const warnings = (node) => [...node.lorabindBadge.querySelectorAll(".lorabind-warning")].map((e) => e.textContent);
try {
    const lorabind = await loadExtension(app, result);
    const objectInfo = await (await fetch("/api/object_info")).json();
    const workflow = await (await fetch("/api/workflow_templates/lorabind/wan22_mismatched_contract.json")).json();

    await loadGraph(app, workflow, objectInfo);
    const byType = (type) => app.graph._nodes.find((n) => n.type === type);
    const [loader, pair, sampler] = ["LoraBindModelLoader", "WanMoELoRAPair", "LoraBindSampler"].map(byType);
    result.readingPair = lines(pair); // asked, not answered yet
    await lorabind.lookupsSettled();

    result.anyExecuted = app.graph._nodes.some((n) => n.lorabind);
    result.pair = lines(pair);
    result.loader = lines(loader);
    result.sampler = lines(sampler);
    result.samplerWarning = sampler.lorabindWarning;
    result.marked = Object.fromEntries(sampler.widgets.filter((w) => w.lorabindConflict)
        .map((w) => [w.name, [w.label, w.lorabindConflict]]));

    sampler.setWidget("steps", 4);
    result.warningsAt4 = warnings(sampler);
    result.stepsLabelAt4 = sampler.widgets.find((w) => w.name === "steps").label ?? null;
    sampler.setWidget("steps", 0); // "the step count the contract declares"
    result.warningsAt0 = warnings(sampler);
    sampler.setWidget("cfg", 3.5);
    result.warningsCfg = warnings(sampler);
    sampler.setWidget("cfg", 1.0);
    sampler.setWidget("steps", 20);

    // the user switches the low-noise file off (strength 0), then names a file that is not there
    pair.setWidget("low_noise_strength", 0);
    result.warningsLowOff = warnings(sampler);
    result.pairLowOff = lines(pair);
    pair.setWidget("low_noise_strength", 1.0);
    pair.setWidget("high_noise_lora", "lorabind-tiny/gone.safetensors");
    await lorabind.lookupsSettled();
    result.pairMissing = warnings(pair);
    result.warningsHighMissing = warnings(sampler);
    pair.setWidget("high_noise_lora", workflow.nodes.find((n) => n.type === "WanMoELoRAPair").widgets_values[0]);
    await lorabind.lookupsSettled();
    result.warningsBack = warnings(sampler);

    // after a run, the executed payload has the last word
    pair.onExecuted({ lorabind_contract: [{ source: "ran.safetensors", kind: "distill", steps: 8, shift: 5.0,
                                            cfg: 1.0, declared_by: "file name" }], lorabind_accounting: [] });
    result.warningsAfterRun = warnings(sampler);
    // two artifacts that disagree with each other: the sampler refuses them whatever its widgets say
    sampler.setWidget("steps", 4);
    pair.onExecuted({ lorabind_contract: [{ source: "a.safetensors", kind: "distill", steps: 4 },
                                          { source: "b.safetensors", kind: "distill", steps: 8 }] });
    result.warningsConflict = warnings(sampler);
    sampler.setWidget("steps", 20);
    sampler.onExecuted({ lorabind_schedule: [{ steps: 20, shift: 5.0, cfg: 1.0, task: null, contracts: [],
                                               overrides: [] }] });
    result.samplerAfterRun = lines(sampler);
} catch (error) {
    result.errors.push(String(error && error.stack || error));
}
document.getElementById("lorabind-result").textContent = JSON.stringify(result, null, 1);
document.body.dataset.done = "1";
