# %% [markdown]
# # Save a PyTorch KV cache, restart, restore, continue
#
# A notebook-style script (cells marked `# %%`; it also runs top to bottom with
# `/usr/bin/python3 save_restore.py`). It shows the whole FKVF workflow on a real model,
# shakespeare-hd64 (a small byte-level Llama, head dim 64, tinyllama.py) in PyTorch:
#
#   1. run the model over a prompt of real text it never saw: its KV cache, in the
#      Hugging Face layout (a list of (k, v) per layer, [1, H, T, D], keys after RoPE);
#   2. train a shared codebook on caches of training text (fkvf.train) and archive the
#      prompt's cache with it (fkvf.pack): sinks and a recent window stay exact, the
#      positions between are stored as codebook indices;
#   3. "restart": a fresh process, which has only the archive and the model, opens it
#      (fkvf.open), reads the cache (Archive.read(layout="hf")) as torch tensors and
#      continues the text;
#   4. compare with the exact cache: next-token NLL over the real continuation, and
#      how often the argmax agrees;
#   5. plot the relative reconstruction error per layer of K and V to a PNG.
#
# Run it from the source tree after building (cmake --build build), with Debian's
# Python, which has NumPy, PyTorch and matplotlib:
#
#     /usr/bin/python3 examples/python/save_restore.py [--out-dir DIR] [--model M.bin]
#
# It finds the package in python/ and libfkvf in build/ when fkvf is not installed
# (FKVF_LIBRARY names another libfkvf.so). Exit status 77: the model or a package it
# needs is missing (said on stderr).

# %% [0] Setup: arguments, packages, the model
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True                        # no __pycache__ in the source tree
# this file (in a notebook kernel, which has no __file__: run from examples/python)
SCRIPT = os.path.abspath(globals().get("__file__", "save_restore.py"))
HERE = os.path.dirname(SCRIPT)
SRC = os.path.dirname(os.path.dirname(HERE))          # the source tree


def skip(message):
    """Exit 77 (what ctest counts as skipped) with a message."""
    print(f"save_restore.py: SKIPPED: {message}", file=sys.stderr)
    sys.exit(77)


def default_models():
    return os.environ.get("FKVF_MODELS") or os.path.join(os.path.dirname(SRC), "shared",
                                                         "models")


parser = argparse.ArgumentParser(description="Save a PyTorch KV cache to FKVF, restart, "
                                 "restore, continue, compare (examples/python/README.md)")
parser.add_argument("--model", help="llama2.c checkpoint (default: FKVF_MODELS or "
                    "../shared/models next to the source tree, shakespeare-hd64.bin)")
parser.add_argument("--text", help="the text (default: shakespeare.txt next to the model)")
parser.add_argument("--out-dir", help="where the archives, the PNG and results.json go "
                    "(default: a new temporary directory, printed at the end)")
parser.add_argument("--prompt-bytes", type=int, default=192,
                    help="bytes of evaluation text in the prompt (192)")
parser.add_argument("--continue-bytes", type=int, default=64,
                    help="bytes generated and scored after it (64)")
parser.add_argument("--passages", type=int, default=16,
                    help="training passages for the codebook (16)")
parser.add_argument("--k", type=int, default=64, help="centroids per codebook stage (64)")
parser.add_argument("--sinks", type=int, default=4, help="leading exact positions (4)")
parser.add_argument("--recent", type=int, default=32, help="trailing exact positions (32)")
parser.add_argument("--seed", type=int, default=0, help="where the training passages are")
parser.add_argument("--restore", action="store_true",
                    help="(internal) be the fresh process of cell 3")
# a notebook kernel has arguments of its own: the defaults then
ARGS = parser.parse_known_args()[0] if "ipykernel" in sys.modules else parser.parse_args()

try:
    import matplotlib
    import numpy as np
    import torch
except ImportError as e:
    skip(f"{sys.executable} has no {e.name} (Debian: python3-numpy, python3-torch, "
         "python3-matplotlib; scripts/install-deps.sh)")
