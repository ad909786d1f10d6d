"""ArchKeys: the metadata keys of the architectures beyond the plain llama block, read for ModelConfig.

config._Reader inherits these methods (they use its typed access: get, positive, key, meta, arch); config.py
reads the keys every architecture shares. Keys follow llama.cpp's names ({arch} is general.architecture);
defaults are llama.cpp's where it has one.

Per architecture (hunyuan-dense, apertus and seed_oss: config_llama_variants.py):
  llama   (LLaMA-2/3, Mistral): normal (interleaved-pair) RoPE, attn_scale 1/sqrt(head_dim), rope base 10000
  qwen2   NeoX RoPE, rope base default 1e6, q/k/v biases (tensors, not config)
  qwen3   NeoX RoPE, no q/k/v biases, per-head RMSNorm of Q and K (tensors); head_dim is {arch}.attention.key_length
          (Qwen3-0.6B: 128, not n_embd / n_head = 64); rope base default llama.cpp's 10000 (real files carry it)
  gemma3  NeoX RoPE; layers with il % 6 != 5 attend within a sliding window and use RoPE base 10000 and
          freq scale 1.0; the other (global) layers use {arch}.rope.freq_base and rope_freq_scale;
          embeddings scaled by sqrt(n_embd); attn_scale 1/sqrt(head_dim) (27B: 1/sqrt(n_embd/n_head))
  gemma   (Gemma 1) NeoX RoPE, embeddings scaled by sqrt(n_embd), GeGLU FFN, attn_scale 1/sqrt(head_dim) (head_dim
          is {arch}.attention.key_length: 256 on Gemma 7B with n_embd / n_head = 192), tied output head
  gemma2  gemma plus post-norms (as gemma3, without Q/K norms); layers with il % period < period - 1 (period
          {arch}.attention.sliding_window_pattern, default 2: the even layers) attend within
          {arch}.attention.sliding_window (default 4096) with RoPE base {arch}.rope.freq_base_swa (default: the
          global base); attention logit soft-capping ({arch}.attn_logit_softcapping, default 50) and final
          logit soft-capping ({arch}.final_logit_softcapping, default 30): x -> cap * tanh(x / cap);
          attn_scale 1/sqrt(head_dim) (27B, 46 layers: 1/sqrt(n_embd / n_head)). Defaults are llama.cpp's.
  bamboo  the llama block (Mistral shape, GQA, normal RoPE) with a dReLU FFN
  falcon  LayerNorm with biases, fused attn_qkv, NeoX RoPE, parallel attention + MLP, no ffn_norm
  opt     LayerNorm with biases, biases on every projection, learned positions (no RoPE), ReLU FFN
  phi2, stablelm, starcoder2, gpt2  LayerNorm with biases (layer_norm_epsilon), NeoX RoPE over
          rope.dimension_count dims (gpt2: learned positions, no RoPE); phi2, starcoder2 and gpt2 default to a GELU
          FFN with biases, stablelm to SwiGLU (models/ln_decoder.py)
  qwen3moe, qwen2moe  qwen3 / qwen2 with a mixture-of-experts FFN (below); qwen2moe adds a shared expert
  mistral3 (Ministral 3, Mistral Small 3.x files of that arch) the llama block (normal RoPE; experts as llama's,
          their width feed_forward_length) plus two things: {arch}.attention.temperature_scale b (optional) scales q
          after RoPE by 1 + b * ln(floor(pos / L) + 1), L = rope.scaling.original_context_length (default
          context_length): 1 below position L; and with YaRN and rope.scaling.yarn_log_multiplier m the rotated dims
          are scaled by (1 + 0.1 ln F) / (1 + 0.1 m ln F) (F the YaRN factor; without m, by 1 + 0.1 ln F as for
          llama). Both checked against llama.cpp's results on synthetic files (tests/test_mistral3.py): the position
          has no +1 offset, and the YaRN scale is not multiplied by 1 + 0.1 ln F again.
  granite, granitemoe  the llama block (normal RoPE) with four scalars: {arch}.embedding_scale multiplies the
          embeddings (embd_scale), {arch}.residual_scale the attention and FFN outputs before each residual add,
          {arch}.attention.scale replaces 1/sqrt(head_dim) (attn_scale), and the logits are divided by
          {arch}.logit_scale (required); 0 or absent means unset for the first three, as in llama.cpp.
          {arch}.rope.scaling.finetuned = false switches RoPE off (n_rot 0). granitemoe: experts
          feed_forward_length wide, renormalized router weights, an optional ungated shared expert
          ({arch}.expert_shared_feed_forward_length). granitehybrid (Granite 4.0-H) reads the same scalars, with
          logit_scale optional there (absent: 1), as llama.cpp; its layer kinds come from config_mamba2.py
  phi3    the llama block with fused attn_qkv and gate+up, NeoX RoPE (partial: n_rot < head_dim on Phi-4-mini);
          long-context files carry rope_factors_long/short (used when n_ctx > rope.scaling.original_context_length
          / otherwise) and rope.scaling.attn_factor, which scales the rotated dims of q and k (llama.cpp's
          mscale); phi3.attention.sliding_window is ignored, as llama.cpp does
  smollm3 the llama block (normal RoPE) where every 4th layer ((il + 1) % 4 == 0) skips RoPE (no_rope_layers);
          llama.cpp hard-codes the step 4 (no GGUF key holds it), and so do we
  exaone4 (EXAONE 4.0 / 4.5) olmo2's block with per-head Q/K norms, rope_freqs.weight factors and NeoX RoPE;
          64-layer files only (the 32B) get sliding windows (attention.sliding_window, default 4096, pattern as
          OLMo 3's) and no RoPE on their global layers; nextn_predict_layers trailing blocks are not run
  olmo2   NeoX RoPE; no pre-norms: RMSNorms of the whole Q and K projections and of the attention and FFN outputs
          (tensors). OLMo 3 files have attention.sliding_window > 0: window layers per sliding_window_pattern
          (default: all but every 4th), with plain RoPE at rope.freq_base_swa (default rope.freq_base) while
          the full layers take the file's YaRN scaling, as llama.cpp runs them
  gpt-oss NeoX RoPE (YaRN in the real files), Q/K/V and output biases, attention sinks (tensors); the even layers
          (il % 2 == 0, llama.cpp's fixed pattern) attend within {arch}.attention.sliding_window (required);
          attn_scale 1/sqrt(head_dim); experts {arch}.expert_feed_forward_length wide, routed by the top-k
          biased router logits softmaxed after the selection (moe.py); a rope.freq_base_swa that differs from
          the global base is refused
  ernie4_5, ernie4_5-moe  (Baidu ERNIE 4.5) the llama block (normal RoPE over the whole head: rope.dimension_count
          must equal head_dim, as llama.cpp asserts); ernie4_5-moe: {arch}.leading_dense_block_count dense layers
          (feed_forward_length wide), then experts (expert_feed_forward_length wide; softmax router, top-k chosen
          on probs + the optional blk.N.exp_probs_b.bias, weights renormalized) with an optional ungated shared
          expert ({arch}.expert_shared_feed_forward_length); {arch}.interleave_moe_layer_step must be 1 (the
          published checkpoints' value; llama.cpp's loader knows no other)
  arcee   (Arcee AFM) the llama block (normal RoPE, optional rope_freqs.weight, YaRN from the metadata) with an
          ungated squared-ReLU FFN, relu(up·x)^2 (ffn.py "relu2", whatever powerinfer.hidden_act says)
  deepseek2 (DeepSeek-V2/V2-Lite/V3, Moonlight) multi-head latent attention (models/deepseek2.py) plus experts:
          head_dim is the q/k head width, nope + rope ({arch}.attention.key_length_mla in files with the split
          attn_k_b/attn_v_b, key_length in older files with attn_kv_b), v_head_dim the value width
          (value_length_mla / value_length), n_rot = rope.dimension_count the rotated tail of each head (normal
          layout); {arch}.attention.kv_lora_rank, q_lora_rank (absent or 0: a plain attn_q); n_head_kv is 1 (the
          cache holds one latent + rope key per token). {arch}.leading_dense_block_count dense layers, then
          experts with expert_gating_func (absent/1 softmax, 2 sigmoid), expert_weights_norm (default off),
          expert_weights_scale (absent/0: 1), expert_group_count / expert_group_used_count, and an ungated shared
          expert expert_shared_count x expert_feed_forward_length wide. YaRN as llama.cpp computes it for this
          arch: with L = rope.scaling.yarn_log_multiplier / 0.1 (0 when absent) and factor F, the rotated dims are
          scaled by a = attn_factor (times 1 + 0.1 ln F when L is absent) and attn_scale is
          (a (1 + 0.1 L ln F))^2 / sqrt(head_dim)
  glm4, glm4moe  (GLM-4-0414 / GLM-Z1; GLM-4.5 / 4.6 / 4.5-Air) RoPE over the first rope.dimension_count dims of
          each head (half of them in the real files): normal layout (pairs 2i, 2i+1) for glm4, NeoX for glm4moe, as
          llama.cpp's rope types; {arch}.nextn_predict_layers trailing blocks (multi-token prediction) are in the
          file and in block_count but not run: n_layer = block_count - nextn_predict_layers (n_nextn holds the
          count); files with rope.dimension_sections (M-RoPE, the vision variants) are refused. glm4moe:
          leading_dense_block_count dense layers (feed_forward_length wide), then experts
          (expert_feed_forward_length wide) with expert_gating_func (absent/0: sigmoid, 1 softmax, 2 sigmoid), the
          selection bias exp_probs_b.bias, expert_weights_norm (default off), expert_weights_scale (absent/0: 1) and
          an ungated shared expert expert_shared_count x expert_feed_forward_length wide; groups are refused
  lfm2    (Liquid LFM2) a hybrid: {arch}.attention.head_count_kv is a per-layer array whose 0 entries mark the
          gated short-convolution layers (conv_layers; the others attend, with that many KV heads, which must be
          the same on every attention layer); {arch}.shortconv.l_cache (required, >= 2) is the conv kernel length
          (3 in the real files); NeoX RoPE, per-head Q/K norms; files with {arch}.attention.sliding_window > 0
          (sliding-window attention layers) are refused. lfm2moe (LFM2-8B-A1B) is lfm2 with
          {arch}.leading_dense_block_count (default 0) dense layers, then experts (expert_feed_forward_length wide)
          chosen by expert_gating_func (required: 1 softmax, 2 sigmoid) scores plus the selection bias
          exp_probs_b.bias, their weights always renormalized (sum clamped at 6.1e-5) and not scaled
  smallthinker (PowerInfer's SmallThinker-4B-A0.6B / 21B-A3B) NeoX RoPE over whole heads (rope.dimension_count
          must equal head_dim, as llama.cpp asserts); every layer has experts (expert_feed_forward_length wide,
          ReLU-gated), routed by expert_gating_func (required: 1 softmax, 2 sigmoid) with weights always
          renormalized; {arch}.expert_weights_scale is not read (llama.cpp ignores it for this arch: measured).
          With {arch}.attention.sliding_window > 0 the window is 4096 whatever the key says (llama.cpp
          hard-codes it), layers il % P != 0 attend within it (P = attention.sliding_window_pattern, default 4)
          with RoPE base rope.freq_base_swa (default: the global base), and layers il % 4 == 0 use no RoPE
          (llama.cpp's fixed no-RoPE step; except in 4-layer files, where llama.cpp's step equals n_layer,
          its "RoPE everywhere" value); without the key every layer attends globally with RoPE
  qwen35, qwen35moe  (Qwen3.5) a hybrid: layer il is a gated delta net unless (il + 1) % full_attention_interval
          == 0 (default 4, as llama.cpp), then gated full attention. ssm.conv_kernel (>= 2), ssm.state_size (the
          key and value head width), ssm.group_count (key heads), ssm.time_step_rank (value heads, a multiple of the
          key heads) and ssm.inner_size (= state_size x time_step_rank) are required. rope.dimension_sections (M-RoPE)
          must sum to at most rope.dimension_count / 2: with text positions (every section at the token's position)
          llama.cpp's interleaved M-RoPE is NeoX RoPE over the first dimension_count dims. qwen35moe: experts with
          softmax scores and renormalized weights plus a sigmoid-gated shared expert in every layer.
          attention.recurrent_layers (one flag per block, or one for all; newer converters) overrides the interval
          when present; nextn_predict_layers trailing multi-token-prediction blocks are in the file and in
          block_count but not run (as glm4moe's).
  qwen3next  (Qwen3-Next) qwen35moe's keys, layer kinds and MTP blocks, plain NeoX RoPE over rope.dimension_count
          dims (no sections); always experts with a gated shared expert
  minicpm, minicpm3  (MiniCPM 1/2/4, MiniCPM-MoE; MiniCPM3) granite's scalars with MiniCPM defaults, LongRoPE
          factors, minicpm3's latent attention: config_minicpm.py
  olmoe   (OLMoE) the llama block with NeoX RoPE, RMSNorms over the whole Q and K projections (as olmo2) and
          experts in every layer (feed_forward_length wide, softmax router, weights not renormalized)
"""
from __future__ import annotations

