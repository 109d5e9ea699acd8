"""A stand-in for PyAV, carried to the GPU host for the serving bench only (never installed by the project).

PyAV's FFmpeg libraries are 19 MB compressed: more than the device's 64 MiB tree limit leaves beside the
checkout's tests/data. The serving bench's calls carry audio only, and the web tier imports av (recordings'
video, the WebRTC tracks, aiortc) but calls it only for video frames, WebRTC calls or uploaded voice clips.
Every name here is a class that raises when it is used, so a run that reaches PyAV fails loudly.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Unavailable(type):
    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"PyAV is not carried to this machine: {cls.__name__}() was called")

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"PyAV is not carried to this machine: {cls.__name__}.{name} was used")


def _placeholder(name: str) -> type:
    base = (Exception,) if name.endswith("Error") else ()
    return _Unavailable(name, base, {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("av."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StubModule
__version__ = "0+stub"