matplotlib.use("Agg")            # PNG files, no display
try:
    import fkvf
except ImportError:
    # not installed: the package of the source tree (which finds build/libfkvf)
    sys.path.insert(0, os.path.join(SRC, "python"))
    import fkvf
sys.path.insert(0, HERE)
import tinyllama  # noqa: E402  (the model, next to this file)

torch.set_num_threads(1)         # one core, and the same sums in both processes
MODEL = ARGS.model or os.path.join(default_models(), "shakespeare-hd64.bin")
TEXT = ARGS.text or os.path.join(os.path.dirname(MODEL), "shakespeare.txt")
for path in (MODEL, TEXT):
    if not os.path.isfile(path):
        skip(f"{path} not found (give --model / --text, or FKVF_MODELS=the models "
             "directory)")
OUT = ARGS.out_dir or tempfile.mkdtemp(prefix="fkvf-example-")
os.makedirs(OUT, exist_ok=True)
ARCHIVE = os.path.join(OUT, "prompt.fkvf")        # codebook indices + exact sinks/recent
EXACT = os.path.join(OUT, "exact.fkvf")           # every position exact: the reference
CODEBOOK = os.path.join(OUT, "shakespeare.fkvc")  # shared codebook file
model = tinyllama.load(MODEL)
cfg = model.cfg
if ARGS.prompt_bytes < 1 or ARGS.continue_bytes < 1 or \
        ARGS.prompt_bytes + ARGS.continue_bytes > cfg.seq_len:
    parser.error(f"--prompt-bytes + --continue-bytes must be 2..{cfg.seq_len}, the "
                 "model's context")

# The model's RoPE, as FKVF describes it: interleaved pairs, theta 10000, all dims.
ROPE = fkvf.Rope(theta=10000, layout="interleaved")

with open(TEXT, "rb") as f:
    text = f.read()
split = len(text) * 9 // 10           # train on the first 90%, evaluate on the rest
split = text.index(b"\n", split) + 1  # from a line start: byte 1,003,854 of shakespeare.txt
prompt_bytes = text[split:split + ARGS.prompt_bytes]
real_next = tinyllama.text_ids(
    text[split + ARGS.prompt_bytes:split + ARGS.prompt_bytes + ARGS.continue_bytes])
prompt_ids = [tinyllama.BOS] + tinyllama.text_ids(prompt_bytes)
T = len(prompt_ids)


def resume(cache, ids):
    """How the cache of the tokens ids is continued: its first len(ids) - 1 positions as
    the past and the last token fed again, which gives the next token's logits (Hugging
    Face's generate() does the same with past_key_values)."""
    n = len(ids) - 1
    return [(k[:, :, :n], v[:, :, :n]) for k, v in cache], int(ids[-1])


def continuation(cache, ids):
    """Greedy text after the cache of the tokens ids, and the teacher-forced log-probs [N]
    of the real continuation with the logits [N, vocab] that gave them."""
    past, last = resume(cache, ids)
    picks, _, _ = model.greedy([last], ARGS.continue_bytes, past)
    logp, logits = model.score([last] + real_next[:-1], real_next, past)
    return picks, logp, logits


