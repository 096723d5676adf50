"""The one tensor checker (``megamoe._megamoe.check_tensor``, crates/megamoe-py/src/tensor.rs),
which the layer, the GEMM, deep_gemm, the HybridEP buffer and dispatch/combine all use, on
objects that answer what it reads of a torch tensor: no torch and no GPU needed."""

import pytest

from megamoe._megamoe import check_tensor

from _fakes import BF16, F32, I32, I64, Tensor


def test_a_good_tensor_gives_its_address():
    assert check_tensor("x", Tensor(), BF16, (None, 256), 0) == 0x7F00_0000_1000
    assert check_tensor("idx", Tensor(I64, (3, 4)), (I32, I64), (3, 4), 0) == 0x7F00_0000_1000


@pytest.mark.parametrize(
    "tensor, dtypes, message",
    [
        (Tensor(F32), BF16, "x: dtype torch.float32, expected torch.bfloat16"),
        (Tensor(F32), (I32, I64), "x: dtype torch.float32, expected torch.int32 or torch.int64"),
        (Tensor(device=1), BF16, "x: on cuda:1, expected cuda:0"),
        (Tensor(device=-1), BF16, "x: not on a CUDA device, expected cuda:0"),
        (Tensor(shape=(3, 128)), BF16, r"x: shape \[3, 128\], expected \[\*, 256\]"),
        (Tensor(shape=(768,)), BF16, r"x: shape \[768\], expected \[\*, 256\]"),
        (Tensor(contiguous=False), BF16, r"x: is not contiguous \(call .contiguous\(\) first\)"),
        (Tensor(ptr=0x7F00_0000_1002), BF16, r"x: its data must start 16-byte aligned \(address 0x7f0000001002\)"),
        (Tensor(ptr=0x7F00_0000_1008), BF16, "x: its data must start 16-byte aligned"),
        ([1, 2], BF16, "x: expected a torch tensor, got list"),
    ],
)
def test_every_failure_is_a_value_error_starting_with_the_arguments_name(tensor, dtypes, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        check_tensor("x", tensor, dtypes, (None, 256), 0)


def test_a_tensor_torch_reads_itself_needs_no_layout():
    view = Tensor(contiguous=False, ptr=0x7F00_0000_1002)
    assert check_tensor("routing_map", view, BF16, (3, 256), 0, by_address=False) == view.data_ptr()
    with pytest.raises(ValueError, match=r"^routing_map: shape \[3, 256\], expected \[3, 128\]"):
        check_tensor("routing_map", view, BF16, (3, 128), 0, by_address=False)
