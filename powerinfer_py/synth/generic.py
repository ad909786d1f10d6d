"""The generic writer: llama's decoder block and the archs that differ from it by a few tensors or keys.

One _Spec holds every size and hparam of a model; its weights() writes llama's layer with each arch's
additions (qwen2's biases, Q/K norms, Gemma's post-norms, phi3's fused projections, experts) or hands the layer
to an arch's own function below (gpt-oss, olmo2 / exaone4, deepseek2, glm4, lfm2 in synth/lfm2.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..gguf import write_gguf
from ..gguf.types import GGMLType
from .common import _FILE_TYPE, DTYPES, GRANITE_SCALES, _encode, tokenizer_metadata
from .lfm2 import lfm2_layer, lfm2_metadata, lfm2_options

_GEMMA = ("gemma", "gemma2", "gemma3")
# With a tied head, large embeddings make every token predict itself (the residual stream is mostly its own
# embedding): tied models get small embeddings; Gemma's are also multiplied by sqrt(n_embd) in the model.
_EMBD_STD = {"llama": 1.0, "qwen2": 0.1, "qwen3": 0.1, "qwen2moe": 1.0, "qwen3moe": 0.1, "gemma": 0.4, "gemma2": 0.4, "gemma3": 0.4, "phi3": 1.0}
_OUTPUT_NORM_GAIN = {"llama": 1.0, "qwen2": 3.0, "qwen3": 3.0, "qwen2moe": 3.0, "qwen3moe": 3.0, "gemma": 6.0, "gemma2": 6.0, "gemma3": 6.0,
                     "phi3": 1.0}
# SmolLM3 (tied, as the 3B model) and OLMo 2 (untied, as llama.cpp requires output.weight)
_EMBD_STD.update(smollm3=0.1, olmo2=1.0, exaone4=1.0)
_OUTPUT_NORM_GAIN.update(smollm3=3.0, olmo2=1.0, exaone4=1.0)
_EMBD_STD.update(granite=0.1, granitemoe=0.1)  # tied, as Granite 3.x; times embedding_scale 10: std 1
_OUTPUT_NORM_GAIN.update(granite=3.0, granitemoe=3.0)  # times logit_scale (divided out again in the logits)
# gpt-oss (untied, as llama.cpp requires output.weight): its layers are written by _gptoss_layer
_EMBD_STD["gpt-oss"], _OUTPUT_NORM_GAIN["gpt-oss"] = 1.0, 1.0
# arcee (untied, as AFM-4.5B): the llama layers without ffn_gate (squared-ReLU FFN: up, down)
_EMBD_STD["arcee"], _OUTPUT_NORM_GAIN["arcee"] = 1.0, 1.0
# ERNIE 4.5 (tied, as the 0.3B model): ernie4_5-moe's first ERNIE_DENSE_LEAD layers are dense, the others have
# experts, a selection bias (exp_probs_b.bias) and an ungated shared expert (n_ff_exp wide unless told)
_EMBD_STD.update({"ernie4_5": 0.1, "ernie4_5-moe": 0.1})
_OUTPUT_NORM_GAIN.update({"ernie4_5": 3.0, "ernie4_5-moe": 3.0})
ERNIE_DENSE_LEAD = 1
# deepseek2 (untied, as the real files): MLA layers by _deepseek2_layer, options in _deepseek2_options
_EMBD_STD["deepseek2"], _OUTPUT_NORM_GAIN["deepseek2"] = 1.0, 1.0
# GLM-4-0414 (glm4) and GLM-4.5 (glm4moe), untied as the real files: layers by _glm4_layer, options in _glm4_options
_EMBD_STD.update(glm4=1.0, glm4moe=1.0)
_OUTPUT_NORM_GAIN.update(glm4=1.0, glm4moe=1.0)
# LFM2 (tied, as the real models): conv and attention layers by synth/lfm2.py, the final norm named token_embd_norm
_EMBD_STD.update(lfm2=0.1, lfm2moe=0.1)
_OUTPUT_NORM_GAIN.update(lfm2=3.0, lfm2moe=3.0)
# EXAONE 3.x (untied by default as 7.8B / 32B; tied=True as 2.4B) and InternLM2 (always untied): llama's layers
_EMBD_STD.update(exaone=0.1, internlm2=1.0)
_OUTPUT_NORM_GAIN.update(exaone=3.0, internlm2=1.0)


class _Spec:
    """Every size and hparam of one synthetic model, defaults per arch, overridable by keyword."""

    def __init__(self, arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, overrides):
        self.arch, self.n_layer, self.n_embd, self.n_ff = arch, n_layer, n_embd, n_ff
        self.n_head, self.n_head_kv, self.n_vocab = n_head, n_head_kv, n_vocab
        gemma = arch in _GEMMA
        o = dict(overrides)
        # Gemma, qwen3: a head_dim that differs from n_embd / n_head, as on the real models (the Q rows
        # n_head * head_dim then differ from n_embd, which exercises the key_length path)
        self.head_dim = o.pop("head_dim", 2 * n_embd // n_head if gemma or arch in ("qwen3", "qwen3moe")
                              else n_embd // n_head)
        self.n_ctx_train = o.pop("n_ctx_train", 512)
        self.norm_eps = o.pop("norm_eps", 1e-5 if arch in ("llama", "phi3") else 1e-6)
        self.rope_freq_base = o.pop("rope_freq_base", 10000.0 if arch in ("llama", "phi3") else 1_000_000.0)
        # gemma2/3 use their window; phi3 files carry one too (Phi-3-mini: 2047), which llama.cpp ignores
        self.sliding_window = o.pop("sliding_window", 4 if arch in ("gemma2", "gemma3", "phi3", "gpt-oss") else 0)
        # gemma2's soft-caps ({arch}.attn_logit_softcapping, final_logit_softcapping; None: key left out)
        self.softcaps = (o.pop("attn_softcap", 50.0), o.pop("final_softcap", 30.0)) if arch == "gemma2" else ()
        self.tied = o.pop("tied", arch not in ("llama", "phi3", "qwen2moe", "olmo2", "gpt-oss", "arcee", "deepseek2", "glm4", "glm4moe", "exaone", "internlm2"))  # llama.cpp's qwen2moe, olmo2 need output
        self.phi3 = _phi3_options(arch, self.head_dim, o)
        self.granite = _granite_options(arch, o)
        self.bias_std = o.pop("bias_std", 0.5)
        self.embd_std = o.pop("embd_std", _EMBD_STD[arch] if not gemma else _EMBD_STD[arch] / np.sqrt(n_embd))
        self.chat_template = o.pop("chat_template", None)  # a Jinja tokenizer.chat_template to embed
        self.rope_scaling = dict(o.pop("rope_scaling", None) or {})  # {arch}.rope.scaling.<key>: value
        self.rope_freqs = o.pop("rope_freqs", None)  # RoPE frequency factors [head_dim/2] (llama: rope_freqs.weight)
        if self.rope_freqs is not None:
            self.rope_freqs = np.asarray(self.rope_freqs, dtype=np.float32).reshape(-1)
            if arch not in ("llama", "arcee", "exaone4", "exaone") or self.rope_freqs.shape != (self.head_dim // 2,):
                raise ValueError(f"rope_freqs: a llama model takes {self.head_dim // 2} factors "
                                 f"(head_dim / 2); got {self.rope_freqs.shape[0]} for {arch}")
        # mixture of experts: (n_expert, n_expert_used, expert width, shared expert width) or () for a dense FFN
        if arch == "glm4moe":  # GLM-4.5's heads are wider than n_embd / n_head (q: 12288 rows for 5120)
            self.head_dim = o.pop("head_dim", 2 * n_embd // n_head)
        n_expert = o.pop("n_expert", 4 if arch.endswith("moe") or arch in ("gpt-oss", "deepseek2") else 0)
        if arch.endswith("moe") and not n_expert:
            raise ValueError(f"{arch} needs n_expert > 0")
        if n_expert and arch not in ("llama", "qwen2moe", "qwen3moe", "granitemoe", "gpt-oss", "ernie4_5-moe",
                                     "deepseek2", "glm4moe", "lfm2moe"):
            raise ValueError(f"experts are written for llama, qwen2moe, qwen3moe and granitemoe, not {arch}")
        n_ff_exp = o.pop("n_ff_exp", n_ff)
        self.moe = ((n_expert, o.pop("n_expert_used", 2), n_ff_exp,
                     o.pop("n_ff_shexp", n_ff if arch == "qwen2moe" else n_ff_exp if arch in ("ernie4_5-moe", "deepseek2", "glm4moe")
                           else 0))
                    if n_expert else ())
        self.ernie = _ernie_options(arch, o)
        self.ds = _deepseek2_options(arch, o)
        self.glm = _glm4_options(arch, self.head_dim, o)
        self.lfm2 = lfm2_options(arch, n_layer, o)
        if self.ds:
            self.head_dim = self.ds["nope"] + self.ds["n_rot"]
        if o:
            raise TypeError(f"unknown synthetic model option(s): {', '.join(sorted(o))}")
        if n_head % n_head_kv:
            raise ValueError(f"n_head {n_head} must be a multiple of n_head_kv {n_head_kv}")

    def experts(self, p: str, rng: np.random.Generator, linear, norm) -> list[tuple[str, np.ndarray]]:
        """One layer's mixture-of-experts tensors: router, 3-D expert stacks, qwen2moe's shared expert."""
        E, (n_expert, _, F, F_sh) = self.n_embd, self.moe
        out = [(p + "ffn_gate_inp.weight", 2.0 * linear(n_expert, E)),  # clear but not one-hot routing
               (p + "ffn_gate_exps.weight", np.stack([linear(F, E) for _ in range(n_expert)])),
               (p + "ffn_up_exps.weight", np.stack([linear(F, E) for _ in range(n_expert)])),
               (p + "ffn_down_exps.weight", np.stack([linear(E, F) for _ in range(n_expert)]))]
        if any(o.get("probs_bias") for o in (self.ernie, self.ds, self.glm, self.lfm2)):  # steers the choice: probabilities are ~1/n_expert apart
            out.append((p + "exp_probs_b.bias", 0.3 * rng.standard_normal(n_expert, dtype=np.float32)))
        if F_sh and self.arch not in ("granitemoe", "ernie4_5-moe", "deepseek2", "glm4moe"):  # their shared experts have no gate
            out.append((p + "ffn_gate_inp_shexp.weight", rng.standard_normal(E, dtype=np.float32) / np.float32(np.sqrt(E))))
        if F_sh:
            out += [(p + "ffn_gate_shexp.weight", linear(F_sh, E)),
                    (p + "ffn_up_shexp.weight", linear(F_sh, E)),
                    (p + "ffn_down_shexp.weight", linear(E, F_sh))]
        return out

    def metadata(self, dtype: str) -> tuple[dict, dict]:
        a = self.arch
        meta = {
            "general.architecture": a,
            # llama.cpp gives models named "phi3" / "phi-3" special <|endoftext|> handling this vocabulary lacks
            "general.name": f"synthetic-{a.replace('phi3', 'phi')}-{dtype}",
            "general.file_type": _FILE_TYPE[dtype],
            f"{a}.context_length": self.n_ctx_train,
            f"{a}.embedding_length": self.n_embd,
            f"{a}.block_count": self.n_layer,
            f"{a}.feed_forward_length": self.moe[2] if self.moe and a in ("llama", "granitemoe") else self.n_ff,
            f"{a}.attention.head_count": self.n_head,
            f"{a}.attention.head_count_kv": self.n_head_kv,
            f"{a}.attention.layer_norm_rms_epsilon": float(self.norm_eps),
            f"{a}.rope.freq_base": float(self.rope_freq_base),
            f"{a}.rope.dimension_count": self.head_dim,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
        }
        if self.moe:
            meta[f"{a}.expert_count"], meta[f"{a}.expert_used_count"] = self.moe[0], self.moe[1]
            if a not in ("llama", "granitemoe"):
                meta[f"{a}.expert_feed_forward_length"] = self.moe[2]
            if self.moe[3]:
                meta[f"{a}.expert_shared_feed_forward_length"] = self.moe[3]
        if a == "ernie4_5-moe":
            meta[f"{a}.leading_dense_block_count"] = self.ernie["dense_lead"]
            meta[f"{a}.interleave_moe_layer_step"] = self.ernie["moe_step"]
        if self.sliding_window:
            meta[f"{a}.attention.sliding_window"] = self.sliding_window
        if self.ds:
            meta.update(_deepseek2_metadata(self))
        if self.glm:
            meta.update(_glm4_metadata(self))
        for key, cap in zip(("attn_logit_softcapping", "final_logit_softcapping"), self.softcaps):
            if cap is not None:
                meta[f"{a}.{key}"] = float(cap)
        for key, value in self.rope_scaling.items():
            meta[f"{a}.rope.scaling.{key}"] = value
        if a == "phi3":
            meta[f"{a}.rope.dimension_count"] = self.phi3["n_rot"]
            if self.phi3["rope_factors"] is not None:
                meta[f"{a}.rope.scaling.original_context_length"] = self.phi3["orig_ctx"]
                meta[f"{a}.rope.scaling.attn_factor"] = float(self.phi3["attn_factor"])
        for key, value in self.granite.items():
            if value is not None:
                meta[f"{a}.{key.replace('attention_scale', 'attention.scale')}"] = value
        tok_meta, tok_types = tokenizer_metadata(self.n_vocab)
        meta.update(tok_meta)
        if self.chat_template is not None:
            meta["tokenizer.chat_template"] = self.chat_template
        lfm2_meta, types = lfm2_metadata(a, self.n_layer, self.n_head_kv, self.lfm2) if self.lfm2 else ({}, {})
        meta.update(lfm2_meta)
        types |= tok_types
        return meta, types

    def weights(self, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
        """(name, f32 array numpy order) of every tensor, in file order."""
        E, F, hd = self.n_embd, self.n_ff, self.head_dim
        q_dim, kv_dim = self.n_head * hd, self.n_head_kv * hd

        def linear(m, k):  # [m, k] ~ N(0, 1/k): unit-variance outputs for unit-variance inputs
            return rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k))

        def norm(d):
            return 1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)

        out = [("token_embd.weight", self.embd_std * rng.standard_normal((self.n_vocab, E), dtype=np.float32))]
        if self.rope_freqs is not None:
            out.append(("rope_freqs.weight", self.rope_freqs))
        if self.arch == "phi3" and self.phi3["rope_factors"] is not None:
            out += [("rope_factors_short.weight", self.phi3["rope_factors"][0]),
                    ("rope_factors_long.weight", self.phi3["rope_factors"][1])]
        for il in range(self.n_layer + self.glm.get("nextn", 0)):
            p = f"blk.{il}."
            if self.glm:
                out += _glm4_layer(p, il, self, rng, linear, norm)
                continue
            if self.lfm2:
                out += lfm2_layer(p, il, E, F, q_dim, kv_dim, hd, self.lfm2, linear, norm,
                                  lambda: self.experts(p, rng, linear, norm))
                continue
            if self.arch in ("olmo2", "exaone4"):  # no pre-norms; Q/K norms (olmo2: whole width) and two output norms
                out += _olmo2_layer(p, q_dim, kv_dim, E, F, linear, norm, hd if self.arch == "exaone4" else 0)
                continue
            if self.arch == "gpt-oss":
                out += _gptoss_layer(p, self, rng, linear, norm)
                continue
            if self.arch == "deepseek2":
                out += _deepseek2_layer(p, il, self, rng, linear, norm)
                continue
            out += [(p + "attn_norm.weight", norm(E)),
                    (p + "attn_q.weight", linear(q_dim, E)),
                    (p + "attn_k.weight", linear(kv_dim, E)),
                    (p + "attn_v.weight", linear(kv_dim, E))]
            if self.arch in ("qwen2", "qwen2moe"):
                out += [(p + f"attn_{x}.bias", self.bias_std * rng.standard_normal(d, dtype=np.float32))
                        for x, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
            if self.arch in ("gemma3", "qwen3", "qwen3moe"):
                out += [(p + "attn_q_norm.weight", norm(hd)), (p + "attn_k_norm.weight", norm(hd))]
            if self.arch == "phi3" and self.phi3["fused_qkv"]:  # one attn_qkv: rows [q | k | v]
                out[-3:] = [(p + "attn_qkv.weight", np.concatenate([t for _, t in out[-3:]]))]
            out.append((p + "attn_output.weight", linear(E, q_dim)))
            if self.arch in ("gemma2", "gemma3"):
                out.append((p + "post_attention_norm.weight", norm(E)))
            out.append((p + "ffn_norm.weight", norm(E)))
            if self.moe and il >= self.ernie.get("dense_lead", 0):
                out += self.experts(p, rng, linear, norm)
                continue
            out += [(p + "ffn_gate.weight", linear(F, E)),
                    (p + "ffn_up.weight", linear(F, E)),
                    (p + "ffn_down.weight", linear(E, F))]
            if self.arch == "arcee":  # no gate: relu(up·m)^2
                del out[-3]
            if self.arch == "phi3":  # one ffn_up: rows [gate | up]
                out[-3:-1] = [(p + "ffn_up.weight", np.concatenate([out[-3][1], out[-2][1]]))]
            if self.arch in ("gemma2", "gemma3"):
                out.append((p + "post_ffw_norm.weight", norm(E)))
        # tied heads see small embeddings: a larger output norm gain gives logits std ~2 all the same
        gain = _OUTPUT_NORM_GAIN[self.arch if self.tied else "llama"] * (self.granite.get("logit_scale") or 1.0)
        out.append(("token_embd_norm.weight" if self.lfm2 else "output_norm.weight", norm(E) * gain))
        if not self.tied:
            out.append(("output.weight", 2.5 * linear(self.n_vocab, E)))  # logits std ~2.5: a clear top-1
        return out


def _gptoss_layer(p: str, spec: _Spec, rng: np.random.Generator, linear, norm) -> list[tuple[str, np.ndarray]]:
    """One gpt-oss layer's tensors in llama.cpp's names (models/gpt_oss.py has the math). The sinks are large
    enough to take a visible share of each softmax, the expert gate and up rows wide enough (std ~3) that some
    values pass swiglu_oai's clamp at 7, and every bias is ~N(0, bias_std^2)."""
    E, hd, (n_exp, _, F, _) = spec.n_embd, spec.head_dim, spec.moe
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd

    def bias(*shape):
        return spec.bias_std * rng.standard_normal(shape, dtype=np.float32)

    return [(p + "attn_norm.weight", norm(E)),
            (p + "attn_q.weight", linear(q_dim, E)), (p + "attn_q.bias", bias(q_dim)),
            (p + "attn_k.weight", linear(kv_dim, E)), (p + "attn_k.bias", bias(kv_dim)),
            (p + "attn_v.weight", linear(kv_dim, E)), (p + "attn_v.bias", bias(kv_dim)),
            (p + "attn_output.weight", linear(E, q_dim)), (p + "attn_output.bias", bias(E)),
            (p + "attn_sinks.weight", 1.0 + rng.standard_normal(spec.n_head, dtype=np.float32)),
            (p + "post_attention_norm.weight", norm(E)),
            (p + "ffn_gate_inp.weight", 2.0 * linear(n_exp, E)), (p + "ffn_gate_inp.bias", bias(n_exp)),
            (p + "ffn_gate_exps.weight", np.stack([3.0 * linear(F, E) for _ in range(n_exp)])),
            (p + "ffn_gate_exps.bias", bias(n_exp, F)),
            (p + "ffn_up_exps.weight", np.stack([3.0 * linear(F, E) for _ in range(n_exp)])),
            (p + "ffn_up_exps.bias", bias(n_exp, F)),
            (p + "ffn_down_exps.weight", np.stack([0.3 * linear(E, F) for _ in range(n_exp)])),
            (p + "ffn_down_exps.bias", bias(n_exp, E))]