# %% [R] The fresh process of cell 3 (defined here, started by cell 3)
# This is everything the restarted process does: it knows nothing of the first one's
# memory, only the archives on disk (and the model, to continue the text).
def restart():
    t0 = time.perf_counter()
    with fkvf.open(ARCHIVE) as a:        # the codebook file is found by its content hash
        a.verify()
        ids = [int(t) for t in a.tokens]   # the prompt, as the archive stored it
        if ids != prompt_ids:
            sys.exit(f"{ARCHIVE}: its tokens are not the prompt's")
        restored = [(torch.from_numpy(k), torch.from_numpy(v))
                    for k, v in a.read(layout="hf", dtype=np.float32)]
        exact_at = np.array([a.is_exact(t) for t in range(a.n_positions)])
        stored = a.descriptor["dtype"]   # the element type the exact rows are kept in
    with fkvf.open(EXACT) as a:
        exact = [(torch.from_numpy(k), torch.from_numpy(v))
                 for k, v in a.read(layout="hf", dtype=np.float32)]
    print(f"[restart] read {T} positions of {len(restored)} layers in "
          f"{time.perf_counter() - t0:.3f} s; {int((~exact_at).sum())} archived")
    picks, logp_r, logits_r = continuation(restored, ids)
    print("[restart] continues:", repr(tinyllama.ids_text(picks)))
    _, logp_e, logits_e = continuation(exact, ids)
    # archived positions only: how far the restored keys and values are from the exact ones
    arch = torch.from_numpy(~exact_at)
    err = {"k": [], "v": []}
    for (kr, vr), (ke, ve) in zip(restored, exact):
        for part, r, e in (("k", kr, ke), ("v", vr, ve)):
            r, e = r[:, :, arch], e[:, :, arch]
            err[part].append(float(torch.linalg.norm(r - e) / torch.linalg.norm(e)))
    # the sinks and recent rows are the exact cache's, rounded to the archive's dtype
    rounded = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[stored]
    exact_rows_equal = all(torch.equal(r[:, :, ~arch], e[:, :, ~arch].to(rounded).float())
                           for pr, pe in zip(restored, exact) for r, e in zip(pr, pe))
    result = {
        "continuation": tinyllama.ids_text(picks),
        "nll_restored": float(-logp_r.mean()), "nll_exact": float(-logp_e.mean()),
        "argmax_agreement": float((logits_r.argmax(-1) == logits_e.argmax(-1))
                                  .double().mean()),
        "archived": int((~exact_at).sum()), "rel_error_k": err["k"], "rel_error_v": err["v"],
        "exact_rows_equal": bool(exact_rows_equal)}
    with open(os.path.join(OUT, "restart.json"), "w") as f:
        json.dump(result, f, indent=1)


if ARGS.restore:
    restart()
    sys.exit(0)

# %% [1] Run the model over a prompt of real text
# BOS, then the first prompt-bytes bytes of the evaluation part (text the model never
# saw). The cache is the model's own Hugging Face-layout list of (k, v).
t0 = time.perf_counter()
logits, cache = model.forward(torch.tensor(prompt_ids))
print(f"[1] prompt: {T} positions ({repr(prompt_bytes[:60].decode('utf-8', 'replace'))}...), "
      f"{len(cache)} layers of k, v {tuple(cache[0][0].shape)}, "
      f"{time.perf_counter() - t0:.2f} s")
live_picks, live_logp, _ = continuation(cache, prompt_ids)
print("[1] the live process would continue:", repr(tinyllama.ids_text(live_picks)))
# the same NLL in one pass over prompt + continuation, with no cache handed over
one_pass = model.score(prompt_ids + real_next[:-1], prompt_ids[1:] + real_next)[0][-len(real_next):]

# %% [2] Train a shared codebook and archive the prompt's cache
# The codebook is trained on caches of passages from the first 90% of the text (what a
# deployment would do once per model), saved as its own file, and shared by every
# archive: the archive refers to it by content hash and holds only indices. Keys are
# archived before RoPE (keys="pre-rope", the default): the library un-rotates them with
# the model's RoPE, which must be described to it (interleaved pairs here, unlike the
# half-split pairs of Hugging Face's Llama), and rotates them back on read.
t0 = time.perf_counter()
rng = np.random.default_rng(ARGS.seed)
train_caches = []
for start in rng.integers(0, split - ARGS.prompt_bytes, ARGS.passages):
    passage = text[int(start):int(start) + ARGS.prompt_bytes]
    train_caches.append(model.forward(torch.tensor([tinyllama.BOS] +
                                                   tinyllama.text_ids(passage)))[1])
trained = fkvf.train(train_caches, CODEBOOK, k=ARGS.k, k_stages=4, v_stages=2,
                     rope=ROPE, overwrite=True)
print(f"[2] codebook: {trained['n_caches']} passages x {T} positions, k = {trained['k']}, "
      f"{trained['bytes']:,} bytes, content hash {trained['content_hash'][:16]}..., "
      f"{time.perf_counter() - t0:.2f} s")
