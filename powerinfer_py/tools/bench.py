"""Speed and memory benchmark: our engine against llama.cpp on the same GGUF file, same threads, same tokens.

Each measurement runs in its own child process (`python -m powerinfer_py.tools.bench --engine ours|llamacpp ...`,
which prints one JSON object), so the two engines never share caches, thread pools or heap, and the child's
peak resident set size is that engine's alone (VmHWM of /proc/self/status: getrusage's ru_maxrss would also
count the parent's resident set at the spawn, which Linux carries over the exec). The parent alternates the engines
rep by rep, so slow drifts of the machine (thermal, other load) hit both alike, and reports medians.

What one child measures, identically for both engines:
  prompt: one batched forward of n_prompt tokens (a fixed English text, tokenized by llama.cpp's tokenizer
          and repeated or cut to n_prompt), logits of the last position only;
  decode: n_gen single-token forwards, each fed the argmax of the previous logits (no sampler, no text).
A warm-up runs first in both: the whole prompt once, then a 1-token step, then a fresh cache (llama-bench also
warms up before it measures). A whole-prompt warm-up matters for mixture-of-experts files: a short one touches
only the experts its few tokens are routed to, and the measured prompt would then also page in the rest of a
memory-mapped file, which llama.cpp reads at load (its load time shows that, ours shows less).

Sparse models: our engine runs in the chosen sparse mode (ffn.py: predictor, exact, off; default predictor
for PWRI files) and reports the mean fraction of neurons active per decoded token. llama.cpp cannot read PWRI
files, so it runs `llamacpp_model` (the dense GGUF twin of the same weights) when given; for a PWRI file
without one, only our engine is measured.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import PowerInferError
from ..kernels.cpus import usable_cpus
from ..layers.ffn import MODES as SPARSE_MODES, PREDICTOR_TYPES

ENGINES = ("ours", "llamacpp")
RSS_SLACK_BYTES = 200 * 1024 * 1024  # the memory budget: file size + KV cache + 200 MB
CHILD_TIMEOUT_S = 1800

# Natural text, so a tokenizer yields ordinary ids (matters once sparse models skip inactive neurons).
BENCH_TEXT = (
    "The history of the printing press begins in the fifteenth century, when metal movable type made it "
    "possible to reproduce books quickly and cheaply. Before that, manuscripts were copied by hand, a slow "
    "process that kept written knowledge in the hands of a few. Within fifty years presses were working in "
    "hundreds of towns across Europe, and millions of volumes had been printed. Scholars could now compare "
    "identical copies of a text, merchants could circulate price lists, and reformers could spread pamphlets "
    "faster than authorities could suppress them. The change was not only technical but social: reading "
    "became a private habit, vernacular languages gained standard spellings, and the idea of an author as the "
    "owner of a work slowly took shape. "
)


@dataclass
class EngineRun:
    """One child's measurement. Times in seconds, memory in bytes."""

    engine: str
    n_prompt: int
    n_gen: int
    threads: int
    load_s: float
    prompt_s: float
    decode_s: float
    peak_rss: int
    kv_bytes: int  # our KV cache for n_prompt + n_gen positions (0 for llama.cpp: not exposed)
    file_size: int
    prompt_digest: int  # sum of position-weighted prompt ids: both engines must have fed the same tokens
    sparse: str = ""  # our sparse mode ("" for llama.cpp)
    active_fraction: float | None = None  # ours, ReLU-family models: mean fraction of active neurons in decode
    predictor_share: float | None = None  # ours, predictor mode in its C step: the predictor's share of decode time
    wide_skipped: list | None = None  # ours, wide mode: per projection input the fraction skipped in decode
    wide_layers: list | None = None  # ours, wide mode: per layer the fraction of projection bytes skipped in decode

    @property
    def prompt_tok_s(self) -> float:
        return self.n_prompt / self.prompt_s if self.prompt_s > 0 else float("nan")

    @property
    def decode_tok_s(self) -> float:
        return self.n_gen / self.decode_s if self.decode_s > 0 else float("nan")


def _fit_tokens(ids: list[int], n: int, bos: int | None) -> list[int]:
    """The text's ids repeated or cut to exactly n tokens, starting with BOS when the model has one."""
    head = [bos] if bos is not None and bos >= 0 else []
    body = [t for t in ids if t != bos] or [0]
    out = list(head)
    while len(out) < n:
        out.extend(body)
    return out[:n]


def _digest(ids: list[int]) -> int:
    return sum((i + 1) * t for i, t in enumerate(ids))