import math

from .errors import ModelFileError, UnsupportedError

GPTOSS_SWA_PERIOD = 2  # gpt-oss: layers il % 2 == 0 attend within the window (llama.cpp hard-codes it)
GRANITE_ARCHS = ("granite", "granitemoe", "granitehybrid")  # the llama block with four scalars from the metadata (granite_scales)
GLM_ARCHS = ("glm4", "glm4moe")
SMALLTHINKER_WINDOW = 4096  # smallthinker: llama.cpp's fixed window whenever a file has sliding_window > 0
SMALLTHINKER_SWA_PERIOD = 4  # default of {arch}.attention.sliding_window_pattern
SMALLTHINKER_NO_ROPE_STEP = 4  # smallthinker with a window: layers il % 4 == 0 use no RoPE (no key holds it)
OLMO3_SWA_PERIOD = 4  # olmo2 with a window (OLMo 3): layers with il % 4 == 3 attend to every position
EXAONE4_SWA_LAYERS = 64  # exaone4: only files of this depth (32B) get sliding windows in llama.cpp
EXAONE4_SLIDING_WINDOW = 4096  # their window when no key gives one
SMOLLM3_NO_ROPE_STEP = 4  # smollm3: layers with (il + 1) % 4 == 0 use no RoPE (llama.cpp's n_no_rope_layer_step)


