"""Fitting one layer's activation predictor: logits = fc2 · relu(fc1 · p), trained to say which neurons fire.

The data: p f32 [T, n_embd] (the exact predictor input of docs/FORMATS.md section 2, as the FFN observer sees it) and
the labels y bool [T, n_ff] (neuron active on that token). The model has no biases, as PowerInfer's files have
none; it is evaluated exactly as ffn.py's predictor mode runs it: neuron i is predicted active iff its logit
is >= the threshold (0, i.e. sigmoid >= 0.5, unless told otherwise).

Training (fit_layer):
  - inputs are scaled per feature by their rms over the training tokens, and that scale is folded into fc1
    when the weights are returned (a bias-free model cannot be shifted, but it can be rescaled);
  - loss: class-weighted binary cross-entropy on the logits, positives weighted by pos_weight (default: the
    layer's negatives / positives ratio, times `balance`): missing an active neuron costs quality, computing
    an inactive one only time, so the balance leans towards recall;
  - fc1 starts random (unit-variance hidden units), fc2 small and random;
  - Adam on minibatches of tokens, `epochs` passes over the training tokens;
  - a held-out slice of the tokens (val_fraction) is scored after every epoch, and the checkpoint kept is the
    one with the highest predicted sparsity among those that reach the recall target, or, if none does, the
    one with the highest recall ("chosen for recall").
Two backends compute the same thing: numpy (always available) and torch (faster; used when importable and
backend is "auto" or "torch"; the optional extra `[train]`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import PowerInferError

BACKENDS = ("auto", "numpy", "torch")


@dataclass
class FitConfig:
    epochs: int = 20
    batch: int = 128  # tokens per Adam step
    lr: float = 3e-3
    balance: float = 1.0  # multiplies the default positive weight (negatives / positives)
    pos_weight: float | None = None  # explicit positive weight (overrides balance)
    recall_target: float = 0.95
    val_fraction: float = 0.15
    threshold: float = 0.0
    seed: int = 0
    backend: str = "auto"
    threads: int | None = None


@dataclass
class Metrics:
    """Predictor quality on tokens: recall = predicted among active, precision = active among predicted,
    predicted_sparsity = 1 - predicted active fraction, true_sparsity = 1 - active fraction."""
    recall: float
    precision: float
    predicted_sparsity: float
    true_sparsity: float

    def meets(self, recall_target: float) -> bool:
        return self.recall >= recall_target


@dataclass
class LayerPredictor:
    fc1: np.ndarray  # f32 [rank, n_embd] (input scaling folded in)
    fc2: np.ndarray  # f32 [n_ff, rank]
    metrics: Metrics  # on the held-out tokens, for the chosen checkpoint
    epoch: int  # the chosen checkpoint (1-based)
    backend: str

    @property
    def rank(self) -> int:
        return self.fc1.shape[0]


def predictor_logits(fc1: np.ndarray, fc2: np.ndarray, p: np.ndarray) -> np.ndarray:
    """f32 [T, n_ff] = fc2 · relu(fc1 · p) for p f32 [T, n_embd] (what ffn.py computes, in numpy)."""
    return np.maximum(p @ np.ascontiguousarray(fc1.T), 0) @ np.ascontiguousarray(fc2.T)


def score(logits: np.ndarray, y: np.ndarray, threshold: float = 0.0) -> Metrics:
    """Metrics of the verdicts logits >= threshold against the labels y bool [T, n_ff]."""
    pred = logits >= threshold
    n_pred, n_act = int(pred.sum()), int(y.sum())
    hits = int(np.count_nonzero(pred & y))
    return Metrics(recall=hits / n_act if n_act else 1.0, precision=hits / n_pred if n_pred else 1.0,
                   predicted_sparsity=1.0 - n_pred / max(1, pred.size), true_sparsity=1.0 - n_act / max(1, y.size))


def _better(m: Metrics, best: Metrics | None, target: float) -> bool:
    if best is None:
        return True
    if m.meets(target) != best.meets(target):
        return m.meets(target)
    if m.meets(target):
        return m.predicted_sparsity > best.predicted_sparsity
    return m.recall > best.recall


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise PowerInferError(f"unknown training backend {backend!r}; one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        return backend
    try:
        import torch  # noqa: F401
    except ImportError:
        if backend == "torch":
            raise PowerInferError("training backend 'torch' needs PyTorch: pip install 'powerinfer-py[train]'"
                                  ) from None
        return "numpy"
    return "torch"


def split(n_tokens: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) token indices: a random held-out slice of at least one token (when n >= 2)."""
    if n_tokens < 2:
        raise PowerInferError(f"predictor training needs at least 2 tokens, got {n_tokens}")
    order = np.random.default_rng(seed).permutation(n_tokens)
    n_val = min(n_tokens - 1, max(1, round(val_fraction * n_tokens)))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def fit_layer(p: np.ndarray, y: np.ndarray, rank: int, cfg: FitConfig = FitConfig(),
              progress: Callable[[int, Metrics], None] | None = None) -> LayerPredictor:
    """Train fc1 [rank, n_embd], fc2 [n_ff, rank] on p f32 [T, n_embd] and labels y bool [T, n_ff]."""
    p = np.ascontiguousarray(p, dtype=np.float32)
    y = np.asarray(y, dtype=bool)
    if p.ndim != 2 or y.ndim != 2 or p.shape[0] != y.shape[0]:
        raise PowerInferError(f"predictor data: p {p.shape} and labels {y.shape} must be [T, n_embd], [T, n_ff]")
    if rank < 1:
        raise PowerInferError(f"the predictor rank must be at least 1, got {rank}")
    train, val = split(p.shape[0], cfg.val_fraction, cfg.seed)
    scale = np.sqrt(np.mean(p[train].astype(np.float64) ** 2, axis=0)).astype(np.float32)
    scale[scale < 1e-12] = 1.0
    x = p / scale
    a = float(y[train].mean())
    pos_weight = cfg.pos_weight if cfg.pos_weight is not None else \
        cfg.balance * float(np.clip((1 - a) / max(a, 1e-6), 1.0, 1e4))
    backend = resolve_backend(cfg.backend)
    trainer = _torch_fit if backend == "torch" else _numpy_fit
    w1, w2, metrics, epoch = trainer(x, y, train, val, rank, pos_weight, cfg, progress)
    return LayerPredictor(np.ascontiguousarray(w1 / scale, dtype=np.float32),
                          np.ascontiguousarray(w2, dtype=np.float32), metrics, epoch, backend)


