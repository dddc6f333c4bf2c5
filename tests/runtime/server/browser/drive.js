// Drives web/lorabind.js through a realistic sequence: a distill LoRA fused into a model feeding the sampler,
// the fuse node executes (contract + accounting arrive), the user changes the sampler's steps away from the
// contract (warning), then the sampler executes. Results are written to #lorabind-result for the test.
import { app, makeNodeType } from "./stub_app.js";

const result = { extensions: [], errors: [] };
try {
    const urls = await (await fetch("/extensions")).json();
    result.extensions = urls;
    for (const url of urls.filter((u) => u.startsWith("/extensions/lorabind/"))) await import(url);
    for (const extension of app.extensions) await extension.setup?.(app);

    const types = {};
    for (const name of ["LoraBindModelLoader", "FuseDistillLoRA", "LoraBindSampler"]) {
        types[name] = makeNodeType(name);
        for (const extension of app.extensions) await extension.beforeRegisterNodeDef?.(types[name], { name }, app);
    }
    const create = (name, title, widgets, inputs) => {
        const node = new types[name](title, widgets, inputs);
        app.graph.add(node);
        node.onNodeCreated?.();
        return node;
    };
    const loader = create("LoraBindModelLoader", "Load model", { model_name: "tiny-wan22-t2v" }, []);
    const fuse = create("FuseDistillLoRA", "Fuse distill LoRA", { strength: 1.0 }, ["model"]);
    const sampler = create("LoraBindSampler", "Sampler (lorabind)", { steps: 4, shift: 5.0, cfg: 1.0 },
                           ["model", "adapter", "schedule"]);
    app.graph.connect(loader, fuse, "model");
    app.graph.connect(fuse, sampler, "model");
    result.before = fuse.lorabindBadge.textContent;

    fuse.onExecuted({
        lorabind_contract: [{ source: "lightx2v_4step.safetensors", kind: "distill", steps: 4, shift: 5.0,
                              cfg: 1.0, tasks: ["t2v"], declared_by: "file name", note: "", text: "" }],
        lorabind_accounting: [{ lora: "lightx2v_4step.safetensors", component: "transformer",
                                counts: { applied: 400, expected_unmatched: 2, unmatched: 0 } }],
        text: ["ignored by the badge"],
    });
    result.samplerMatching = sampler.lorabindBadge.textContent;
    result.warningWhenMatching = sampler.lorabindWarning;
    sampler.setWidget("steps", 8);
    result.warningWhenSteps8 = sampler.lorabindWarning;
    // a MiniMax-H3 style contract (shift named flow_shift) arriving on the same chain adds a shift warning
    fuse.onExecuted({ lorabind_contract: [{ source: "minimax_h3_turbo_8step.safetensors", kind: "turbo",
                                            steps: 8, flow_shift: 3.0, tasks: ["fl2v"] }] });
    result.minimaxWarnings = [...sampler.lorabindBadge.querySelectorAll(".lorabind-warning")].map((e) => e.textContent);
    fuse.onExecuted({
        lorabind_contract: [{ source: "lightx2v_4step.safetensors", kind: "distill", steps: 4, shift: 5.0,
                              cfg: 1.0, tasks: ["t2v"], declared_by: "file name", text: "" }],
        lorabind_accounting: [{ lora: "lightx2v_4step.safetensors", component: "transformer",
                                counts: { applied: 400, expected_unmatched: 2, unmatched: 0 } }],
    });
    sampler.onExecuted({ lorabind_schedule: [{ steps: 8, shift: 5.0, cfg: 1.0, task: null, contracts: [],
                                               overrides: ["steps 8 instead of 4 (enforce_contract off)"] }] });
    result.fuse = fuse.lorabindBadge.textContent;
    result.badgeSerialized = fuse.widgets.filter((w) => w.serialize !== false).map((w) => w.name);
    result.sampler = [...sampler.lorabindBadge.children].map((e) => `${e.className}: ${e.textContent}`);
    result.stylesheet = Boolean(document.querySelector('link[href$="/extensions/lorabind/lorabind.css"]'));
} catch (error) {
    result.errors.push(String(error && error.stack || error));
}
document.getElementById("lorabind-result").textContent = JSON.stringify(result, null, 1);
document.body.dataset.done = "1";
