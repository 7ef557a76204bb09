// Real llama.cpp state files for bench/llama_state.sh, through node-llama-cpp.
//
//   node bench/llama_save.mjs NODE_MODULES sample MODEL SEED N OUT.ids
//       N token ids: BOS (1) then N-1 tokens sampled from MODEL at
//       temperature 1 with SEED, written one per line.
//   node bench/llama_save.mjs NODE_MODULES save MODEL FLASH CTX OUT IDS [OUT IDS ...]
//       For each pair: a fresh context of CTX cells (f16 K and V, flash
//       attention off for FLASH 0, on for 1, 1 thread) evaluates the ids in
//       the file IDS (whitespace-separated) and saves the sequence with
//       saveStateToFile (llama_state_seq_save_file) to OUT.
//
// NODE_MODULES is the node_modules directory that holds node-llama-cpp.
// Exit 77 when node-llama-cpp is not there, 1 on any other failure.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function fail(msg) {
    process.stderr.write(`llama_save.mjs: ${msg}\n`);
    process.exit(1);
}

const [nodeModules, cmd, ...args] = process.argv.slice(2);
if (!nodeModules || !cmd)
    fail("usage: llama_save.mjs NODE_MODULES sample|save ...");
const entry = join(nodeModules, "node-llama-cpp", "dist", "index.js");
if (!existsSync(entry)) {
    process.stderr.write(`llama_save.mjs: node-llama-cpp not installed (no ${entry})\n`);
    process.exit(77);
}
const { getLlama } = await import(pathToFileURL(entry).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });

async function context(model, flash, ctx) {
    return model.createContext({
        contextSize: ctx,
        batchSize: ctx,
        threads: 1,
        flashAttention: flash,
        experimentalKvCacheKeyType: "F16",
        experimentalKvCacheValueType: "F16",
    });
}

if (cmd === "sample") {
    const [modelPath, seedArg, nArg, out] = args;
    const seed = Number(seedArg), n = Number(nArg);
    if (!out || !(n >= 1)) fail("usage: sample MODEL SEED N OUT.ids");
    const model = await llama.loadModel({ modelPath });
    const ctx = await context(model, false, Math.max(256, n + 1));
    const seq = ctx.getSequence();
    const ids = [1];
    if (n > 1) {
        for await (const t of seq.evaluate([1], { temperature: 1, seed })) {
            ids.push(t);
            if (ids.length >= n) break;
        }
    }
    if (ids.length !== n) fail(`sampled ${ids.length} ids, wanted ${n}`);
    writeFileSync(out, ids.join("\n") + "\n");
    await ctx.dispose();
    await model.dispose();
} else if (cmd === "save") {
    const [modelPath, flashArg, ctxArg, ...pairs] = args;
    const ctxSize = Number(ctxArg);
    if (!(flashArg === "0" || flashArg === "1") || !(ctxSize > 0) || pairs.length === 0 ||
        pairs.length % 2 !== 0)
        fail("usage: save MODEL FLASH(0|1) CTX OUT IDS [OUT IDS ...]");
    const model = await llama.loadModel({ modelPath });
    for (let i = 0; i < pairs.length; i += 2) {
        const out = pairs[i];
        const ids = readFileSync(pairs[i + 1], "utf8").trim().split(/\s+/).map(Number);
        if (ids.length === 0 || ids.length > ctxSize || ids.some((x) => !Number.isInteger(x)))
            fail(`${pairs[i + 1]}: want 1..${ctxSize} integer ids, got ${ids.length}`);
        const ctx = await context(model, flashArg === "1", ctxSize);
        if (ctx.flashAttention !== (flashArg === "1"))
            fail(`flash attention is ${ctx.flashAttention}, asked for ${flashArg}`);
        const seq = ctx.getSequence();
        await seq.evaluateWithoutGeneratingNewTokens(ids);
        await seq.saveStateToFile(out);
        await ctx.dispose();
    }
    await model.dispose();
} else {
    fail(`unknown command ${cmd}`);
}
