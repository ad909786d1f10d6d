"""Converting and re-encoding models: Hugging Face checkpoints (+ PowerInfer predictors) -> GGUF / PWRI.

  convert(hf_dir, out, predictor=None, outtype="f16")   HF folder -> GGUF, or PWRI with a predictor folder
  quantize(src, out, "q4_0")                            GGUF/PWRI -> the same file with re-encoded weights
  read_pt / read_state_dict / save_pt                   torch .pt/.bin without torch and without running pickles
  read_safetensors / write_safetensors                  safetensors without the safetensors package

Modules: source (lazy tensors), safetensors, torch_pt, checkpoint (a HF folder), predictor, vocab (tokenizer
metadata), plan + archs (name/shape mapping per architecture), output (streaming atomic writer), hf_to_gguf,
quantize.
"""
from .checkpoint import Checkpoint
from .hf_to_gguf import convert, plan_conversion
from .output import write_streamed
from .quantize import quantize
from .safetensors import read_safetensors, write_safetensors
from .torch_pt import read_pt, read_state_dict, save_pt

__all__ = ["Checkpoint", "convert", "plan_conversion", "quantize", "read_pt", "read_safetensors",
           "read_state_dict", "save_pt", "write_safetensors", "write_streamed"]
