/*
 * What a sampling contract says, in words, and where the sampler's widgets disagree with one (lorabind.js draws
 * these lines on the badges). Pure functions of the contract dicts the server sends:
 *
 *   Contract = { source: str, kind: str, steps: int|null, shift: number|null, cfg: number|null,
 *                tasks: [str]|null, declared_by: "file name"|"metadata"|"checkpoint"|"", note: str }
 *              (loaders.dispatch.contract_discovery.contract_to_dict; MiniMax-H3's contract_dict names the shift
 *              `flow_shift`, read as an alias; other keys are ignored)
 *   Accounting = { lora: str, component: str, counts: { applied: int, expected_unmatched: int, unmatched: int } }
 *
 * No registerExtension here: the frontend loads this file as an extension too, and it only exports helpers.
 */

export function fmt(value) {
    return typeof value === "number" ? String(Number(value.toFixed(4))) : String(value);
}

function contractShift(contract) {
    return contract.shift ?? contract.flow_shift ?? null;
}

/** "4 steps · shift 5 · cfg 1 · tasks t2v,i2v" — only the fields given. */
export function constraintWords({ steps, shift, cfg, tasks }) {
    const parts = [];
    if (steps != null) parts.push(`${steps} steps`);
    if (shift != null) parts.push(`shift ${fmt(shift)}`);
    if (cfg != null) parts.push(`cfg ${fmt(cfg)}`);
    if (tasks && tasks.length) parts.push(`tasks ${tasks.join(",")}`);
    return parts.length ? parts.join(" · ") : "no constraint";
}

/** "x.safetensors (distill): 4 steps · shift 5 · cfg 1 — from its file name" */
export function describeContract(contract) {
    const what = constraintWords({ ...contract, shift: contractShift(contract) });
    const origin = contract.declared_by ? ` — from its ${contract.declared_by}` : "";
    const note = contract.note ? ` (${contract.note})` : "";
    return `${contract.source} (${contract.kind}): ${what}${origin}${note}`;
}

export function describeAccounting(entry) {
    const counts = entry.counts || {};
    return `${entry.lora} → ${entry.component}: ${counts.applied ?? 0} applied, ` +
        `${counts.expected_unmatched ?? 0} expected-unmatched, ${counts.unmatched ?? 0} unmatched`;
}

const CONTRACT_FIELDS = { steps: (c) => c.steps, shift: contractShift, cfg: (c) => c.cfg };

/** What every contract asks together: the first value of each field, the tasks they all allow, and a line for
 * each field two artifacts disagree on (the sampler refuses such a pair whatever its widgets say). */
export function combineContracts(contracts) {
    const combined = { conflicts: [] };
    const declaredBy = {};
    for (const contract of contracts) {
        for (const [field, read] of Object.entries(CONTRACT_FIELDS)) {
            const value = read(contract);
            if (value == null) continue;
            if (combined[field] == null) {
                combined[field] = value;
                declaredBy[field] = contract.source;
            } else if (Math.abs(Number(value) - Number(combined[field])) > 1e-6) {
                combined.conflicts.push(`${contract.source} declares ${field} ${fmt(value)}, ` +
                    `${declaredBy[field]} ${fmt(combined[field])}`);
            }
        }
        if (contract.tasks && contract.tasks.length) {
            combined.tasks = combined.tasks ? combined.tasks.filter((t) => contract.tasks.includes(t))
                : [...contract.tasks];
        }
    }
    return combined;
}

/** Mismatches between the sampler's widgets and one contract: { widget name: [user-facing line] }. */
export function contractMismatches(values, contract) {
    const problems = {};
    const add = (widget, line) => (problems[widget] = problems[widget] || []).push(line);
    const { steps, shift, cfg, cfg_low_noise: cfgLow, audio_flow_shift: audioShift } = values;
    // steps 0 means "the step count the connected contract declares"
    if (contract.steps != null && steps != null && Number(steps) !== 0 && Number(steps) !== Number(contract.steps)) {
        add("steps", `steps ${steps} ≠ ${contract.steps} required by ${contract.source}`);
    }
    // A MiniMax-H3 contract (worded with flow_shift) fills in a shift the request leaves at 0; Wan and
    // Qwen-Image contracts check the shift as given.
    const zeroTakesContract = contract.flow_shift !== undefined;
    const shifts = [["shift", shift, contractShift(contract), zeroTakesContract],
        ["audio_flow_shift", audioShift, contract.audio_flow_shift, true]];
    for (const [widget, value, required, zeroOmits] of shifts) {
        if (required == null || value == null || (zeroOmits && Number(value) <= 0)) continue;
        if (Math.abs(Number(value) - Number(required)) > 1e-6) {
            add(widget, `${widget} ${fmt(Number(value))} ≠ ${fmt(required)} required by ${contract.source}`);
        }
    }
    if (contract.cfg != null) {
        for (const [widget, value] of [["cfg", cfg], ["cfg_low_noise", cfgLow]]) {
            if (value == null || (widget === "cfg_low_noise" && Number(value) === 0)) continue; // 0: cfg for both
            if (Math.abs(Number(value) - Number(contract.cfg)) > 1e-6) {
                add(widget, `${widget} ${fmt(Number(value))} ≠ ${fmt(contract.cfg)} required by ${contract.source}`);
            }
        }
    }
    return problems;
}
