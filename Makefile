# The commands the README names. They run in a virtual environment, .venv, made with the python3 on PATH
# on first use: system Pythons that refuse pip installs (PEP 668, "externally-managed-environment", as on
# Debian and Ubuntu) work as they are. PYTHON, given on the command line or in the environment, names the
# interpreter to install into and run instead (any Python >= 3.10), and no .venv is made:
#   make test PYTHON=python3
VENV := .venv
ifeq ($(origin PYTHON),undefined)
PYTHON := $(VENV)/bin/python
INTERPRETER := $(PYTHON)
endif
PIP := $(PYTHON) -m pip
POWERINFER := $(PYTHON) -m powerinfer_cli
DEMO_PROMPT ?= The three most famous paintings in the world are
DEMO_TOKENS ?= 64

.PHONY: install demo test bench clean cuda

# Editable install: builds the C kernels (cffi, -O3, -march=native), installs the `powerinfer` script, the
# test tools and the demo model's package. llama-cpp-python compiles from source when no wheel fits (~10 min).
install: $(INTERPRETER)
	rm -f powerinfer_py/_pi.cpython-*.so  # a development build (csrc/build_ffi.py) would shadow pip's
	$(PIP) install -e '.[test,demo]'

# Debian and Ubuntu ship venv separately (python3-venv); a failed attempt leaves a .venv without pip: removed.
$(VENV)/bin/python:
	@python3 -m venv $(VENV) || { rm -rf $(VENV); echo "error: python3 -m venv failed: install the venv \
	module (sudo apt-get install python3-venv) or name an interpreter to use as it is: \
	make $(or $(MAKECMDGOALS),install) PYTHON=python3" >&2; exit 1; }

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
