# setuptools reads everything from pyproject.toml; cffi's build hook still has to be named here.
from setuptools import setup

setup(cffi_modules=["csrc/build_ffi.py:ffibuilder"])