packed = fkvf.pack(cache, ARCHIVE, codebooks=CODEBOOK, sinks=ARGS.sinks,
                   recent=ARGS.recent, tokens=prompt_ids, rope=ROPE, dtype="f16",
                   overwrite=True)
print(f"[2] {ARCHIVE}: {packed['bytes']:,} bytes for {packed['fp16_bytes']:,} bytes of fp16 "
      f"cache, {packed['ratio_fp16']:.2f}x smaller (the shared codebook file not counted); "
      f"{packed['archived']} positions archived, the {ARGS.sinks} sinks and "
      f"{ARGS.recent} recent exact")
# The reference for cell 4: the same cache with every position exact, in float32 (no
# codebook; bit-identical on read). A lossless archive is also how a cache is saved when
# no quality may be lost.
fkvf.pack(cache, EXACT, sinks=T, recent=0, tokens=prompt_ids, rope=ROPE, dtype="f32",
          overwrite=True)
print(f"[2] {EXACT}: {os.path.getsize(EXACT):,} bytes, every position exact "
      "(float32, as the model computes it: twice the fp16 bytes)")
del cache, train_caches       # what follows has only the files

# %% [3] Restart: a fresh process restores the cache and continues the text
t0 = time.perf_counter()
argv = [sys.executable, SCRIPT, "--restore", "--out-dir", OUT,
        "--model", MODEL, "--text", TEXT, "--prompt-bytes", str(ARGS.prompt_bytes),
        "--continue-bytes", str(ARGS.continue_bytes)]
subprocess.run(argv, check=True)
with open(os.path.join(OUT, "restart.json")) as f:
    restored = json.load(f)
print(f"[3] the fresh process took {time.perf_counter() - t0:.2f} s")

# %% [4] Compare: next-token NLL on the real continuation, exact vs restored cache
nll_live = float(-live_logp.mean())
print(f"[4] NLL over the {len(real_next)} real next bytes (nats/byte):")
print(f"      live cache, this process   {nll_live:.6f}  (one pass, no cache: "
      f"{float(-one_pass.mean()):.6f})")
print(f"      exact archive, restarted   {restored['nll_exact']:.6f}")
print(f"      codebook archive, restarted {restored['nll_restored']:.6f}  "
      f"({100 * (np.exp(restored['nll_restored'] - restored['nll_exact']) - 1):+.2f}% "
      "perplexity)")
print(f"      argmax agreement {100 * restored['argmax_agreement']:.1f}%; the sinks and "
      f"recent rows read back {'equal' if restored['exact_rows_equal'] else 'DIFFERENT'}")

# %% [5] Plot the relative reconstruction error per layer (archived positions only)
import matplotlib.pyplot as plt  # noqa: E402  (the Agg backend, chosen in cell 0)

layers = np.arange(cfg.n_layers)
fig, ax = plt.subplots(figsize=(6, 3.5))
for shift, part, label in ((-0.2, "k", "K (after RoPE)"), (0.2, "v", "V")):
    bars = ax.bar(layers + shift, restored[f"rel_error_{part}"], width=0.4, label=label)
    ax.bar_label(bars, fmt="%.3f", fontsize=7)
ax.set_xticks(layers)
ax.set_xlabel("layer")
ax.set_ylabel("||restored - exact|| / ||exact||")
ax.set_title(f"{os.path.basename(MODEL)}: K x4 V x2 stages, k = {ARGS.k}, "
             f"{restored['archived']} archived positions", fontsize=9)
ax.legend()
fig.tight_layout()
PNG = os.path.join(OUT, "reconstruction_error.png")
fig.savefig(PNG, dpi=100)
results = {"nll_live": nll_live, "nll_one_pass": float(-one_pass.mean()),
           "bytes": packed["bytes"], "ratio_fp16": packed["ratio_fp16"], "png": PNG,
           **restored}
with open(os.path.join(OUT, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"[5] {PNG}\nEverything is in {OUT}")