def _init(rng: np.random.Generator, rank: int, d: int, f: int) -> tuple[np.ndarray, np.ndarray]:
    w1 = (rng.standard_normal((rank, d)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((f, rank)) * (0.1 / np.sqrt(rank))).astype(np.float32)
    return w1, w2


def _sigmoid(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)), as 0.5 * (1 + tanh(v / 2)): one pass, no overflow for any v."""
    out = np.tanh(v * np.float32(0.5))
    out += np.float32(1)
    out *= np.float32(0.5)
    return out


def bce_grads(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray, pos_weight) -> tuple:
    """Gradients (d/da, d/db) of the class-weighted BCE, mean over the [B, F] elements, of the logits
    relu(x @ a) @ b, with a = fc1^T [D, R], b = fc2^T [R, F], x [B, D], labels y bool [B, F]."""
    z = x @ a  # [B, R]
    h = np.maximum(z, 0)
    s = _sigmoid(h @ b)  # [B, F]
    g = np.where(y, pos_weight * (s - 1), s).astype(x.dtype)  # d loss / d logits, per element
    g /= g.size
    g_b = np.ascontiguousarray(h.T) @ g  # [R, F]
    g_z = (g @ np.ascontiguousarray(b.T)) * (z > 0)  # [B, R]
    g_a = np.ascontiguousarray(x.T) @ g_z  # [D, R]
    return g_a, g_b


def _numpy_fit(x, y, train, val, rank, pos_weight, cfg: FitConfig, progress):
    rng = np.random.default_rng(cfg.seed)
    w1, w2 = _init(rng, rank, x.shape[1], y.shape[1])
    # kept as a = fc1^T [D, R] and b = fc2^T [R, F], C-contiguous: every product below is then a plain
    # row-major GEMM (BLAS is far slower on some transposed small products, worst with busy cores)
    params = [np.ascontiguousarray(w1.T), np.ascontiguousarray(w2.T)]
    m = [np.zeros_like(w) for w in params]
    v = [np.zeros_like(w) for w in params]
    b1, b2, eps, step = 0.9, 0.999, 1e-8, 0
    best, best_w, best_epoch = None, None, 0
    pw = np.float32(pos_weight)
    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(train)
        for s0 in range(0, len(order), cfg.batch):
            idx = order[s0:s0 + cfg.batch]
            xb, yb = x[idx], y[idx]
            g_a, g_b = bce_grads(xb, yb, params[0], params[1], pw)
            step += 1
            lr_t = cfg.lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
            for w, gw, mw, vw in zip(params, (g_a, g_b), m, v):
                mw *= b1
                mw += (1 - b1) * gw
                vw *= b2
                vw += (1 - b2) * gw * gw
                w -= np.float32(lr_t) * mw / (np.sqrt(vw) + eps)
        fc1, fc2 = params[0].T, params[1].T
        met = score(predictor_logits(fc1, fc2, x[val]), y[val], cfg.threshold)
        if progress:
            progress(epoch, met)
        if _better(met, best, cfg.recall_target):
            best, best_w, best_epoch = met, [fc1.copy(), fc2.copy()], epoch
    return best_w[0], best_w[1], best, best_epoch


def _torch_fit(x, y, train, val, rank, pos_weight, cfg: FitConfig, progress):
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    w1_0, w2_0 = _init(rng, rank, x.shape[1], y.shape[1])
    w1 = torch.tensor(w1_0, requires_grad=True)
    w2 = torch.tensor(w2_0, requires_grad=True)
    opt = torch.optim.Adam([w1, w2], lr=cfg.lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.float32))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(float(pos_weight)), reduction="mean")
    best, best_w, best_epoch = None, None, 0
    for epoch in range(1, cfg.epochs + 1):
        order = rng.permutation(train)
        for s0 in range(0, len(order), cfg.batch):
            idx = torch.from_numpy(order[s0:s0 + cfg.batch])
            logits = torch.relu(xt[idx] @ w1.T) @ w2.T
            loss = loss_fn(logits, yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            a, b = w1.detach().numpy().copy(), w2.detach().numpy().copy()
        met = score(predictor_logits(a, b, x[val]), y[val], cfg.threshold)
        if progress:
            progress(epoch, met)
        if _better(met, best, cfg.recall_target):
            best, best_w, best_epoch = met, [a, b], epoch
    return best_w[0], best_w[1], best, best_epoch
