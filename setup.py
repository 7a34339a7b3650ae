# cffi has no pyproject-only way to declare cffi_modules yet; everything else
# lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["streamtrace/_build.py:ffibuilder"])
