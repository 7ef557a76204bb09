// The tests' driver of the real llama.cpp (node-llama-cpp 3.21.1, its
// prebuilt CPU build; installed by scripts/install-llama.sh into
// $FKVF_NODE_DIR, default build-deps/node under the repository root).
// One sequence, 1 thread, fixed context and batch sizes, token ids only
// (no tokenizer). Every command prints one JSON object on stdout.
//
// usage: node driver.mjs COMMAND --model M.gguf [--kv f16|f32] [--flash 0|1]
//                        [--ctx 256] [--batch 256] ARGS
//   save   --prompt IDS --state OUT [--at L1,L2,...]
//          evaluate the prompt, llama_state_seq_save_file; with --at, evaluate
//          it up to each length in turn and save each time, to OUT.L1, ...
//   resave --state IN --out OUT         load the state and save it again
//   resume --state FILE --next ID --n N load the state, feed ID, N greedy steps
//   run    --prompt IDS --next ID --n N the same without the save and load
//   nll    [--state FILE | --prompt IDS] --tokens IDS
//          teacher-forced: feed the tokens after the state or prompt (or from
//          an empty sequence); the mean NLL (natural log) of tokens[1..] (a
//          state has no logits for tokens[0])
//   sample --n N --seed S [--temperature T]
//          N tokens sampled from BOS (for making fixed prompts)
//   check                               only whether node-llama-cpp is installed
//                                       (exit 77 if not)
// or: node driver.mjs batch FILE: one command a line, "OUT COMMAND ARGS...",
// each on a fresh context of one process (the model loaded once), its JSON
// written to the file OUT (loading node-llama-cpp takes seconds; a command
// on these models, a fraction of one).
// IDS is a comma list of token ids. resume and run print, per step (the fed
// token, then each greedy token fed), the greedy next token, its probability
// as the hex of its float64 and the sha256 of the whole next-token
// distribution (token id u32 LE, probability f64 LE, by token id): two runs
// print the same JSON only when the distributions are bit-identical.
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const SKIP = 77;
const here = path.dirname(fileURLToPath(import.meta.url));
const nodeDir = process.env.FKVF_NODE_DIR || path.resolve(here, "..", "..", "build-deps", "node");

function fail(msg, code = 2) {
    process.stderr.write(`driver: ${msg}\n`);
    process.exit(code);
}

function parseArgs(argv) {
    const o = { cmd: argv[0], kv: "f16", flash: "0", ctx: "256", batch: "256", n: "20" };
    for (let i = 1; i < argv.length; i++) {
        const a = argv[i];
        if (!a.startsWith("--") || i + 1 >= argv.length)
            fail(`bad argument '${a}'`);
        o[a.slice(2)] = argv[++i];
    }
    return o;
}

function ids(s, what) {
    if (s == null || s === "")
        fail(`--${what} missing`);
    return s.split(",").map((t) => {
        if (!/^[0-9]+$/.test(t))
            fail(`--${what}: '${t}' is not a token id`);
        return Number(t);
    });
}

function int(s, what) {
    if (s == null || !/^[0-9]+$/.test(s))
        fail(`--${what}: '${s}' is not a number`);
    return Number(s);
}

// The installed package's entry point, or the skip when it is not there.
function findLib() {
    const dir = path.join(nodeDir, "node_modules", "node-llama-cpp");
    if (!existsSync(path.join(dir, "package.json")))
        fail(`node-llama-cpp is not installed in ${nodeDir} (scripts/install-llama.sh installs it)`, SKIP);
    if (Number(process.versions.node.split(".")[0]) < 20)
        fail(`node ${process.version} is older than 20, which node-llama-cpp needs`, SKIP);
    return pathToFileURL(path.join(dir, "dist", "index.js")).href;
}

// The distribution as bytes by token id, hashed; the selected token's
// probability as the hex of its float64.
function digest(probs, token) {
    const entries = [...probs.entries()].sort((a, b) => a[0] - b[0]);
    const buf = Buffer.alloc(entries.length * 12);
    entries.forEach(([t, p], i) => {
        buf.writeUInt32LE(t, i * 12);
        buf.writeDoubleLE(p, i * 12 + 4);
    });
    const pb = Buffer.alloc(8);
    pb.writeDoubleBE(probs.get(token) ?? 0);
    return { token, p: probs.get(token) ?? 0, p_hex: pb.toString("hex"),
        n: entries.length, sha256: createHash("sha256").update(buf).digest("hex") };
}

// argmax of the distribution (lowest id on ties), checked against the
// sampler's greedy choice
function argmax(probs) {
    let best = -1, bp = -1;
    for (const [t, p] of probs)
        if (p > bp || (p === bp && t < best)) { best = t; bp = p; }
    return best;
}

let lib, llama;
const models = new Map();

