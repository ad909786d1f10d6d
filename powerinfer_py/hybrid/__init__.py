"""Hybrid execution: the hot FFN neurons of each layer on a device, the cold ones on the CPU (issue 6).

  backend.py      choose cpu / hybrid-cuda / hybrid-emulated once, when the model is built; find or solve
                  the placement (placement.py, gpuidx.py)
  split.py        HybridSplit: one predicted active set cut into the device and CPU halves, results summed
  emulated.py     EmulatedDevice: the device half on the CPU kernels, with the device's memory accounting
  cuda_device.py  CudaDevice: the device half on the CUDA kernels (csrc/cuda; compiled, not yet run on a GPU)
"""
from .backend import BACKENDS, BackendReport, attach_backend
from .emulated import EmulatedDevice
from .split import HybridSplit

__all__ = ["BACKENDS", "BackendReport", "EmulatedDevice", "HybridSplit", "attach_backend"]
