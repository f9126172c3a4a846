"""Hypura's exception types: what a user can fix is a HypuraError with a one-line message."""


class HypuraError(Exception):
    """An error the user can fix (bad file, bad flag, infeasible budget)."""


class ModelFileError(HypuraError, ValueError):
    """The model file is missing, not a GGUF, truncated or unsupported."""


class DeviceError(HypuraError, ValueError):
    """A device name (llama.cpp's --device) that names no device this machine can offload to."""