def _peak_rss_bytes() -> int:
    """This process's peak resident set: VmHWM (the high-water mark of its own address space, so a parent
    that held gigabytes when it started us does not count); ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


# ---- child: our engine -------------------------------------------------------------------------------------

def _child_ours(model: Path, n_prompt: int, n_gen: int, threads: int, sparse: str | None = None,
                sparse_threshold: float | None = None, sparsity: float | None = None,
                backend: str = "cpu",
                vram_budget: float | None = None, use_mmap: bool = True,
                predictor_dtype: str = "auto") -> EngineRun:
    from .. import load

    t0 = time.perf_counter()
    llm = load(model, threads=threads, n_ctx=n_prompt + n_gen, sparse=sparse, sparse_threshold=sparse_threshold,
               sparsity=sparsity, backend=backend, vram_budget=vram_budget, use_mmap=use_mmap,
               predictor_dtype=predictor_dtype)
    load_s = time.perf_counter() - t0
    net, tok = llm.model, llm.tokenizer
    ids = _fit_tokens(tok.encode(BENCH_TEXT, add_bos=False), n_prompt, tok.bos_id)

    cache = net.new_cache(n_prompt + n_gen)  # warm-up: touch the weights and code paths once
    net.forward(np.asarray(ids, dtype=np.int32), cache)
    net.forward(np.asarray(ids[:1], dtype=np.int32), cache)

    cache = net.new_cache(n_prompt + n_gen)
    t0 = time.perf_counter()
    logits = net.forward(np.asarray(ids, dtype=np.int32), cache)
    t1 = time.perf_counter()
    if net.sparsity is not None:
        net.sparsity.reset()  # count decode tokens only
    step = np.empty(1, dtype=np.int32)
    before = predictor_seconds(net)
    for _ in range(n_gen):
        step[0] = int(np.argmax(logits))
        logits = net.forward(step, cache)
    t2 = time.perf_counter()
    active = net.sparsity.mean_fraction if net.sparsity is not None else None
    wide = net.sparsity.to_json() if net.sparsity is not None and net.sparsity.mode == "wide" else None
    pred_s = predictor_seconds(net) - before
    return EngineRun("ours", n_prompt, n_gen, threads, load_s, t1 - t0, t2 - t1, _peak_rss_bytes(),
                     int(cache.nbytes), model.stat().st_size, _digest(ids), llm.sparse.mode, active,
                     pred_s / (t2 - t1) if pred_s > 0 and t2 > t1 else None,
                     wide["input_skipped"] if wide else None, wide["layers_skipped"] if wide else None)


def predictor_seconds(net) -> float:
    """Seconds the model's FFN layers have spent in their predictors so far, by the timers of the one-token C
    step (ffn.step_timing_sums; 0 where no layer has one: other modes, batches, the Python path)."""
    from ..layers.ffn import step_timing_sums

    sums = step_timing_sums(getattr(net, "ffns", ()))
    return 0.0 if sums is None else float(sums[1])


# ---- child: llama.cpp through llama-cpp-python's low-level API ----------------------------------------------

# llama.cpp moves some weight types into repacked buffers at load (its CPU_REPACK and, on CPUs with AMX, its
# AMX buffers). On a 2-core Sapphire Rapids class VM its AMX path crashed (SIGSEGV in llama_decode) on the demo
# model and on a Q8_0 MoE file, so whether llama.cpp repacks can be chosen: per LlamaCppRef, or for every one a
# process and its children open with POWERINFER_LLAMACPP_REPACK=0 (the test suite sets it on AMX hosts).
LLAMACPP_REPACK_ENV = "POWERINFER_LLAMACPP_REPACK"


def llamacpp_repack_default() -> bool:
    """Whether llama.cpp loads with its repacked weight buffers (its default) unless told otherwise."""
    return os.environ.get(LLAMACPP_REPACK_ENV, "1").strip() != "0"


def llamacpp_reports_amx() -> bool:
    """Whether this llama.cpp build says it runs AMX kernels (its system info line)."""
    import llama_cpp as L

    return b"AMX_INT8 = 1" in L.llama_print_system_info()


def llamacpp_amx_risk() -> str | None:
    """For benchmarks that open llama.cpp in their own process (a crash there cannot be retried): a warning to
    print where llama.cpp reports AMX and would repack, else None."""
    if not llamacpp_repack_default() or not llamacpp_reports_amx():
        return None
    return (f"llama.cpp reports AMX_INT8 here, and its repacked (AMX) weight buffers have crashed it (SIGSEGV) on "
            f"such hosts; if this run dies, run it again with {LLAMACPP_REPACK_ENV}=0 (llama.cpp is then slower "
            f"than at its default, so its ratios flatter us)")


class LlamaCppRef:
    """A llama.cpp model + context on one file (llama-cpp-python's C API, no high-level wrapper), with the
    calls a benchmark or a reference test needs: tokenize, decode a batch, read logits. close() frees both."""

    def __init__(self, model: str | os.PathLike, n_ctx: int, threads: int, n_batch: int = 512,
                 flash_attn: bool | None = None, repack: bool | None = None):
        """flash_attn: None keeps llama.cpp's default (auto: on for the CPU); False/True force its plain or
        flash attention path (they round differently: the reference tests compare both). repack: False loads
        the weights without llama.cpp's repacked buffers (its --no-repack); None: llamacpp_repack_default()."""
        import llama_cpp as L

        self._L = L
        _quiet_llama_log(L)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        if not (llamacpp_repack_default() if repack is None else repack):
            if not hasattr(mp, "use_extra_bufts"):
                raise PowerInferError("this llama-cpp-python cannot load without repacked buffers "
                                      "(llama_model_params has no use_extra_bufts)")
            mp.use_extra_bufts = False
        self.repack = bool(getattr(mp, "use_extra_bufts", True))
        self.model = L.llama_model_load_from_file(os.fsencode(str(model)), mp)
        if not self.model:
            raise PowerInferError(f"llama.cpp could not load {model}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = max(n_batch, 1)
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        if flash_attn is not None:
            cp.flash_attn_type = 1 if flash_attn else 0
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise PowerInferError(f"llama.cpp could not create a context of {n_ctx} tokens for {model}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_batch = cp.n_batch
        self.n_past = 0

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        L = self._L
        raw = text.encode("utf-8")
        buf = (L.llama_token * (len(raw) + 8))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), add_bos, False)
        if n < 0:
            raise PowerInferError(f"llama.cpp tokenize needs {-n} slots")
        return list(buf[:n])

    @property
    def bos_id(self) -> int:
        return int(self._L.llama_vocab_bos(self.vocab))

    def is_eog(self, token: int) -> bool:
        return bool(self._L.llama_vocab_is_eog(self.vocab, token))

    def decode(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Feed tokens at positions n_past.. (in chunks of n_batch); return f32 [n_vocab] for the last one,
        or [len(tokens), n_vocab] when all_logits."""
        L = self._L
        rows = []
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s:s + self.n_batch]
            last_chunk = s + self.n_batch >= len(tokens)
            batch = L.llama_batch_init(len(chunk), 0, 1)
            try:
                for i, t in enumerate(chunk):
                    batch.token[i] = t
                    batch.pos[i] = self.n_past + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = all_logits or (last_chunk and i == len(chunk) - 1)
                batch.n_tokens = len(chunk)
                rc = L.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise PowerInferError(f"llama_decode failed with code {rc}")
            finally:
                L.llama_batch_free(batch)
            self.n_past += len(chunk)
            if all_logits:
                rows.extend(self._logits(i) for i in range(len(chunk)))
        return np.stack(rows) if all_logits else self._logits(-1)

    def _logits(self, i: int) -> np.ndarray:
        ptr = self._L.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def reset(self) -> None:
        self._L.llama_memory_clear(self._L.llama_get_memory(self.ctx), True)
        self.n_past = 0

    def close(self) -> None:
        if self.ctx:
            self._L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self._L.llama_model_free(self.model)
            self.model = None


_LOG_CB = None  # keep the ctypes callback alive as long as llama.cpp may call it


def _quiet_llama_log(L) -> None:
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(_LOG_CB, None)


def _child_llamacpp(model: Path, n_prompt: int, n_gen: int, threads: int, repack: bool | None = None) -> EngineRun:
    t0 = time.perf_counter()
    ref = LlamaCppRef(model, n_ctx=n_prompt + n_gen + 8, threads=threads, n_batch=max(n_prompt, 32), repack=repack)
    load_s = time.perf_counter() - t0
    ids = _fit_tokens(ref.tokenize(BENCH_TEXT, add_bos=False), n_prompt, ref.bos_id)

    ref.decode(ids)  # warm-up, then a clean cache
    ref.decode(ids[:1])
    ref.reset()

    t0 = time.perf_counter()
    logits = ref.decode(ids)
    t1 = time.perf_counter()
    for _ in range(n_gen):
        logits = ref.decode([int(np.argmax(logits))])
    t2 = time.perf_counter()
    ref.close()
    return EngineRun("llamacpp", n_prompt, n_gen, threads, load_s, t1 - t0, t2 - t1, _peak_rss_bytes(), 0,
                     model.stat().st_size, _digest(ids))


# ---- parent: alternate engines in child processes, summarise -----------------------------------------------

@dataclass
class BenchReport:
    model: str
    threads: int
    n_prompt: int
    n_gen: int
    runs: list[EngineRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def _median(self, engine: str, attr: str) -> float:
        vals = [getattr(r, attr) for r in self.runs if r.engine == engine]
        return statistics.median(vals) if vals else float("nan")

    def summary(self) -> dict:
        """Medians per engine, ratios ours/llama.cpp, and our peak RSS against the memory budget."""
        eng = {e: {k: self._median(e, k) for k in ("prompt_tok_s", "decode_tok_s", "load_s", "peak_rss")}
               for e in ENGINES if any(r.engine == e for r in self.runs)}
        ours_runs = [r for r in self.runs if r.engine == "ours"]
        if ours_runs:
            eng["ours"]["sparse"] = ours_runs[0].sparse
            fractions = [r.active_fraction for r in ours_runs if r.active_fraction is not None]
            eng["ours"]["active_fraction"] = statistics.median(fractions) if fractions else None
            shares = [r.predictor_share for r in ours_runs if r.predictor_share is not None]
            eng["ours"]["predictor_share"] = statistics.median(shares) if shares else None
            if ours_runs[0].wide_skipped is not None:  # wide mode: the last run's per-input and per-layer shares
                eng["ours"]["wide_skipped"] = ours_runs[-1].wide_skipped
                eng["ours"]["wide_layers"] = ours_runs[-1].wide_layers
        ratios = {}
        if len(eng) == 2:
            for k in ("prompt_tok_s", "decode_tok_s"):
                ratios[k] = eng["ours"][k] / eng["llamacpp"][k]
        ours = [r for r in self.runs if r.engine == "ours"]
        budget = (ours[0].file_size + ours[0].kv_bytes + RSS_SLACK_BYTES) if ours else None
        peak = max((r.peak_rss for r in ours), default=None)  # the worst rep, not the median
        reps = max((sum(r.engine == e for r in self.runs) for e in ENGINES), default=0)
        return {"model": self.model, "threads": self.threads, "n_prompt": self.n_prompt, "n_gen": self.n_gen,
                "reps": reps, "engines": eng, "ratio": ratios,
                "memory": {"peak_rss": peak, "budget": budget,
                           "within_budget": (peak <= budget) if budget else None},
                "warnings": self.warnings}

    def to_json(self) -> dict:
        out = self.summary()
        out["runs"] = [dict(asdict(r), prompt_tok_s=r.prompt_tok_s, decode_tok_s=r.decode_tok_s)
                       for r in self.runs]
        return out


class ChildCrashed(PowerInferError):
    """A measurement's process was killed by a signal (e.g. llama.cpp's SIGSEGV)."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


def run_child(engine: str, model: Path, n_prompt: int, n_gen: int, threads: int, sparse: str | None = None,
              sparse_threshold: float | None = None, sparsity: float | None = None, backend: str = "cpu",
              vram_budget: float | None = None, use_mmap: bool = True, predictor_dtype: str = "auto",
              llamacpp_repack: bool | None = None) -> EngineRun:
    """Run one measurement in a fresh interpreter and parse its JSON line. llamacpp_repack: see LlamaCppRef's
    repack (None: the child's llamacpp_repack_default())."""
    cmd = [sys.executable, "-m", "powerinfer_py.tools.bench", "--engine", engine, "--model", str(model),
           "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads)]
    if engine == "llamacpp" and llamacpp_repack is not None:
        cmd += ["--repack" if llamacpp_repack else "--no-repack"]
    if engine == "ours" and sparse is not None:
        cmd += ["--sparse", sparse]
    if engine == "ours" and sparse_threshold is not None:
        cmd += ["--sparse-threshold", repr(float(sparse_threshold))]
    if engine == "ours" and sparsity is not None:
        cmd += ["--sparsity", repr(float(sparsity))]
    if engine == "ours":
        cmd += ["--backend", backend] + (["--vram-budget", repr(float(vram_budget))] if vram_budget is not None else [])
        cmd += [] if use_mmap else ["--no-mmap"]
        cmd += [] if predictor_dtype == "auto" else ["--predictor-dtype", predictor_dtype]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PowerInferError(f"bench: the {engine} run took more than {CHILD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        message = f"bench: the {engine} run failed (exit {proc.returncode}): {tail}"
        if proc.returncode < 0:
            raise ChildCrashed(message, -proc.returncode)
        raise PowerInferError(message)
    fields = json.loads(proc.stdout.strip().splitlines()[-1])
    return EngineRun(**fields)


def run_bench(model: str | os.PathLike, n_gen: int = 128, n_prompt: int = 128, threads: int | None = None,
              reps: int = 3, engines: tuple[str, ...] = ENGINES,
              on_run: Callable[[EngineRun], None] | None = None, sparse: str | None = None,
              sparse_threshold: float | None = None,
              llamacpp_model: str | os.PathLike | None = None, sparsity: float | None = None,
              backend: str = "cpu",
              vram_budget: float | None = None, use_mmap: bool = True,
              predictor_dtype: str = "auto") -> BenchReport:
    """Alternate the engines `reps` times (order swapped every rep), each run in its own process.
    sparse / sparse_threshold / sparsity / use_mmap / predictor_dtype go to our engine; llama.cpp runs llamacpp_model (default: the
    same file) with its defaults."""
    path = Path(model)
    if not path.is_file():
        raise PowerInferError(f"model file not found: {path}")
    if sparse is not None and sparse not in SPARSE_MODES:
        raise PowerInferError(f"unknown sparse mode {sparse!r}; one of {', '.join(SPARSE_MODES)}")
    if not isinstance(predictor_dtype, str) or predictor_dtype.lower() not in PREDICTOR_TYPES:
        raise PowerInferError(f"unknown predictor dtype {predictor_dtype!r}; one of {', '.join(PREDICTOR_TYPES)}")
    ref_path = Path(llamacpp_model) if llamacpp_model is not None else path
    if not ref_path.is_file():
        raise PowerInferError(f"llama.cpp model file not found: {ref_path}")
    warnings = []
    if llamacpp_model is None and "llamacpp" in engines and _is_pwri(path):
        engines = tuple(e for e in engines if e != "llamacpp")
        warnings.append("llama.cpp cannot read PowerInfer (PWRI) files: pass the dense GGUF twin as the "
                        "llama.cpp model to compare; only our engine was measured")
    if n_prompt < 4 or n_gen < 1 or reps < 1:
        raise PowerInferError("bench needs at least 4 prompt tokens, 1 generated token and 1 repetition")
    threads = threads or usable_cpus()
    report = BenchReport(str(path), threads, n_prompt, n_gen, warnings=warnings)
    def measure(engine: str, repack: bool) -> EngineRun:
        return run_child(engine, path if engine == "ours" else ref_path, n_prompt, n_gen, threads,
                         sparse=sparse, sparse_threshold=sparse_threshold, sparsity=sparsity, backend=backend,
                         vram_budget=vram_budget, use_mmap=use_mmap, predictor_dtype=predictor_dtype,
                         llamacpp_repack=repack)

    repack = llamacpp_repack_default()
    for rep in range(reps):
        order = engines if rep % 2 == 0 else tuple(reversed(engines))
        for engine in order:
            try:
                run = measure(engine, repack)
            except ChildCrashed as e:
                if engine != "llamacpp" or not repack:
                    raise
                # llama.cpp's repacked (AMX) buffers crash on some hosts: measure it without them, and say so
                repack = False
                run = measure(engine, repack)
                report.warnings.append(
                    f"llama.cpp died by signal {e.signal_number} with its repacked weight buffers (CPU_REPACK / "
                    f"AMX); it was measured without them (its --no-repack), which may be slower than its default")
            report.runs.append(run)
            if on_run is not None:
                on_run(run)
    if len({r.prompt_digest for r in report.runs}) > 1:
        report.warnings.append("the engines did not feed identical prompt tokens")
    return report


def _is_pwri(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"PWRI"


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="One benchmark measurement (a child of `powerinfer bench`).")
    ap.add_argument("--engine", choices=ENGINES, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=usable_cpus())
    ap.add_argument("--sparse", choices=SPARSE_MODES, default=None)
    ap.add_argument("--sparse-threshold", type=float, default=None)
    ap.add_argument("--sparsity", type=float, default=None)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--vram-budget", type=float, default=None)
    ap.add_argument("--no-mmap", action="store_true")
    ap.add_argument("--predictor-dtype", default="auto")
    ap.add_argument("--repack", action=argparse.BooleanOptionalAction, default=None,
                    help="llama.cpp: load with (or without) its repacked weight buffers")
    a = ap.parse_args(argv)
    if a.engine == "ours":
        run = _child_ours(a.model, a.n_prompt, a.n_gen, a.threads, a.sparse, a.sparse_threshold, a.sparsity,
                          a.backend, a.vram_budget, use_mmap=not a.no_mmap, predictor_dtype=a.predictor_dtype)
    else:
        run = _child_llamacpp(a.model, a.n_prompt, a.n_gen, a.threads, a.repack)
    print(json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
