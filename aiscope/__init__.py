"""aiscope: what your GPU fleet is really doing."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aiscope")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