class ArchKeys:
    """Per-architecture metadata readers, mixed into config._Reader (which provides f, meta, arch, key, get,
    positive, n_vocab)."""

    def expert_weights(self) -> tuple[bool, float]:
        """({arch}.expert_weights_norm, {arch}.expert_weights_scale): whether the chosen experts' weights are
        renormalized (default False) and their scale (default 0, which the callers read as 1, as llama.cpp)."""
        norm = self.meta.get(self.key("{arch}.expert_weights_norm"), False)
        if not isinstance(norm, bool):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_weights_norm')} should be a bool")
        scale = self.get("{arch}.expert_weights_scale", 0.0, kind=float)
        if not (math.isfinite(scale) and scale >= 0):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_weights_scale')} must be >= 0, got {scale}")
        return norm, scale

    def nextn_blocks(self, n_layer: int) -> int:
        """{arch}.nextn_predict_layers: trailing multi-token-prediction blocks (glm4moe, qwen35; llama.cpp's converter
        writes them by default). They are in the file and in block_count, but the main pass never runs them."""
        nextn = self.get("{arch}.nextn_predict_layers", 0)
        if not 0 <= nextn < n_layer:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.nextn_predict_layers')} {nextn} must be in "
                                 f"0..{n_layer - 1} (block_count {n_layer})")
        return nextn

    def glm4(self, n_layer: int) -> tuple[int, dict]:
        """glm4(moe): (the layers that run, ModelConfig fields): the trailing next-token-prediction blocks left out;
        glm4moe's per-layer FFN kinds and routing (module docstring), with "_norm" / "_n_shared" for config()."""
        nextn = self.nextn_blocks(n_layer)
        sections = self.meta.get(self.key("{arch}.rope.dimension_sections"))
        if isinstance(sections, list) and any(sections):
            raise UnsupportedError(f"{self.f.path}: {self.arch} files with rope.dimension_sections (multimodal "
                                   "M-RoPE) are not supported")
        n_layer -= nextn
        out: dict = {"n_nextn": nextn}
        if self.arch == "glm4":
            return n_layer, out
        lead = self.get("{arch}.leading_dense_block_count", 0)
        if not 0 <= lead <= n_layer:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.leading_dense_block_count')} {lead} is outside "
                                 f"0..{n_layer} (the layers that run)")
        gating = self.get("{arch}.expert_gating_func", 0)
        if gating not in (0, 1, 2):
            raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.expert_gating_func')} {gating} is not "
                                   "supported (1 softmax, 2 sigmoid)")
        if self.get("{arch}.expert_group_count", 0) > 1:
            raise UnsupportedError(f"{self.f.path}: glm4moe files with expert groups are not supported")
        norm, scale = self.expert_weights()
        out.update(moe_layers=tuple(il >= lead for il in range(n_layer)),
                   expert_gating="softmax" if gating == 1 else "sigmoid", expert_weights_scale=scale or 1.0,
                   _norm=norm, _n_shared=self.get("{arch}.expert_shared_count", 0))
        return n_layer, out

    def mistral3(self, n_ctx_train: int, yarn: bool) -> dict:
        """mistral3's attention temperature (attn_temp_scale, attn_temp_floor) and, for YaRN files with
        rope.scaling.yarn_log_multiplier L, the scale of the rotated dims (module docstring)."""
        out: dict = {}
        orig = self.positive("{arch}.rope.scaling.original_context_length", n_ctx_train)
        beta = self.get("{arch}.attention.temperature_scale", 0.0, kind=float)
        if not math.isfinite(beta) or beta < 0:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.attention.temperature_scale')} must be >= 0, "
                                 f"got {beta}")
        if beta:
            out.update(attn_temp_scale=beta, attn_temp_floor=orig)
        log_mul = self.get("{arch}.rope.scaling.yarn_log_multiplier", 0.0, kind=float)
        if yarn and log_mul:
            factor = self.get("{arch}.rope.scaling.factor", kind=float)

            def mscale(m: float) -> float:
                return 1.0 if factor <= 1 else 1.0 + 0.1 * m * math.log(factor)
            out["rope_mscale"] = mscale(1.0) / mscale(log_mul)
        return out

    def olmo3_swa(self, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
        """olmo2 files with attention.sliding_window > 0 (OLMo 3): (window, swa_layers, RoPE base of the window
        layers). The layers come from attention.sliding_window_pattern (one bool per layer, or a period) and
        otherwise from llama.cpp's default period of 4 (layer il has the window unless il % 4 == 3)."""
        window = self.get("{arch}.attention.sliding_window", 0)
        if window <= 0:
            return 0, (False,) * n_layer, rope_freq_base
        pattern = self.meta.get(self.key("{arch}.attention.sliding_window_pattern"))
        if isinstance(pattern, list):
            if len(pattern) != n_layer:
                raise ModelFileError(f"{self.f.path}: {self.key('{arch}.attention.sliding_window_pattern')} has "
                                     f"{len(pattern)} entries for {n_layer} layers")
            layers = tuple(bool(v) for v in pattern)
        else:
            period = pattern if isinstance(pattern, int) and pattern > 0 else OLMO3_SWA_PERIOD
            layers = tuple(il % period != period - 1 for il in range(n_layer))
        return window, layers, self.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)

    def exaone4_swa(self, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
        """exaone4: llama.cpp gives sliding windows to 64-layer files only (EXAONE 4.0 32B; default 4096 tokens,
        pattern as OLMo 3's); any other depth attends everywhere whatever the keys say (the 1.2B model)."""
        if n_layer != EXAONE4_SWA_LAYERS:
            return 0, (False,) * n_layer, rope_freq_base
        window, layers, base_swa = self.olmo3_swa(n_layer, rope_freq_base)
        if not window:  # no key: llama.cpp's default window with the default pattern
            window = EXAONE4_SLIDING_WINDOW
            layers = tuple(il % OLMO3_SWA_PERIOD != OLMO3_SWA_PERIOD - 1 for il in range(n_layer))
        return window, layers, base_swa

    def smollm3_olmo2(self, n_layer: int) -> dict:
        """smollm3's RoPE-less layers (ModelConfig.no_rope_layers); exaone4's with windows (the global layers have
        no RoPE); {} for other architectures."""
        if self.arch == "exaone4":
            window, layers, _ = self.exaone4_swa(n_layer, 0.0)
            return {"no_rope_layers": tuple(not swa for swa in layers)} if window else {}
        if self.arch != "smollm3":
            return {}
        return {"no_rope_layers": tuple((il + 1) % SMOLLM3_NO_ROPE_STEP == 0 for il in range(n_layer))}

    def smallthinker_swa(self, n_layer: int, rope_freq_base: float) -> tuple[int, tuple[bool, ...], float]:
        """smallthinker's (sliding_window, swa_layers, rope_freq_base_swa) (module docstring)."""
        if self.get("{arch}.attention.sliding_window", 0) <= 0:
            return 0, (False,) * n_layer, rope_freq_base
        period = self.get("{arch}.attention.sliding_window_pattern", SMALLTHINKER_SWA_PERIOD)
        if period < 0:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.attention.sliding_window_pattern')} must be "
                                 f">= 0, got {period}")
        layers = tuple(period == 0 or il % period != 0 for il in range(n_layer))
        return SMALLTHINKER_WINDOW, layers, self.get("{arch}.rope.freq_base_swa", rope_freq_base, kind=float)

    def smallthinker(self, n_layer: int, n_rot: int, head_dim: int) -> dict:
        """smallthinker's routing and RoPE-less layers as ModelConfig fields; {} for the other architectures."""
        if self.arch != "smallthinker":
            return {}
        if n_rot != head_dim:
            raise UnsupportedError(f"{self.f.path}: smallthinker rotates whole heads; rope.dimension_count {n_rot} "
                                   f"!= head_dim {head_dim} is not supported (llama.cpp refuses it too)")
        gating = self.get("{arch}.expert_gating_func", 0)
        if gating not in (1, 2):
            raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.expert_gating_func')} {gating} is not "
                                   "supported (1 softmax, 2 sigmoid)")
        # llama.cpp: RoPE unless il % step == 0, where the step is n_layer without a window (RoPE everywhere)
        # and 4 with one; a step equal to n_layer (a 4-layer file) also means RoPE everywhere
        nope = self.get("{arch}.attention.sliding_window", 0) > 0 and n_layer != SMALLTHINKER_NO_ROPE_STEP
        return {"expert_gating": "sigmoid" if gating == 2 else "softmax",
                "no_rope_layers": tuple(nope and il % SMALLTHINKER_NO_ROPE_STEP == 0 for il in range(n_layer))}

    def ernie(self, n_layer: int, n_rot: int, head_dim: int) -> dict:
        """ernie4_5(-moe): RoPE over whole heads only; the MoE model's per-layer FFN kinds (moe_layers): dense below
        {arch}.leading_dense_block_count, experts from there on, with an interleave step of 1 only."""
        if self.arch not in ("ernie4_5", "ernie4_5-moe"):
            return {}
        if n_rot != head_dim:
            raise UnsupportedError(f"{self.f.path}: {self.arch} rotates whole heads; rope.dimension_count {n_rot} "
                                   f"!= head_dim {head_dim} is not supported (llama.cpp refuses it too)")
        if self.arch == "ernie4_5":
            return {}
        step = self.positive("{arch}.interleave_moe_layer_step")
        if step != 1:
            raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.interleave_moe_layer_step')} {step} is not "
                                   "supported (only 1: every layer past the leading dense ones has experts)")
        lead = self.get("{arch}.leading_dense_block_count")
        if not 0 <= lead <= n_layer:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.leading_dense_block_count')} {lead} is outside "
                                 f"0..{n_layer} (block_count)")
        return {"moe_layers": tuple(il >= lead for il in range(n_layer))}

    def granite_scales(self) -> dict:
        """granite's scalars (module docstring) as ModelConfig fields, plus "rope" (False: no RoPE) and
        "attn_scale" (0: 1/sqrt(head_dim)); {} for the other architectures. Unset (0 or absent) means 1."""
        if self.arch not in GRANITE_ARCHS:
            return {}
        out = {}
        for field, suffix in (("embd_scale", "{arch}.embedding_scale"), ("residual_scale", "{arch}.residual_scale"),
                              ("attn_scale", "{arch}.attention.scale"), ("logit_scale", "{arch}.logit_scale")):
            optional = field != "logit_scale" or self.arch == "granitehybrid"
            value = self.get(suffix, 0.0 if optional else None, kind=float)
            if not (math.isfinite(value) and value >= 0) or (field == "logit_scale" and value == 0 and not optional):
                need = ">= 0 (0: unset)" if optional else "> 0"
                raise ModelFileError(f"{self.f.path}: metadata key {self.key(suffix)!r} must be a finite number "
                                     f"{need}, got {value}")
            out[field] = value if value or field == "attn_scale" else 1.0
        rope = self.meta.get(self.key("{arch}.rope.scaling.finetuned"), True)
        if not isinstance(rope, bool):
            raise ModelFileError(f"{self.f.path}: metadata key {self.key('{arch}.rope.scaling.finetuned')!r} should "
                                 f"be a bool, got {rope!r}")
        out["rope"] = rope
        return out

    def phi3_rope(self) -> dict:
        """phi3's long-context RoPE keys (see the module docstring); {} for the other architectures."""
        if self.arch != "phi3":
            return {}
        orig = self.positive("{arch}.rope.scaling.original_context_length", self.positive("{arch}.context_length"))
        factor = self.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float)
        if not (math.isfinite(factor) and factor > 0):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.rope.scaling.attn_factor')} must be a "
                                 f"finite number > 0, got {factor}")
        return {"rope_orig_ctx": orig, "rope_attn_factor": factor}

    def deepseek2(self, n_layer: int, n_head: int) -> dict:
        """deepseek2's MLA and routing fields (module docstring) plus "head_dim" (the q/k head width)."""
        kv_lora = self.positive("{arch}.attention.kv_lora_rank")
        q_lora = self.get("{arch}.attention.q_lora_rank", 0)
        split = any(self.key(k) in self.meta for k in ("{arch}.attention.key_length_mla",
                                                      "{arch}.attention.value_length_mla"))
        suffix = "_mla" if split else ""
        head_dim = self.positive("{arch}.attention.key_length" + suffix)
        v_dim = self.positive("{arch}.attention.value_length" + suffix, None if split else head_dim)
        lead = self.get("{arch}.leading_dense_block_count", 0)
        if not 0 <= lead <= n_layer or q_lora < 0:
            raise ModelFileError(f"{self.f.path}: leading_dense_block_count {lead} must be in 0..{n_layer} and "
                                 f"q_lora_rank {q_lora} >= 0")
        if self.get("{arch}.attention.temperature_scale", 0.0, kind=float):
            raise UnsupportedError(f"{self.f.path}: deepseek2 files with attention temperature tuning are not supported")
        gating = self.get("{arch}.expert_gating_func", 0)
        if gating == 0:  # older V2 files carry no key: softmax (llama.cpp's GLM-4.7-Flash guess aside)
            gating = 2 if n_layer in (47, 48) and self.n_vocab() == 154880 else 1
        if gating not in (1, 2):
            raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.expert_gating_func')} {gating} is not "
                                   "supported (1 softmax, 2 sigmoid)")
        norm = self.meta.get(self.key("{arch}.expert_weights_norm"), False)
        if not isinstance(norm, bool):
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.expert_weights_norm')} should be a bool")
        scale = self.get("{arch}.expert_weights_scale", 0.0, kind=float)
        groups, used = self.get("{arch}.expert_group_count", 0), self.get("{arch}.expert_group_used_count", 0)
        n_expert = self.positive("{arch}.expert_count")
        if groups > 1 and (n_expert % groups or not 0 < used <= groups):
            raise ModelFileError(f"{self.f.path}: {n_expert} experts in {groups} groups with {used} used is not "
                                 "a valid expert grouping")
        return {"head_dim": head_dim, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "v_head_dim": v_dim,
                "mla_kv_split": split, "moe_layers": tuple(il >= lead for il in range(n_layer)),
                "expert_gating": "sigmoid" if gating == 2 else "softmax",
                "expert_weights_scale": scale if scale else 1.0,
                "n_expert_groups": groups if groups > 1 else 0, "n_expert_group_used": used if groups > 1 else 0,
                "_norm": norm, "_n_shared": self.get("{arch}.expert_shared_count", 0)}

    def deepseek2_yarn(self, head_dim: int, rope_scale: float, yarn: bool) -> tuple[float, float]:
        """(rope_mscale, attn_scale) of a deepseek2 file: llama.cpp's YaRN for this arch (module docstring)."""
        if rope_scale != 1.0:
            raise UnsupportedError(f"{self.f.path}: linear RoPE scaling of a deepseek2 file is not supported")
        attn_factor = self.get("{arch}.rope.scaling.attn_factor", 1.0, kind=float)
        if not yarn:
            return attn_factor, attn_factor * attn_factor / math.sqrt(head_dim)
        ln_f = math.log(self.get("{arch}.rope.scaling.factor", kind=float))
        log_mul_key = "{arch}.rope.scaling.yarn_log_multiplier"
        log_mul = self.get(log_mul_key, 0.0, kind=float) / 0.1  # the converter stores 0.1 * mscale_all_dim
        a = attn_factor * (1.0 if self.key(log_mul_key) in self.meta else 1.0 + 0.1 * ln_f)
        m = a * (1.0 + 0.1 * log_mul * ln_f)
        return a, m * m / math.sqrt(head_dim)

    def lfm2(self, n_layer: int, n_head: int) -> dict:
        """lfm2's layer kinds (module docstring): conv_layers, conv_kernel and "_n_head_kv" (the attention
        layers' KV heads) for config(); {} for the other architectures."""
        if self.arch not in ("lfm2", "lfm2moe"):
            return {}
        key = self.key("{arch}.attention.head_count_kv")
        kv = self.meta.get(key)
        if not isinstance(kv, list) or len(kv) != n_layer or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in kv):
            raise ModelFileError(f"{self.f.path}: {key} must be an array of {n_layer} head counts (0 marks a "
                                 f"convolution layer), got {kv!r}")
        heads = sorted(set(v for v in kv if v))
        if len(heads) > 1:
            raise UnsupportedError(f"{self.f.path}: {key} differs between attention layers ({heads})")
        if heads and n_head % heads[0]:
            raise ModelFileError(f"{self.f.path}: head_count {n_head} is not a multiple of head_count_kv {heads[0]}")
        kernel = self.get("{arch}.shortconv.l_cache")
        if kernel < 2:
            raise ModelFileError(f"{self.f.path}: {self.key('{arch}.shortconv.l_cache')} must be at least 2 (a "
                                 f"causal convolution over the token and its predecessors), got {kernel}")
        if self.get("{arch}.attention.sliding_window", 0) > 0:
            raise UnsupportedError(f"{self.f.path}: lfm2 files with sliding-window attention are not supported")
        out = {"conv_layers": tuple(v == 0 for v in kv), "conv_kernel": kernel,
               "_n_head_kv": heads[0] if heads else n_head}
        if self.arch == "lfm2moe":
            lead = self.get("{arch}.leading_dense_block_count", 0)
            if not 0 <= lead <= n_layer:
                raise ModelFileError(f"{self.f.path}: {self.key('{arch}.leading_dense_block_count')} {lead} is "
                                     f"outside 0..{n_layer} (block_count)")
            gating = self.get("{arch}.expert_gating_func")
            if gating not in (1, 2):
                raise UnsupportedError(f"{self.f.path}: {self.key('{arch}.expert_gating_func')} {gating} is not "
                                       "supported (1 softmax, 2 sigmoid)")
            out.update(moe_layers=tuple(il >= lead for il in range(n_layer)),
                       expert_gating="sigmoid" if gating == 2 else "softmax")
        return out

    def qwen35(self, n_layer: int) -> dict:
        """qwen35's layer kinds and delta-net sizes (module docstring) for config(); {} for other architectures."""
        if self.arch not in ("qwen35", "qwen35moe", "qwen3next"):
            return {}
        path, key = self.f.path, self.key
        interval = self.get("{arch}.full_attention_interval", 4)
        if interval < 1:
            raise ModelFileError(f"{path}: {key('{arch}.full_attention_interval')} must be at least 1, got {interval}")
        kernel = self.get("{arch}.ssm.conv_kernel")
        if kernel < 2:
            raise ModelFileError(f"{path}: {key('{arch}.ssm.conv_kernel')} must be at least 2, got {kernel}")
        d_state, n_k, n_v = (self.positive(f"{{arch}}.ssm.{k}") for k in ("state_size", "group_count", "time_step_rank"))
        if n_v % n_k:
            raise ModelFileError(f"{path}: ssm.time_step_rank {n_v} (value heads) is not a multiple of ssm.group_count "
                                 f"{n_k} (key heads)")
        inner = self.positive("{arch}.ssm.inner_size")
        if inner != d_state * n_v:
            raise UnsupportedError(f"{path}: ssm.inner_size {inner} != ssm.state_size {d_state} x time_step_rank {n_v} "
                                   "(value heads as wide as key heads)")
        sections = self.meta.get(key("{arch}.rope.dimension_sections"), [])
        n_rot = self.get("{arch}.rope.dimension_count", 0)
        if not isinstance(sections, list) or sum(int(v) for v in sections) * 2 > n_rot:
            raise ModelFileError(f"{path}: {key('{arch}.rope.dimension_sections')} {sections!r} must be a list whose "
                                 f"sum is at most rope.dimension_count / 2 = {n_rot // 2}")
        kv = self.meta.get(key("{arch}.attention.head_count_kv"))
        if isinstance(kv, list):  # a per-layer array: the attention layers' count (0 or the same on the others)
            kv = max(kv) if kv else None
        delta = tuple((il + 1) % interval != 0 for il in range(n_layer))
        flags = self.meta.get(key("{arch}.attention.recurrent_layers"))  # newer converters; llama.cpp reads it first
        if flags is not None:
            n_all = n_layer + self.get("{arch}.nextn_predict_layers", 0)
            flags = flags if isinstance(flags, list) else [flags] * n_all  # one flag for all blocks
            if len(flags) != n_all or not all(isinstance(v, (bool, int)) for v in flags):
                raise ModelFileError(f"{path}: {key('{arch}.attention.recurrent_layers')} must hold one flag per "
                                     f"block ({n_all}), got {flags!r:.80}")
            delta = tuple(bool(v) for v in flags[:n_layer])
            if any(flags[n_layer:]):
                raise ModelFileError(f"{path}: {key('{arch}.attention.recurrent_layers')} marks a multi-token-"
                                     "prediction block as recurrent (they are full-attention blocks)")
        return {"delta_layers": delta, "conv_kernel": kernel,
                "ssm_d_state": d_state, "ssm_n_k_heads": n_k, "ssm_n_v_heads": n_v,
                "_n_head_kv": kv if isinstance(kv, int) and kv > 0 else self.positive("{arch}.attention.head_count")}
