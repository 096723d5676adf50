"""Stand-ins for what megamoe reads of torch, for the CPU tests: dtypes, tensors (what the
tensor checker reads of one), and a torch module with just what MoELayer's calls use."""

import types


class Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


BF16, F32, I32, I64, FP8 = (Dtype(n) for n in ("bfloat16", "float32", "int32", "int64", "float8_e4m3fn"))


class Tensor:
    """What the checker reads of a torch tensor: its dtype, shape, device (-1 off CUDA),
    contiguity and data address."""

    def __init__(self, dtype=BF16, shape=(3, 256), device=0, contiguous=True, ptr=0x7F00_0000_1000):
        self.dtype, self.shape = dtype, shape
        self._device, self._contiguous, self._ptr = device, contiguous, ptr

    def get_device(self):
        return self._device

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._ptr


def torch_module():
    """A torch module with the dtypes, ``empty`` (a new tensor at a fresh aligned address) and
    no stream capture."""
    addresses = iter(range(0x7F10_0000_0000, 0x7F20_0000_0000, 0x10000))

    def empty(shape, dtype, device):
        return Tensor(dtype, tuple(shape), int(device.split(":")[1]), ptr=next(addresses))

    return types.SimpleNamespace(
        bfloat16=BF16,
        float32=F32,
        int32=I32,
        int64=I64,
        float8_e4m3fn=FP8,
        empty=empty,
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: False),
    )