def _olmo2_layer(p: str, q_dim: int, kv_dim: int, E: int, F: int, linear, norm,
                 head_norm: int = 0) -> list[tuple[str, np.ndarray]]:
    """One olmo2 layer's tensors in llama.cpp's names (models/olmo2.py has the math); head_norm > 0: Q/K norms of
    that width, one per head (exaone4)."""
    return [(p + "attn_q.weight", linear(q_dim, E)), (p + "attn_k.weight", linear(kv_dim, E)),
            (p + "attn_v.weight", linear(kv_dim, E)), (p + "attn_q_norm.weight", norm(head_norm or q_dim)),
            (p + "attn_k_norm.weight", norm(head_norm or kv_dim)), (p + "attn_output.weight", linear(E, q_dim)),
            (p + "post_attention_norm.weight", norm(E)), (p + "ffn_gate.weight", linear(F, E)),
            (p + "ffn_up.weight", linear(F, E)), (p + "ffn_down.weight", linear(E, F)),
            (p + "post_ffw_norm.weight", norm(E))]


def _deepseek2_options(arch: str, o: dict) -> dict:
    """deepseek2's own overrides (popped from o): q_lora (0: a plain attn_q, as the Lite models), kv_lora (latent
    width), n_rot / nope (rotated / unrotated dims of a q/k head), v_dim, split (True: attn_k_b / attn_v_b and
    the *_mla keys, as newer files; False: one attn_kv_b), dense_lead, gating ("softmax" or "sigmoid"; None
    leaves expert_gating_func out), weights_scale / weights_norm (None: key left out), groups ((count, used)
    or None), probs_bias (write exp_probs_b.bias). n_ff_shexp / n_ff_exp is written as expert_shared_count."""
    if arch != "deepseek2":
        return {}
    return {"q_lora": o.pop("q_lora", 0), "kv_lora": o.pop("kv_lora", 64), "n_rot": o.pop("n_rot", 16),
            "nope": o.pop("nope", 32), "v_dim": o.pop("v_dim", 32), "split": o.pop("split", True),
            "dense_lead": o.pop("dense_lead", 1), "gating": o.pop("gating", "softmax"),
            "weights_scale": o.pop("weights_scale", None), "weights_norm": o.pop("weights_norm", None),
            "groups": o.pop("groups", None), "probs_bias": o.pop("probs_bias", False)}


