"""The type-traits table: the C kernels' one table of per-type facts (csrc/quants.h pi_traits, read through
pi.h's pi_type_traits_table) against its Python twin (tensor.TYPE_TRAITS) row for row, and both against the gguf
package's GGML_QUANT_SIZES (the block sizes and bytes of the file format)."""
from __future__ import annotations

import pytest
from gguf import GGML_QUANT_SIZES

from powerinfer_py._pi import ffi, lib
from powerinfer_py.gguf.types import KERNEL_TYPES, TYPE_TRAITS, GGMLType, TypeKind, TypeTraits, row_bytes

FIELDS = TypeTraits._fields


def c_row(type_id: int) -> tuple:
    row = lib.pi_type_traits_table()[type_id]
    return tuple(getattr(row, f) for f in FIELDS)


def test_the_c_row_has_the_python_fields():
    assert [name for name, _ in ffi.typeof("pi_type_traits").fields] == list(FIELDS)


def test_every_c_row_is_its_python_twin():
    assert max(int(t) for t in TYPE_TRAITS) < lib.PI_TYPE_COUNT
    for type_id in range(lib.PI_TYPE_COUNT):
        t = GGMLType(type_id) if type_id in GGMLType._value2member_map_ else None
        if t in TYPE_TRAITS:
            want = tuple(int(v) for v in TYPE_TRAITS[t])
            assert c_row(type_id) == want, f"{t.name}: C {c_row(type_id)}, Python {want} ({', '.join(FIELDS)})"
        else:  # a type the kernels do not take: the zero row
            assert c_row(type_id) == (0,) * len(FIELDS), f"type id {type_id} ({t and t.name}): {c_row(type_id)}"


def test_kinds_and_type_ids_are_the_c_enums():
    for kind in TypeKind:
        assert getattr(lib, f"PI_KIND_{kind.name}") == kind.value
    assert lib.PI_KIND_NONE == 0
    for t in TYPE_TRAITS:  # enum pi_type numbers the types as GGUF does
        assert getattr(lib, f"PI_{t.name}") == int(t), t.name


@pytest.mark.parametrize("ggml_type", list(TYPE_TRAITS), ids=lambda t: t.name)
def test_block_and_bytes_are_the_gguf_format(ggml_type):
    tt = TYPE_TRAITS[ggml_type]
    assert (tt.block, tt.bytes) == GGML_QUANT_SIZES[ggml_type]
    # the kind follows from the block size (256: K-quant or I-quant), a block type has one scale per block
    assert tt.kind in {1: (TypeKind.FLOAT,), 32: (TypeKind.BLOCK,), 256: (TypeKind.K, TypeKind.IQ)}[tt.block]
    assert tt.group in {TypeKind.FLOAT: (0,), TypeKind.BLOCK: (32,)}.get(tt.kind, (16, 32))


@pytest.mark.parametrize("type_id", [int(t) for t in TYPE_TRAITS] + [-1, 5, 9, 15, 24, 38, 40, 1002])
def test_block_size_and_row_size_read_the_table(type_id):
    """pi_block_size / pi_row_size, now lookups in the table: the table's numbers for the kernels' types (as
    tensor.row_bytes computes them from gguf), 1 and 0 for any other id, in range or not (PI_FC2T + type)."""
    if type_id in {int(t) for t in TYPE_TRAITS}:
        t = GGMLType(type_id)
        n_cols = 2 * 256
        assert lib.pi_block_size(type_id) == TYPE_TRAITS[t].block
        assert lib.pi_row_size(type_id, n_cols) == row_bytes(t, n_cols)
    else:
        assert (lib.pi_block_size(type_id), lib.pi_row_size(type_id, 512)) == (1, 0)


def test_kernel_types_are_the_table():
    assert KERNEL_TYPES == tuple(TYPE_TRAITS)
    kinds = {k: {t.name for t, tt in TYPE_TRAITS.items() if tt.kind == k} for k in TypeKind}
    assert kinds[TypeKind.FLOAT] == {"F32", "F16", "BF16"}
    assert kinds[TypeKind.IQ] == {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"}
    assert {t.name for t, tt in TYPE_TRAITS.items() if tt.has_min} == {"Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K"}