// One command on a context of its own (a fresh one per command, so that the
// commands of a batch do not share a cache), its result as an object.
async function command(o) {
    if (!o.model || !existsSync(o.model))
        fail(`--model: '${o.model}' not found`);
    if (o.kv !== "f16" && o.kv !== "f32")
        fail(`--kv: '${o.kv}' (f16 or f32)`);
    if (o.flash !== "0" && o.flash !== "1")
        fail(`--flash: '${o.flash}' (0 or 1)`);
    if (!models.has(o.model))
        models.set(o.model, await llama.loadModel({ modelPath: o.model, gpuLayers: 0 }));
    const context = await models.get(o.model).createContext({
        contextSize: int(o.ctx, "ctx"), batchSize: int(o.batch, "batch"), sequences: 1,
        threads: 1, flashAttention: o.flash === "1",
        experimentalKvCacheKeyType: o.kv.toUpperCase(), experimentalKvCacheValueType: o.kv.toUpperCase(),
    });
    const seq = context.getSequence();
    const greedy = { token: true, probabilities: true, options: { temperature: 0 } };
    const prefix = async () => { // the state file or the prompt into the sequence
        if (o.state != null && o.prompt != null)
            fail("--state and --prompt together");
        if (o.state != null) {
            await seq.loadStateFromFile(o.state, { acceptRisk: true });
        } else if (o.prompt != null) {
            await seq.evaluateWithoutGeneratingNewTokens(ids(o.prompt, "prompt"));
        }
        return seq.contextTokens.length;
    };
    const steps = async () => { // feed --next, then --n greedy tokens
        const out = [];
        let tok = int(o.next, "next");
        for (let i = 0; i <= int(o.n, "n"); i++) {
            const [r] = await seq.controlledEvaluate([[tok, { generateNext: greedy }]]);
            const next = r.next.token;
            if (next !== argmax(r.next.probabilities))
                fail(`step ${i}: greedy token ${next} is not the argmax ${argmax(r.next.probabilities)}`, 1);
            out.push(digest(r.next.probabilities, next));
            tok = next;
        }
        return out;
    };
    let res;
    try {
        switch (o.cmd) {
        case "save": {
            if (o.state == null)
                fail("--state missing");
            const p = ids(o.prompt, "prompt");
            const at = o.at != null ? ids(o.at, "at") : [p.length];
            res = { saves: [] };
            let done = 0;
            for (const len of at) {
                if (len <= done || len > p.length)
                    fail(`--at: ${len} is not after ${done} and within the prompt's ${p.length}`);
                await seq.evaluateWithoutGeneratingNewTokens(p.slice(done, len));
                done = len;
                const file = o.at != null ? `${o.state}.${len}` : o.state;
                const { fileSize } = await seq.saveStateToFile(file);
                res.saves.push({ file, tokens: seq.contextTokens.length, file_bytes: fileSize });
            }
            break;
        }
        case "resave": { // llama.cpp's own reading and writing of a state file
            if (o.state == null || o.out == null)
                fail("--state and --out needed");
            const n = await prefix();
            const { fileSize } = await seq.saveStateToFile(o.out);
            res = { tokens: n, file_bytes: fileSize };
            break;
        }
        case "resume":
            if (o.state == null)
                fail("--state missing");
            // fall through
        case "run": {
            const n = await prefix();
            const s = await steps();
            res = { context_tokens: n, ids: s.map((x) => x.token), steps: s };
            break;
        }
        case "nll": {
            const n = await prefix();
            const toks = ids(o.tokens, "tokens");
            if (toks.length < 2)
                fail("--tokens: at least 2");
            const items = toks.map((t, i) => (i + 1 < toks.length
                ? [t, { generateNext: { probabilities: true, options: { temperature: 0 } } }] : t));
            const r = await seq.controlledEvaluate(items);
            let sum = 0;
            for (let i = 1; i < toks.length; i++) {
                const p = r[i - 1].next.probabilities.get(toks[i]);
                if (!(p > 0))
                    fail(`token ${i} (${toks[i]}): probability ${p}`, 1);
                sum -= Math.log(p);
            }
            res = { context_tokens: n, scored: toks.length - 1, mean_nll: sum / (toks.length - 1) };
            break;
        }
        case "sample": {
            const out = [];
            let tok = 1;
            const opt = { token: true, options: { temperature: Number(o.temperature ?? "1"), seed: int(o.seed, "seed"),
                topK: 0, topP: 1, minP: 0 } };
            for (let i = 0; i < int(o.n, "n"); i++) {
                const [r] = await seq.controlledEvaluate([[tok, { generateNext: opt }]]);
                tok = r.next.token;
                out.push(tok);
            }
            res = { ids: out };
            break;
        }
        default:
            fail(`unknown command '${o.cmd}'`);
        }
    } finally {
        await context.dispose();
    }
    return res;
}

// one step per line, so that a diff of two outputs points at the step
const format = (res) => JSON.stringify(res).replace(/\},\{"token"/g, '},\n{"token"') + "\n";

async function main() {
    const argv = process.argv.slice(2);
    if (argv.length === 0)
        fail("usage: driver.mjs COMMAND --model M.gguf [options] | batch FILE");
    const href = findLib();
    if (argv[0] === "check") {
        console.log(JSON.stringify({ ok: true, node_dir: nodeDir }));
        return;
    }
    let failed = 0;
    lib = await import(href);
    llama = await lib.getLlama({ gpu: false, build: "never", logLevel: lib.LlamaLogLevel.error,
        maxThreads: 1, progressLogs: false });
    if (argv[0] === "batch") {
        if (argv.length !== 2)
            fail("usage: driver.mjs batch FILE");
        const lines = readFileSync(argv[1], "utf8").split("\n");
        for (let i = 0; i < lines.length; i++) {
            const w = lines[i].trim().split(/\s+/);
            if (w[0] === "" || w[0].startsWith("#"))
                continue;
            if (w.length < 2)
                fail(`${argv[1]}:${i + 1}: 'OUT COMMAND ARGS...' expected`);
            try {
                writeFileSync(w[0], format(await command(parseArgs(w.slice(1)))));
            } catch (e) { // reported, and the batch goes on
                process.stderr.write(`driver: ${argv[1]}:${i + 1}: ${w.slice(1).join(" ")}: ${e}\n`);
                failed++;
            }
        }
    } else {
        process.stdout.write(format(await command(parseArgs(argv))));
    }
    for (const m of models.values())
        await m.dispose();
    await llama.dispose();
    if (failed > 0)
        fail(`${failed} command(s) of ${argv[1]} failed`, 1);
}

main().catch((e) => fail(e && e.stack ? e.stack : String(e), 1));