def _deepseek2_metadata(spec: "_Spec") -> dict:
    """deepseek2's keys: MLA sizes in the layout of the tensors, and the routing settings."""
    a, d, (n_expert, _, F, F_sh) = spec.arch, spec.ds, spec.moe
    hd = d["nope"] + d["n_rot"]
    meta = {f"{a}.rope.dimension_count": d["n_rot"], f"{a}.attention.q_lora_rank": d["q_lora"],
            f"{a}.attention.kv_lora_rank": d["kv_lora"], f"{a}.leading_dense_block_count": d["dense_lead"],
            f"{a}.expert_shared_count": F_sh // F}
    if d["split"]:  # llama.cpp's MLA layout: one cache "head" of latent + rope key
        meta.update({f"{a}.attention.key_length": d["kv_lora"] + d["n_rot"],
                     f"{a}.attention.value_length": d["kv_lora"], f"{a}.attention.head_count_kv": 1,
                     f"{a}.attention.key_length_mla": hd, f"{a}.attention.value_length_mla": d["v_dim"]})
    else:
        meta.update({f"{a}.attention.key_length": hd, f"{a}.attention.value_length": d["v_dim"],
                     f"{a}.attention.head_count_kv": spec.n_head})
    if d["gating"] is not None:
        meta[f"{a}.expert_gating_func"] = {"softmax": 1, "sigmoid": 2}[d["gating"]]
    if d["weights_scale"] is not None:
        meta[f"{a}.expert_weights_scale"] = float(d["weights_scale"])
    if d["weights_norm"] is not None:
        meta[f"{a}.expert_weights_norm"] = bool(d["weights_norm"])
    if d["groups"]:
        meta[f"{a}.expert_group_count"], meta[f"{a}.expert_group_used_count"] = d["groups"]
    meta.pop(f"{a}.expert_shared_feed_forward_length", None)
    return meta


def _deepseek2_layer(p: str, il: int, spec: "_Spec", rng, linear, norm) -> list[tuple[str, np.ndarray]]:
    """One deepseek2 layer in llama.cpp's names (models/deepseek2.py has the math). attn_kv_b is drawn either
    way and split into attn_k_b (transposed per head) / attn_v_b for the newer layout, so both layouts of one
    seed hold the same model."""
    E, H, d = spec.n_embd, spec.n_head, spec.ds
    nope, r, lat, dv, ql = d["nope"], d["n_rot"], d["kv_lora"], d["v_dim"], d["q_lora"]
    out = [(p + "attn_norm.weight", norm(E))]
    if ql:
        out += [(p + "attn_q_a.weight", linear(ql, E)), (p + "attn_q_a_norm.weight", norm(ql)),
                (p + "attn_q_b.weight", linear(H * (nope + r), ql))]
    else:
        out.append((p + "attn_q.weight", linear(H * (nope + r), E)))
    out += [(p + "attn_kv_a_mqa.weight", linear(lat + r, E)), (p + "attn_kv_a_norm.weight", norm(lat))]
    kv_b = linear(H * (nope + dv), lat)
    if d["split"]:
        kv_b = kv_b.reshape(H, nope + dv, lat)
        out += [(p + "attn_k_b.weight", kv_b[:, :nope].transpose(0, 2, 1)), (p + "attn_v_b.weight", kv_b[:, nope:])]
    else:
        out.append((p + "attn_kv_b.weight", kv_b))
    out += [(p + "attn_output.weight", linear(E, H * dv)), (p + "ffn_norm.weight", norm(E))]
    if il >= d["dense_lead"]:
        return out + spec.experts(p, rng, linear, norm)
    F = spec.n_ff
    return out + [(p + "ffn_gate.weight", linear(F, E)), (p + "ffn_up.weight", linear(F, E)),
                  (p + "ffn_down.weight", linear(E, F))]


def _glm4_options(arch: str, head_dim: int, o: dict) -> dict:
    """glm4 / glm4moe's own overrides (popped from o): n_rot (default head_dim / 2, as the real files), nextn
    (next-token-prediction blocks written after the n_layer that run; default 0 for glm4, 1 for glm4moe),
    fused_qkv (one attn_qkv; default True for glm4, False for glm4moe), qkv_bias (default True), and for glm4moe
    qk_norm (default False), dense_lead (default 1), gating ("sigmoid", "softmax" or None: key left out, which
    means sigmoid), weights_scale (default 2.5, GLM-4.5's; None: key left out), weights_norm (default True),
    probs_bias (default True: exp_probs_b.bias, which llama.cpp requires). n_ff_shexp / n_ff_exp is written as
    expert_shared_count."""
    if arch not in ("glm4", "glm4moe"):
        return {}
    moe = arch == "glm4moe"
    out = {"n_rot": o.pop("n_rot", head_dim // 2 // 2 * 2), "nextn": o.pop("nextn", 1 if moe else 0),
           "fused_qkv": o.pop("fused_qkv", not moe), "qkv_bias": o.pop("qkv_bias", True)}
    if moe:
        out.update(qk_norm=o.pop("qk_norm", False), dense_lead=o.pop("dense_lead", 1),
                   gating=o.pop("gating", "sigmoid"), weights_scale=o.pop("weights_scale", 2.5),
                   weights_norm=o.pop("weights_norm", True), probs_bias=o.pop("probs_bias", True))
    return out


def _glm4_metadata(spec: "_Spec") -> dict:
    """glm4(moe)'s keys: the rotated dims, block_count with the next-token-prediction blocks, and the routing."""
    a, g = spec.arch, spec.glm
    meta = {f"{a}.rope.dimension_count": g["n_rot"], f"{a}.block_count": spec.n_layer + g["nextn"]}
    if g["nextn"]:
        meta[f"{a}.nextn_predict_layers"] = g["nextn"]
    if a == "glm4moe":
        _, _, F, F_sh = spec.moe
        meta.update({f"{a}.leading_dense_block_count": g["dense_lead"], f"{a}.expert_shared_count": F_sh // F,
                     f"{a}.expert_weights_norm": bool(g["weights_norm"])})
        meta.pop(f"{a}.expert_shared_feed_forward_length", None)
        if g["gating"] is not None:
            meta[f"{a}.expert_gating_func"] = {"softmax": 1, "sigmoid": 2}[g["gating"]]
        if g["weights_scale"] is not None:
            meta[f"{a}.expert_weights_scale"] = float(g["weights_scale"])
    return meta


def _glm4_layer(p: str, il: int, spec: "_Spec", rng, linear, norm) -> list[tuple[str, np.ndarray]]:
    """One glm4 / glm4moe block in llama.cpp's names (models/glm4.py has the math); blocks il >= n_layer are the
    next-token-prediction ones: a whole block plus its nextn.* tensors."""
    E, F, hd, g = spec.n_embd, spec.n_ff, spec.head_dim, spec.glm
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    qkv = [(p + f"attn_{x}.weight", linear(d, E)) for x, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
    bias = [(p + f"attn_{x}.bias", spec.bias_std * rng.standard_normal(d, dtype=np.float32))
            for x, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))] if g["qkv_bias"] else []
    out = [(p + "attn_norm.weight", norm(E))]
    if g["fused_qkv"]:  # rows [q | k | v], the bias likewise
        out.append((p + "attn_qkv.weight", np.concatenate([t for _, t in qkv])))
        if bias:
            out.append((p + "attn_qkv.bias", np.concatenate([t for _, t in bias])))
    else:
        out += qkv + bias
    if g.get("qk_norm"):
        out += [(p + "attn_q_norm.weight", norm(hd)), (p + "attn_k_norm.weight", norm(hd))]
    out += [(p + "attn_output.weight", linear(E, q_dim)), (p + "post_attention_norm.weight", norm(E))]
    if spec.arch == "glm4":  # one ffn_up: rows [gate | up]; the sandwich norms around the FFN
        out += [(p + "ffn_norm.weight", norm(E)), (p + "ffn_up.weight", np.concatenate([linear(F, E), linear(F, E)])),
                (p + "ffn_down.weight", linear(E, F)), (p + "post_ffw_norm.weight", norm(E))]
    elif il >= g["dense_lead"]:
        out += spec.experts(p, rng, linear, norm)
    else:
        out += [(p + "ffn_gate.weight", linear(F, E)), (p + "ffn_up.weight", linear(F, E)),
                (p + "ffn_down.weight", linear(E, F))]
    if il >= spec.n_layer:
        out += [(p + "nextn.eh_proj.weight", linear(E, 2 * E)), (p + "nextn.enorm.weight", norm(E)),
                (p + "nextn.hnorm.weight", norm(E)), (p + "nextn.shared_head_norm.weight", norm(E))]
    return out


def _phi3_options(arch: str, head_dim: int, o: dict) -> dict:
    """phi3's own overrides (popped from o): n_rot, rope_factors, orig_ctx, attn_factor, fused_qkv."""
    if arch != "phi3":
        return {}
    n_rot = o.pop("n_rot", head_dim * 3 // 4 // 2 * 2)  # partial rotary by default, as on Phi-4-mini (96 of 128)
    factors = o.pop("rope_factors", None)
    if factors is not None:
        factors = tuple(np.asarray(f, dtype=np.float32).reshape(-1) for f in factors)
        if len(factors) != 2 or any(f.shape != (n_rot // 2,) for f in factors):
            raise ValueError(f"rope_factors: (short, long), {n_rot // 2} factors each (n_rot / 2)")
    return {"n_rot": n_rot, "rope_factors": factors, "orig_ctx": o.pop("orig_ctx", 16),
            "attn_factor": o.pop("attn_factor", 1.0), "fused_qkv": o.pop("fused_qkv", True)}


def _ernie_options(arch: str, o: dict) -> dict:
    """ernie4_5-moe's own overrides (popped from o): dense_lead (leading dense layers, default ERNIE_DENSE_LEAD),
    moe_step (interleave_moe_layer_step, default 1), probs_bias (default True: write exp_probs_b.bias)."""
    if arch != "ernie4_5-moe":
        return {}
    return {"dense_lead": o.pop("dense_lead", ERNIE_DENSE_LEAD), "moe_step": o.pop("moe_step", 1),
            "probs_bias": o.pop("probs_bias", True)}


def _granite_options(arch: str, o: dict) -> dict:
    """granite's scalars (popped from o; GRANITE_SCALES the defaults, None leaves a key out), and
    rope_finetuned (False writes {arch}.rope.scaling.finetuned = false: no RoPE)."""
    if arch not in ("granite", "granitemoe"):
        return {}
    out = {k: o.pop(k, v) for k, v in GRANITE_SCALES.items()}
    out = {k: None if v is None else float(v) for k, v in out.items()}
    if not o.pop("rope_finetuned", True):
        out["rope.scaling.finetuned"] = False
    return out


def write_generic_model(path: str | os.PathLike, arch: str, dtype: str, n_layer: int, n_embd: int, n_ff: int,
                        n_head: int, n_head_kv: int, n_vocab: int, seed: int, overrides: dict) -> Path:
    """Write one of the archs _Spec knows (synth.write_synthetic_model documents the overrides)."""
    spec = _Spec(arch, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, overrides)
    metadata, types = spec.metadata(dtype)
    rng = np.random.default_rng(seed)
    # 1-D tensors, the MoE router and lfm2's conv taps stay F32, as in llama.cpp's files; matrices and expert
    # stacks take dtype
    tensors = [_encode(name, x, DTYPES[dtype] if x.ndim >= 2 and "gate_inp" not in name and not name.endswith(".bias")
                       and "shortconv.conv" not in name else GGMLType.F32)
               for name, x in spec.weights(rng)]
    return write_gguf(path, metadata, tensors, types=types)
